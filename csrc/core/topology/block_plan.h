// Level-by-level plans for the collectives whose data is one block per rank (reduce-scatter and
// allgather), and the broadcast tree across hosts, as data.
//
// On a regular grid (topology.h) a reduce-scatter reduces within the host first, then across
// hosts only what the host's ranks keep, ...; an allgather runs the mirror image, outermost
// dimension first, so that a block crosses the network once and then spreads in shared memory.
// Stage j runs, for every dimension-j ring and for every combination q of the coordinates above
// j, a ring whose position p holds the block of the rank with coordinate j = p, the coordinates
// above j = q and those below j equal to the ring's. Over each host link and direction an
// allgather or reduce-scatter then carries N(H-1)/H bytes, where a flat ring in host order
// carries N(P-1)/P.
//
// Spelled out, stage j holds P times the combinations above j ring positions (P^2 / H for the
// first): too many at thousands of ranks. So the plan keeps the grid and each stage's dimension
// rings, O(P) in all, and each rank spells out its own rings when it runs them (ringsOf).
#pragma once

#include <cstdint>
#include <vector>

#include "topology.h"

namespace ddl {

struct BlockRing {
  std::vector<int> order;   // group ranks, by position
  std::vector<int> blocks;  // by position: the block that position holds (allgather: to start
                            // with; reduce-scatter: at the end)
  uint32_t firstStep = 0;   // tag steps [firstStep, firstStep + n - 1)
};

struct BlockStage {
  int dimension = 0;
  std::vector<std::vector<int>> rings;  // the dimension rings, group ranks by position
  std::vector<int> ringOf;              // by rank: its dimension ring (-1: none)
  std::vector<int> above;               // the dimensions above this one, with more than one place
  size_t combinations = 1;              // of the coordinates above
  uint32_t firstStep = 0;               // combination q of a ring of n: steps from
                                        // firstStep + q (n - 1)
};

struct BlockPlan {
  std::vector<int> dims;                 // the grid's
  std::vector<std::vector<int>> coords;  // by rank
  std::vector<int> rankAt;               // by coordinates, mixed radix (dimension 0 fastest)
  std::vector<BlockStage> stages;
  bool empty() const { return stages.empty(); }
  size_t placeOf(const std::vector<int>& coordinates) const;  // its index in rankAt
  // Combination q of the stage's ring `ring`.
  BlockRing ring(size_t stage, int ring, size_t q) const;
  // The rings `rank` runs in the stage, in order of combination.
  std::vector<BlockRing> ringsOf(size_t stage, int rank) const;
};

// Empty when there is nothing to gain or it cannot be planned: one host, an irregular grid (the
// flat ring serves those), or more steps than the tag holds.
BlockPlan planBlockStages(const Topology& topology, bool reduceScatter);

// Throws ddl::Error unless the plan has the shape that leaves every rank with every block
// (allgather), or rank r with block r summed over every rank (reduce-scatter): one rank at each
// place of the grid; a stage for each dimension of more than one place, outermost first for an
// allgather, innermost first for a reduce-scatter, over the combinations of the dimensions above
// it; rings that partition the ranks, each over all places of its dimension and no other; tag steps
// apart. By induction over the stages, ranks agreeing on the dimensions below a stage's then hold
// the same blocks (docs/across-hosts.md). O(P) in time and memory: every group's creation runs it.
void checkBlockStages(const BlockPlan& plan, int size, bool reduceScatter);

// Throws ddl::Error unless replaying the stages, spelled out as the ranks run them (every ring of
// every combination), leaves each rank with what checkBlockStages promises. O(P^2) time: for the
// tests, which hold the check's rule to the rings' own data.
void replayBlockStages(const BlockPlan& plan, int size, bool reduceScatter);

// This rank's place in the broadcast tree from `root`: binomial among one leader per host (the
// root on its host, elsewhere the host's lowest rank), then binomial within each host from its
// leader, so the data crosses into each host once. `hierarchical` false: one binomial tree over
// all ranks in rank order.
struct TreePlace {
  int parent = -1;
  std::vector<int> children;  // largest subtree first
};
TreePlace broadcastTreePlace(const Topology& topology, int root, int rank, bool hierarchical);

}  // namespace ddl
