// Multi-dimensional, multi-colour ring allreduce (PowerAI DDL), run from a plan
// (topology/allreduce_plan.h holds the vocabulary: dimension, stage, piece, lane).
//
// 1. Every lane (a contiguous share of the buffer) runs at once, each in its own tag phase.
// 2. A lane walks its stages in order: in each, this rank reduce-scatters, with the ranks of its
//    ring of that dimension, every piece it holds (one ring pipeline per piece, over messages);
//    a stage needs only what the previous one left here, so a rank moves on as soon as its own
//    rings are done. After the last stage this rank holds the full sum of its part.
// 3. The allgather runs the same rings backwards, last stage first, storing instead of reducing.
// 4. Waves of a lane keep their order on each rank: wave w starts a stage (of either half) only
//    once wave w-1 has finished it here, so the waves pipeline through the levels.
// A slow level carries only what survived the levels below it: with H hosts of L ranks, the
// network stage moves 2N(H-1)/H bytes per host link and direction, where a flat ring moves
// 2N(P-1)/P; colours keep the host and network levels busy at the same time.
#include <memory>

#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {
namespace {

class LaneRun {
 public:
  LaneRun(Op& op, const Lane& lane, const LaneRun* before, void* data, DataType type,
          ReduceOp reduce, const PipelineSettings& settings)
      : op_(op),
        lane_(lane),
        before_(before),
        data_(data),
        type_(type),
        reduce_(reduce),
        settings_(settings) {}

  bool done() const { return turn_ >= 2 * static_cast<int>(lane_.stages.size()); }

  // True once both halves of every stage are done here.
  bool advance() {
    const int stages = static_cast<int>(lane_.stages.size());
    while (turn_ < 2 * stages) {
      if (!started_) {
        if (before_ != nullptr && !before_->done() && before_->turn_ <= turn_) {
          return false;  // the wave ahead first
        }
        start(turn_ < stages ? turn_ : 2 * stages - 1 - turn_, turn_ < stages);
      }
      bool done = true;
      for (auto& p : pipelines_) done = p->advance() && done;
      if (!done) return false;
      pipelines_.clear();
      started_ = false;
      ++turn_;
    }
    return true;
  }

 private:
  void start(int stage, bool reducing) {
    started_ = true;
    const size_t es = elementSize(type_);
    for (const StageRing& ring : lane_.stages[stage].rings) {
      if (RingPlan{ring.order}.positionOf(op_.rank()) < 0) continue;
      const int n = static_cast<int>(ring.order.size());
      RingSchedule schedule;
      schedule.ring = RingPlan{ring.order};
      schedule.phase = lane_.phase;
      schedule.steps = n - 1;
      schedule.chunks = ring.chunks;
      if (reducing) {  // position p ends holding chunk p
        schedule.stepBase = ring.firstStep;
        schedule.reduceSteps = n - 1;
        schedule.shift = -1;
      } else {  // position p starts holding chunk p
        schedule.stepBase = ring.firstStep + static_cast<uint32_t>(n - 1);
        schedule.reduceSteps = 0;
        schedule.shift = 0;
      }
      pipelines_.push_back(std::make_unique<RingPipeline>(op_, std::move(schedule), data_, type_,
                                                          reduce_, settings_.segmentBytes / es,
                                                          settings_.depth));
    }
  }

  Op& op_;
  const Lane& lane_;
  const LaneRun* before_;
  void* data_;
  DataType type_;
  ReduceOp reduce_;
  PipelineSettings settings_;
  int turn_ = 0;  // stages reduce-scattered so far, then plus those gathered
  bool started_ = false;
  std::vector<std::unique_ptr<RingPipeline>> pipelines_;
};

}  // namespace

Task allreduceMultiDim(Op& op, void* data, DataType type, ReduceOp reduce,
                       std::shared_ptr<const AllreducePlan> plan, PipelineSettings settings) {
  std::vector<std::unique_ptr<LaneRun>> lanes;
  for (const Lane& lane : plan->lanes) {
    const LaneRun* before = lane.after >= 0 ? lanes[lane.after].get() : nullptr;
    lanes.push_back(std::make_unique<LaneRun>(op, lane, before, data, type, reduce, settings));
  }
  while (true) {
    bool done = true;
    // In lane order, so that a wave that frees the stage for the next one lets it start now.
    for (auto& lane : lanes) done = lane->advance() && done;
    if (done) break;
    co_await op.next();
  }
}

}  // namespace ddl
