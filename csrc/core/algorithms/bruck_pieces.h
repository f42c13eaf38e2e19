// Bruck's rounds (allgather_bruck.cc, reduce_scatter_bruck.cc): a run of blocks as the pieces of
// the buffer it covers, and a stage of the grid as its rounds see it.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "../topology/block_plan.h"

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

// Stage `stage` of the grid for `rank`: its dimension ring, its position there, and by position
// the blocks of every combination, in order of combination (BlockRing::blocks: the allgather's
// held at the stage's start, the reduce-scatter's kept at its end). Empty order: the rank runs
// no ring in the stage.
struct BruckStage {
  std::vector<int> order;
  int me = 0;
  std::vector<std::vector<int>> blocks;
};

inline BruckStage bruckStage(const BlockPlan& plan, size_t stage, int rank) {
  const BlockStage& s = plan.stages[stage];
  const int index = s.ringOf[rank];
  if (index < 0) return {};
  BruckStage out;
  out.order = s.rings[index];
  const int n = static_cast<int>(out.order.size());
  out.me =
      static_cast<int>(std::find(out.order.begin(), out.order.end(), rank) - out.order.begin());
  out.blocks.resize(n);
  for (size_t q = 0; q < s.combinations; ++q) {
    const BlockRing ring = plan.ring(stage, index, q);
    for (int p = 0; p < n; ++p) out.blocks[p].push_back(ring.blocks[p]);
  }
  return out;
}

}  // namespace ddl
