// The shared-memory link of a ring pipeline (algorithms/link.h): segments travel through the
// slots of the next rank's inbox window (shared_ring.h), written and read in user space with no
// kernel copy and no staging. Messages carry only a notice (which slot holds which segment of
// which step) to the next rank, and a slot number given back to the previous one.
//
// Flow control. The link tracks which slots of the next inbox are free (all, when a pipeline
// starts). Fresh data (step 0) enters only while at least two are free; forwarding may take the
// last one. The ring as a whole then never fills, so some rank can always move: no deadlock. The
// link is idle once every slot it wrote has been given back, so the next op finds all slots free.
//
// Checks. Every notice carries the call's element count: a rank whose peer
// disagrees, or sends a notice that does not fit the schedule, gives up and tells the next rank,
// which gives up too, so nobody is left waiting around the ring.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "../runtime/op.h"
#include "../shm/shared_ring.h"
#include "algorithms.h"
#include "link.h"

namespace ddl {

struct SlotWindows;

class SlotLink : public Link {
 public:
  // Notices travel in tag step `noticeStep` of `phase`, freed slots in noticeStep + 1.
  SlotLink(Op& op, SlotWindows& windows, int prev, int next, uint64_t elements, uint32_t phase,
           uint32_t noticeStep);

  // Who this link waits for, for a timeout's message.
  std::string describeTimeout() const;

  size_t maxSegmentBytes() const override;
  void begin(const LinkGeometry& geometry) override;
  void poll() override;
  bool expect(int, size_t, char*, size_t, bool) override { return true; }
  bool arrival(Arrival* out) override;
  char* outbox(char* home, size_t bytes, bool fresh) override;
  void post(int step, size_t segment, char* at, size_t bytes) override;
  void release(const Arrival& arrival) override;
  bool idle() override;

 private:
  struct SlotNotice {
    uint64_t elements;
    uint64_t segment;
    uint32_t step;
    uint32_t slot;
  };
  [[noreturn]] void giveUp(const std::string& why, StatusKind kind);

  Op& op_;
  SlotWindows& windows_;
  int prev_;
  int next_;
  uint64_t elements_;
  uint64_t noticeSlot_;
  uint64_t freeSlot_;
  LinkGeometry geometry_;
  uint64_t transfers_ = 0;           // slots this rank writes, and reads
  std::vector<uint32_t> freeSlots_;  // of the next inbox
  std::vector<SlotNotice> noticeIn_;
  std::vector<uint32_t> freedIn_;
  std::deque<Request*> noticeRecvs_, freedRecvs_;
  uint64_t noticesPosted_ = 0, noticesTaken_ = 0, freedPosted_ = 0, freedTaken_ = 0;
  std::deque<SlotNotice> arrived_;
  std::deque<SlotNotice> noticesOut_;
  std::deque<uint32_t> freedOut_;
  std::vector<Request*> sends_;
  uint64_t written_ = 0, consumed_ = 0;
};

// Sets up `windows` for a ring of `order` as a pipeline of these settings uses them: inboxes of
// 2 x depth slots (at least 2) of a segment each (shm/shared_ring.h), the setup's messages in
// tag steps from `firstStep` of the shared phase.
Task setUpRingWindows(Op& op, SlotWindows& windows, std::vector<int> order,
                      const PipelineSettings& settings, uint32_t firstStep);

}  // namespace ddl
