// Ring allgather of blocks whose sizes differ by rank and are known only to their owners.
//
// 1. The block sizes go around the ring (one 8-byte block per rank; tag phase 0).
// 2. The output is sized to their sum and the blocks follow, back to back in rank order, as the
//    storing steps of the ring pipeline over chunks of unequal length (tag phase 1, so a fast
//    neighbour's blocks never match a receive of step 1).
#include <cstring>
#include <limits>
#include <string>

#include "algorithms.h"
#include "ring_pipeline.h"

namespace ddl {

Task allgatherVaryingRing(Op& op, const void* in, size_t bytes, std::shared_ptr<VaryingBlocks> out,
                          PipelineSettings settings) {
  const int n = op.size();
  std::vector<uint64_t> sizes(n, 0);
  sizes[op.rank()] = bytes;
  co_await allgatherRing(op, &sizes[op.rank()], sizes.data(), sizeof(uint64_t), settings);
  // Every rank sums the same sizes, and so refuses the same: a sum that wraps would size the
  // output too small for the blocks then written into it.
  out->offsets.assign(n + 1, 0);
  for (int r = 0; r < n; ++r) {
    if (sizes[r] > std::numeric_limits<size_t>::max() - out->offsets[r]) {
      throw Error("rank " + std::to_string(r) + "'s block of " + std::to_string(sizes[r]) +
                  " bytes takes the blocks' total past 2^64");
    }
    out->offsets[r + 1] = out->offsets[r] + sizes[r];
  }
  try {
    out->data.resize(out->offsets[n]);
  } catch (const std::exception&) {
    throw Error("the blocks' total of " + std::to_string(out->offsets[n]) +
                " bytes cannot be held here");
  }
  if (bytes > 0) std::memcpy(out->data.data() + out->offsets[op.rank()], in, bytes);
  if (n == 1 || out->data.empty()) co_return;
  std::vector<Range> chunks;
  for (int r = 0; r < n; ++r) chunks.push_back(Range{out->offsets[r], sizes[r]});
  co_await allgatherChunks(op, out->data.data(), std::move(chunks), 1, settings.segmentBytes,
                           settings.depth);
}

}  // namespace ddl
