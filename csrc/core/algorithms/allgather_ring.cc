// Ring allgather: the allgather half of the ring pipeline (ring_pipeline.h) over P blocks.
//
// 1. Copy the local block into its place in the output (skipped when already there).
// 2. Run P-1 storing steps: at step s rank r forwards block (r - s) to r+1 and receives block
//    (r - s - 1) from r-1 straight into the output, segment by segment.
#include <cstring>

#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {

Task allgatherRing(Op& op, const void* in, void* out, size_t bytes, PipelineSettings settings) {
  const int n = op.size();
  char* base = static_cast<char*>(out);
  char* mine = base + static_cast<size_t>(op.rank()) * bytes;
  if (bytes > 0 && in != mine) std::memcpy(mine, in, bytes);
  if (n == 1 || bytes == 0) co_return;
  RingSchedule schedule;
  schedule.ring = naturalRing(n, false);
  schedule.steps = n - 1;
  schedule.reduceSteps = 0;
  schedule.shift = 0;
  for (int c = 0; c < n; ++c) schedule.chunks.push_back(Range{c * bytes, bytes});
  RingPipeline pipeline(op, std::move(schedule), out, DataType::kUInt8, ReduceOp::kSum,
                        settings.segmentBytes, settings.depth);
  while (!pipeline.advance()) co_await op.next();
}

}  // namespace ddl
