// Bruck's rounds (allgather_bruck.cc, reduce_scatter_bruck.cc): a run of blocks as the pieces of
// the buffer it covers.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

namespace ddl {

// The run of `count` blocks from block `first` (mod n), as at most two contiguous pieces of the
// buffer: {first block, blocks} each.
inline std::vector<std::pair<int, int>> bruckPieces(int first, int count, int n) {
  std::vector<std::pair<int, int>> out;
  const int before = std::min(count, n - first);
  out.emplace_back(first, before);
  if (count > before) out.emplace_back(0, count - before);
  return out;
}

}  // namespace ddl
