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
// Links. Where segments travel is the link's business (link.h): messages (the default, over
// the transport), or shared-memory slots in the next rank's inbox (algorithms/slot_link.h). The
// pipeline handles each arrival of step s in one go: reduce (or store) it, and hand the result
// to the link as segment k of step s+1, written straight into the link's outbox when it has one
// of its own (a reduction then reads the buffer and the arrival and writes the next inbox).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "../base/fifo.h"
#include "../base/task.h"
#include "../base/types.h"
#include "../runtime/op.h"
#include "../topology/block_plan.h"
#include "../topology/ring_plan.h"
#include "link.h"

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
  // Over `link`, or over messages (MessageLink) when it is null.
  RingPipeline(Op& op, RingSchedule schedule, void* buffer, DataType type, ReduceOp reduce,
               size_t segmentElements, size_t depth, std::unique_ptr<Link> link = nullptr);

  // Posts what can be posted and handles what has arrived. True once every segment of every
  // step has been sent and received, and the link is idle. Nothing completed on the link since
  // the pipeline last could not move: it still cannot, and that is found without a call (a
  // multi-lane op wakes every lane's pipelines for each message of any of them).
  bool done() const { return done_; }
  bool advance() {
    if (done_) return true;
    if (stuckAt_ >= 0 && *activity_ == stuckAt_) return false;
    return move();
  }
  // The link counts its completions into *counter (which outlives the pipeline) from now on;
  // false where it does not count them.
  bool countInto(int64_t* counter) {
    if (!link_->countInto(counter)) return false;
    activity_ = counter;
    return true;
  }

 private:
  // What advance() reads on every wake first, together.
  bool done_ = false;
  // The link's activity count when the pipeline last could not move (-1: it must look again).
  int64_t stuckAt_ = -1;
  const int64_t* activity_ = nullptr;  // the link's, or null

  bool move();
  int chunkSentAt(int step) const;
  Range segmentOf(int chunk, size_t k) const;
  char* at(size_t element) const { return buffer_ + element * elementSize_; }
  bool handle(const Arrival& arrival);

  Op& op_;
  RingSchedule schedule_;
  std::unique_ptr<Link> link_;
  char* buffer_;
  DataType type_;
  ReduceOp reduce_;
  size_t elementSize_;
  size_t segment_ = 1;
  size_t segments_ = 0;
  int position_;
  std::vector<uint32_t> expected_;  // by step: receives asked of the link
  std::vector<uint32_t> taken_;     // by step: arrivals taken from the link
  int expectFrom_ = 0;              // the first step that has not asked for every segment
  int takenFrom_ = 0;               // the first step whose segments have not all arrived
  size_t injected_ = 0;             // segments of step 0 posted
  size_t handled_ = 0;              // arrivals handled, all steps
  Fifo<Arrival> waiting_;           // arrivals whose forward waits for room in the outbox
};

// Advances pipelines that run at once until every one is done; the coroutine sleeps until any of
// the op's messages completes.
Task runPipelines(Op& op, std::vector<std::unique_ptr<RingPipeline>> pipelines);

// The same for `count` pipelines made by `make(i)` in order, at most `window` at a time (a rank
// of a block plan's last stage runs one ring per combination of the coordinates above: P / H of
// them, whose messages all in flight at once would be P^2 / H over the ranks). Every member of
// a ring makes its rings in the same order, so the lowest one not done is running on all.
Task runPipelinesWindowed(Op& op, size_t count, size_t window,
                          std::function<std::unique_ptr<RingPipeline>(size_t)> make);
inline constexpr size_t kRingWindow = 32;

// A block plan's stages in order (block_plan.h), each running this rank's rings of it, kRingWindow
// at a time, a pipeline each as `make` builds it; a stage starts when the previous is done here.
Task runBlockPlan(Op& op, std::shared_ptr<const BlockPlan> plan,
                  std::function<std::unique_ptr<RingPipeline>(const BlockRing&)> make);

}  // namespace ddl
