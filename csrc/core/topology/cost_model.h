// The cost model: what a plan should take on a machine with given links (alpha-beta per link),
// and what the other collectives should (the estimates torch's time estimator asks for).
#pragma once

#include <cstddef>
#include <vector>

#include "allreduce_plan.h"

namespace ddl {

// Seconds the plan should take (alpha-beta per link). A ring step costs the latency of the
// link it crosses plus its message's bytes over that link's bandwidth and, reducing, over the
// reduce bandwidth; a message of several segments is reduced as they arrive. Rings that share a
// link or a rank's reductions take turns on them while each waits out its own latency: a stage
// of a multi-dimensional plan costs the larger of its rings' steps so priced and its busiest
// link's bytes (of every first-wave lane in that stage) plus one latency, a rank's segments
// passing its link and its reductions as a flow shop. One wave's pass is 2S such stages (the
// reduce-scatter's, then the allgather's in reverse), and W waves go through them as the engine
// orders them: a wave's stage after its previous stage and after the previous wave's same
// stage, each holding the links it loads for their bytes' time and the ranks for their
// reductions; never less than the busiest link's bytes, or a rank's reductions, over all
// stages and waves. A message across dimension k loads the links of dimensions 1..k of the
// blocks it leaves and enters (a rack crossing also crosses the host's link). A flat ring's
// ranks wait only for their predecessors: a segment's lap costs what the ring's edges cost it
// (not 2(P-1) times its outermost latency), the other segments following as fast as the
// busiest link lets them; recursive doubling pays each round's slowest exchange.
double predictSeconds(const AllreducePlan& plan, const Topology& topology, const LinkCosts& links);

// The collectives besides allreduce, priced as a flat ring, tree or exchange over the group's
// slowest level: what torch's _time_estimator gets for them (seconds). `bytes`: the op's tensors'.
enum class CollectiveShape { kBarrier, kTree, kPointToPoint, kReduceScatter, kExchange };
double estimateSeconds(CollectiveShape shape, const Topology& topology, const LinkCosts& links,
                       double bytes);

// Allgather schedules (algorithms/allgather_*.cc) and their prices, alpha-beta per link: the flat
// ring in rank order ((P - 1) steps of the slowest edge's latency and one block), the
// level-by-level rings of the grid (per dimension k, outermost first, (extent - 1) steps of its
// latency and of the blocks gathered outside it, a host's ranks sharing its link), and Bruck's
// ceil(log2 P) rounds (each round's slowest exchange; where a round takes a host's ranks off it,
// they share its link), and Bruck's rounds per dimension of the grid (the grid's bytes, ceil(log2
// extent) latencies per dimension). The figures that do not depend on the block's size are computed
// once (AllgatherCosts), so pricing a size costs O(log P).
const char* allgatherScheduleName(AllgatherSchedule schedule);
struct AllgatherCosts {
  struct Round {
    double latency = 0;         // seconds
    double secondsPerByte = 0;  // of the round's message, its busiest link shared
  };
  std::vector<Round> bruck;  // by round
  Round ringStep;            // one step of the flat ring
  std::vector<Round> grid;   // by dimension, outermost first; secondsPerByte per byte of a block
  std::vector<int> gridSteps;
  std::vector<int> gridBlocks;    // by dimension: the blocks a position holds as its stage starts
  double copySecondsPerByte = 0;  // packing (level 0's rate)
  int size = 1;
};
AllgatherCosts allgatherCosts(const Topology& topology, const LinkCosts& links);
// A reduce-scatter runs the schedule backwards (reduce_scatter_*.cc): level by level over Bruck's
// rounds it sums each round's blocks before the round's messages, and reduces the blocks it keeps
// under them.
double allgatherSeconds(AllgatherSchedule schedule, const AllgatherCosts& costs, double bytes,
                        bool reduceScatter = false);
// Bruck's all_to_all of `bytes` a block (algorithms/alltoall_bruck.cc): the allgather's rounds,
// each with the positions whose bit it is (about P / 2 blocks), packed before it leaves.
double alltoallBruckSeconds(const AllgatherCosts& costs, double bytes);

}  // namespace ddl
