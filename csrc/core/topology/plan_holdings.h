// Who holds what while a plan runs: for every rank, the ranges of elements it holds a partial
// sum of and over how many ranks. The builders (plan_build.cc) follow it to make each stage's
// rings; the check (plan_check.cc) replays a plan over it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allreduce_plan.h"

namespace ddl {

// A range of elements one rank holds a partial sum of, over `weight` ranks.
struct Held {
  size_t begin;
  size_t end;
  int64_t weight;
};
using Holdings = std::vector<std::vector<Held>>;  // by rank

Holdings initialHoldings(int size, Range range);
// The weight with which `holdings` covers [begin, end) (uniformly), or -1.
int64_t weightOver(const std::vector<Held>& holdings, size_t begin, size_t end);
void removeRange(std::vector<Held>& holdings, size_t begin, size_t end);
void addRange(std::vector<Held>& holdings, Range r, int64_t weight);
// Applies one ring's reduce-scatter to the holdings; throws when a member does not hold the
// piece.
void applyRing(Holdings& holdings, const StageRing& ring);

}  // namespace ddl
