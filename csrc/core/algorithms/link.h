// Links: how a ring pipeline (ring_pipeline.h) moves a segment from its position to the next one,
// and takes what the previous position sent. The pipeline decides what moves (step, segment, the
// bytes); the link decides where they travel through and when there is room:
//
//   MessageLink (message_link.h)  transport messages: sends straight from the buffer, receives
//                                 into scratch (reducing steps) or in place (storing steps).
//   SlotLink (algorithms/slot_link.h)    a shared-memory window of slots in the next rank's inbox:
//   the
//                                 sender writes the bytes there in user space, and messages only
//                                 say which slot holds what and which slot is free again.
//
// A level of a multi-dimensional ring is the same pipeline over that level's link.
//
// The pipeline's calls, all on the progress thread:
//   begin(geometry)       once, before anything else: steps and segments of the schedule
//   poll()                collects what the transport delivered (and posts what it may)
//   expect(...)           the pipeline wants segment k of step s; false while the link has no room
//   reducingRoom()        false while no reducing step's expect() could succeed
//   arrival(&a)           the oldest arrival not taken yet
//   outbox(home, ...)     where to put a segment to post (nullptr while the next position's room
//                         is full); `home` is where its bytes are in the buffer: a link that sends
//                         from the buffer returns it, and the pipeline then copies nothing
//   post(s, k, at, bytes) hands a filled outbox to the next position
//   release(a)            the pipeline is done with an arrival's bytes
//   idle()                every post has left and every room it took has come back
//   activity()            its count of requests completed so far (null: not counted); a
//                         pipeline that could not move waits for it to change
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddl {

struct LinkGeometry {
  int steps = 0;
  int reduceSteps = 0;      // steps [0, reduceSteps) reduce what arrives
  size_t segments = 0;      // per step
  size_t segmentBytes = 0;  // the largest segment
  // The pipeline asks for steps [s, s + window) only, s the first step not wholly arrived
  // (0: any step at any time).
  int window = 0;
};

struct Arrival {
  int step = 0;
  size_t segment = 0;
  const char* data = nullptr;
  uint64_t handle = 0;  // the link's own
};

class Link {
 public:
  virtual ~Link() = default;
  // The largest segment the link carries, in bytes (0: any size).
  virtual size_t maxSegmentBytes() const { return 0; }
  virtual void begin(const LinkGeometry& geometry) = 0;
  virtual void poll() = 0;
  // `home` is where segment k of step s belongs in the buffer; `reducing` when it is reduced
  // into it rather than stored there.
  virtual bool expect(int step, size_t segment, char* home, size_t bytes, bool reducing) = 0;
  // False while every reducing step's expect() fails, whatever its step (no scratch is free):
  // the pipeline then asks no more of them until something changes.
  virtual bool reducingRoom() const { return true; }
  virtual bool arrival(Arrival* out) = 0;
  // `fresh`: the segment enters the ring here (step 0); a link with bounded room keeps some for
  // segments already in the ring, so that the ring as a whole never fills.
  // Memory other than `home` is host memory (only host buffers travel through shared slots).
  virtual char* outbox(char* home, size_t bytes, bool fresh) = 0;
  virtual void post(int step, size_t segment, char* at, size_t bytes) = 0;
  virtual void release(const Arrival& arrival) = 0;
  virtual bool idle() = 0;
  // The count of the link's requests completed so far, where nothing else lets the pipeline
  // move on, valid while the link lives (null: the link does not count them, and the pipeline
  // looks every time it is woken). A pointer: the pipeline reads it without a call.
  virtual const int64_t* activity() const { return nullptr; }
  // Counts from now on into *counter (set to the count so far), which outlives the link; false
  // where the link does not count. Lets an op keep the counts of its links side by side.
  virtual bool countInto(int64_t* /*counter*/) { return false; }
};

}  // namespace ddl
