// The pipelined ring shared by ring allreduce, reduce-scatter and allgather.
//
// Vocabulary. A ring of n positions carries a buffer cut into n chunks (chunk c is the part that
// position c ends up owning). A step moves one chunk per position to the next position; the
// first `reduceSteps` steps reduce what arrives into the local chunk (reduce-scatter), the rest
// store it in place (allgather). Each chunk is cut into segments of at most `segment` elements;
// segments are what travel, and they pipeline: segment k of step s+1 leaves as soon as segment k
// of step s has arrived (and been reduced), while later segments of step s are still in flight.
//
// Steps (position p, step s, chunk index mod n):
//   1. send chunk (p - s + shift), segment by segment, to position p+1;
//   2. receive chunk (p - s - 1 + shift) from position p-1: into scratch and reduce it into the
//      buffer when s < reduceSteps, straight into the buffer otherwise.
// Allreduce: 2(n-1) steps, n-1 reducing, shift 0 (p ends owning chunk p+1, then spreads it).
// Reduce-scatter: n-1 steps, all reducing, shift -1 (p ends owning chunk p).
// Allgather: n-1 steps, none reducing, shift 0 (p starts owning chunk p).
//
// Ordering. All segments of one step share a tag slot; both sides post them in segment order,
// and the transport matches messages of one slot and one sender in send order.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "../engine/op.h"
#include "../engine/task.h"
#include "../topology/ring_plan.h"
#include "../types.h"

namespace ddl {

struct RingSchedule {
  RingPlan ring;
  uint32_t phase = 0;     // tag phase: one per ring running at the same time
  uint32_t stepBase = 0;  // step s travels in tag step stepBase + s (rings sharing a phase)
  int steps = 0;
  int reduceSteps = 0;
  int shift = 0;
  std::vector<Range> chunks;  // in elements, by chunk index
};

// The storing half alone over the natural ring: position p starts owning chunk p of `buffer`
// (bytes) and ends with every chunk. Chunks may differ in length. allgather_ring.cc.
Task allgatherChunks(Op& op, void* buffer, std::vector<Range> chunks, uint32_t phase,
                     size_t segmentBytes, size_t depth);

class RingPipeline {
 public:
  RingPipeline(Op& op, RingSchedule schedule, void* buffer, DataType type, ReduceOp reduce,
               size_t segmentElements, size_t depth);

  // Posts what can be posted and reduces what has arrived. True once every segment of every
  // step has been sent and received.
  bool advance();

 private:
  struct Posted {
    Request* request;
    int slot;  // scratch slot, -1 when receiving in place
    Range segment;
  };
  struct Step {
    size_t sent = 0;
    size_t posted = 0;
    size_t completed = 0;
    std::deque<Posted> inFlight;
  };

  int chunkSentAt(int step) const;
  Range segmentOf(int chunk, size_t k) const;
  char* at(size_t element) const { return buffer_ + element * elementSize_; }

  Op& op_;
  RingSchedule schedule_;
  char* buffer_;
  DataType type_;
  ReduceOp reduce_;
  size_t elementSize_;
  size_t segment_ = 1;
  size_t segments_ = 0;
  size_t depth_;
  int position_;
  int next_;
  int prev_;
  std::vector<Step> steps_;
  std::shared_ptr<char> scratch_;
  std::vector<int> freeSlots_;
  std::vector<Request*> sends_;
  bool done_ = false;
};

}  // namespace ddl
