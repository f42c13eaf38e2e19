// Reduce-scatter level by level (block_plan.h): within the host first, then across hosts only
// the blocks this rank keeps, so the network carries N(H-1)/H per host link and direction.
//
// 1. The buffer holds P blocks; block r is the one rank r keeps.
// 2. For each stage in order, run this rank's rings of it together (kRingWindow at a time): the
// reducing half of the
//    ring pipeline (ring_pipeline.h) leaves position p with block p summed over the ring's
//    ranks. A stage starts when the previous one is done here.
// 3. After the last stage block rank() holds every rank's contribution.
#include <memory>

#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {

Task reduceScatterGrid(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       std::shared_ptr<const BlockPlan> stages, PipelineSettings settings) {
  if (op.size() == 1 || count == 0) co_return;
  const size_t es = elementSize(type);
  co_await runBlockPlan(op, stages, [&](const BlockRing& r) {
    const int n = static_cast<int>(r.order.size());
    RingSchedule schedule;
    schedule.ring = RingPlan{r.order};
    schedule.stepBase = r.firstStep;
    schedule.steps = n - 1;
    schedule.reduceSteps = n - 1;
    schedule.shift = -1;  // position p ends holding chunk p
    for (int b : r.blocks) schedule.chunks.push_back(Range{b * count, count});
    return std::make_unique<RingPipeline>(op, std::move(schedule), data, type, reduce,
                                          settings.segmentBytes / es, settings.depth);
  });
}

}  // namespace ddl
