// Allgather level by level (block_plan.h): the outermost dimension first, so each block crosses
// the network once, then spreads through the host.
//
// 1. Copy the local block into its place in the output (skipped when already there).
// 2. For each stage in order, run this rank's rings of it together: ring position p starts
//    holding its block p, and the storing half of the ring pipeline (ring_pipeline.h) gives
//    every position every block of the ring. A stage starts when the previous one is done here.
#include <memory>

#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {

Task allgatherGrid(Op& op, const void* in, void* out, size_t bytes,
                   std::shared_ptr<const std::vector<BlockStage>> stages,
                   PipelineSettings settings) {
  char* base = static_cast<char*>(out);
  char* mine = base + static_cast<size_t>(op.rank()) * bytes;
  if (bytes > 0 && in != mine) op.memory().copy(mine, in, bytes);
  if (op.size() == 1 || bytes == 0) co_return;
  for (const BlockStage& stage : *stages) {
    std::vector<std::unique_ptr<RingPipeline>> pipelines;
    for (const BlockRing& ring : stage.rings) {
      if (RingPlan{ring.order}.positionOf(op.rank()) < 0) continue;
      RingSchedule schedule;
      schedule.ring = RingPlan{ring.order};
      schedule.stepBase = ring.firstStep;
      schedule.steps = static_cast<int>(ring.order.size()) - 1;
      for (int b : ring.blocks) schedule.chunks.push_back(Range{b * bytes, bytes});
      pipelines.push_back(std::make_unique<RingPipeline>(op, std::move(schedule), out,
                                                         DataType::kUInt8, ReduceOp::kSum,
                                                         settings.segmentBytes, settings.depth));
    }
    co_await runPipelines(op, std::move(pipelines));
  }
}

}  // namespace ddl
