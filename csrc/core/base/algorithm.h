// The allreduce algorithms, one name each everywhere: what TORCH_DDL_ALLREDUCE_ALGO asks for,
// what a plan runs (topology/allreduce_plan.h), what the simulator's --algo forces. What each
// runs is the table in algorithms/dispatch.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddl {

enum class AllreduceAlgorithm : uint8_t {
  kAuto,               // asked for: the planner chooses (never a plan's)
  kTrivial,            // one rank or nothing to reduce
  kRecursiveDoubling,  // latency: log2(P) exchanges of the whole buffer
  kLeaders,            // latency across hosts: to a leader per host, doubling among leaders, back
  kRing,               // a flat ring over every rank
  kMultiDim,           // the multi-dimensional ring: stages by machine level, colours, waves
  kShared,             // one host's shared memory: direct where every tensor is shared, else the
                       // shared-memory ring (never asked for by name)
  kSharedRing,         // the shared-memory ring alone, failing where it cannot run
  kDirect,             // the direct path alone, failing where some tensor is not shared
  kStaged,             // the staged allreduce alone, failing where the ranks cannot map its buffers
};

// "auto", "trivial", "recursive_doubling", "leaders", "ring", "multidim", "shared", "shm_ring",
// "direct", "staged".
const char* algorithmName(AllreduceAlgorithm algorithm);
std::optional<AllreduceAlgorithm> algorithmNamed(const std::string& name);

// The positions that position `position` of `n` meets in recursive doubling
// (algorithms/allreduce_recursive_doubling.cc): its fold partner where n is not a power of two
// and it is one of the first 2(n - P2), then its partner in each exchange round (none for the
// even ranks the fold leaves out). Creation tells the leaders theirs (topology/ringPartners).
std::vector<int> recursiveDoublingPartners(int position, int n);
}  // namespace ddl
