// Allgather level by level (block_plan.h): the outermost dimension first, so each block crosses
// the network once, then spreads through the host.
//
// 1. Copy the local block into its place in the output (skipped when already there).
// 2. For each stage in order, run this rank's rings of it together (kRingWindow at a time): ring
// position p starts
//    holding its block p, and the storing half of the ring pipeline (ring_pipeline.h) gives
//    every position every block of the ring. A stage starts when the previous one is done here.
#include <memory>

#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {

Task allgatherGrid(Op& op, const void* in, void* out, size_t bytes,
                   std::shared_ptr<const BlockPlan> stages, PipelineSettings settings) {
  char* base = static_cast<char*>(out);
  char* mine = base + static_cast<size_t>(op.rank()) * bytes;
  if (bytes > 0 && in != mine) co_await copyInTurns(op, mine, in, bytes);
  if (op.size() == 1 || bytes == 0) co_return;
  co_await runBlockPlan(op, stages, [&](const BlockRing& r) {
    RingSchedule schedule;
    schedule.ring = RingPlan{r.order};
    schedule.stepBase = r.firstStep;
    schedule.steps = static_cast<int>(r.order.size()) - 1;
    for (int b : r.blocks) schedule.chunks.push_back(Range{b * bytes, bytes});
    return std::make_unique<RingPipeline>(op, std::move(schedule), out, DataType::kUInt8,
                                          ReduceOp::kSum, settings.segmentBytes, settings.depth);
  });
}

}  // namespace ddl
