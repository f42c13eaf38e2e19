// Ring reduce-scatter: the reducing half of the ring pipeline (ring_pipeline.h).
//
// 1. The buffer holds P blocks; block c is the one rank c keeps.
// 2. P-1 reducing steps with shift -1: at step s rank r sends block (r - s - 1) to r+1 and
//    reduces block (r - s - 2) arriving from r-1 into its own copy, segment by segment.
// 3. After the last step block r holds every rank's contribution. Each rank sends N(P-1)/P.
#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {

Task reduceScatterRing(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       PipelineSettings settings) {
  const int n = op.size();
  if (n == 1 || count == 0) co_return;
  RingSchedule schedule;
  schedule.ring = naturalRing(n, false);
  schedule.steps = n - 1;
  schedule.reduceSteps = n - 1;
  schedule.shift = -1;
  for (int c = 0; c < n; ++c) schedule.chunks.push_back(Range{c * count, count});
  RingPipeline pipeline(op, std::move(schedule), data, type, reduce,
                        settings.segmentBytes / elementSize(type), settings.depth);
  while (!pipeline.advance()) co_await op.next();
}

}  // namespace ddl
