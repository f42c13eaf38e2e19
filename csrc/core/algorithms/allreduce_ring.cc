// Ring allreduce, chunked and pipelined (see ring_pipeline.h for chunk, segment and step).
//
// 1. Split the buffer into one contiguous share per ring (TORCH_DDL_RINGS); odd rings run the
//    other direction, so both directions of every link carry data.
// 2. Each share is cut into P chunks and runs 2(P-1) ring steps: P-1 reducing (reduce-scatter),
//    then P-1 storing (allgather). Each rank sends 2N(P-1)/P bytes in all.
// 3. All rings advance together in one loop; the coroutine sleeps until any message completes.
// Multi-dimensional rings (one ring level per machine level) will compose the same pipeline with
// sub-rings, reduce-scatter level by level and allgather in reverse.
#include <memory>

#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {

Task allreduceRing(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                   PipelineSettings settings) {
  const int n = op.size();
  if (n == 1 || count == 0) co_return;
  const size_t es = elementSize(type);
  std::vector<RingPlan> rings = alternatingRings(n, settings.rings);
  std::vector<Range> shares = splitEven(count, rings.size());
  std::vector<std::unique_ptr<RingPipeline>> pipelines;
  for (size_t r = 0; r < rings.size(); ++r) {
    RingSchedule schedule;
    schedule.ring = rings[r];
    schedule.phase = static_cast<uint32_t>(r);
    schedule.steps = 2 * (n - 1);
    schedule.reduceSteps = n - 1;
    schedule.shift = 0;
    schedule.chunks = splitEven(shares[r].length, n);
    for (Range& c : schedule.chunks) c.offset += shares[r].offset;
    pipelines.push_back(std::make_unique<RingPipeline>(op, std::move(schedule), data, type, reduce,
                                                       settings.segmentBytes / es, settings.depth));
  }
  co_await runPipelines(op, std::move(pipelines));
}

}  // namespace ddl
