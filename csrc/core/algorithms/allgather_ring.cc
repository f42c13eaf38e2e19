// Ring allgather: the allgather half of the ring pipeline (ring_pipeline.h) over P blocks.
//
// 1. Copy the local block into its place in the output (skipped when already there).
// 2. Run P-1 storing steps: at step s rank r forwards block (r - s) to r+1 and receives block
//    (r - s - 1) from r-1 straight into the output, segment by segment.
#include <cstring>

#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {

Task allgatherChunks(Op& op, void* buffer, std::vector<Range> chunks, uint32_t phase,
                     size_t segmentBytes, size_t depth) {
  const int n = op.size();
  RingSchedule schedule;
  schedule.ring = naturalRing(n, false);
  schedule.phase = phase;
  schedule.steps = n - 1;
  schedule.reduceSteps = 0;
  schedule.shift = 0;
  schedule.chunks = std::move(chunks);
  RingPipeline pipeline(op, std::move(schedule), buffer, DataType::kUInt8, ReduceOp::kSum,
                        segmentBytes, depth);
  while (!pipeline.advance()) co_await op.next();
}

Task allgatherRing(Op& op, const void* in, void* out, size_t bytes, PipelineSettings settings) {
  const int n = op.size();
  char* base = static_cast<char*>(out);
  char* mine = base + static_cast<size_t>(op.rank()) * bytes;
  if (bytes > 0 && in != mine) co_await copyInTurns(op, mine, in, bytes);
  if (n == 1 || bytes == 0) co_return;
  std::vector<Range> chunks;
  for (int c = 0; c < n; ++c) chunks.push_back(Range{c * bytes, bytes});
  co_await allgatherChunks(op, out, std::move(chunks), 0, settings.segmentBytes, settings.depth);
}

}  // namespace ddl
