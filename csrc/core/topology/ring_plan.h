// Ring plans as data. A ring is an order of group ranks; position p sends to p+1 and receives
// from p-1 (mod length). Plans are computed by pure functions and checked before use: every ring
// must be a permutation of the ranks it spans, so that it closes on itself.
#pragma once

#include <cstddef>
#include <vector>

namespace ddl {

struct RingPlan {
  std::vector<int> order;  // order[position] = group rank

  int length() const { return static_cast<int>(order.size()); }
  // Position of `rank` in the ring; -1 when it is not a member.
  int positionOf(int rank) const;
};

// 0, 1, ..., size-1 (or the reverse direction).
RingPlan naturalRing(int size, bool reversed);
// `rings` rings over `size` ranks, alternating direction so both directions of each link work.
std::vector<RingPlan> alternatingRings(int size, int rings);
// Throws ddl::Error unless `ring` is a permutation of a subset of [0, size) without repeats,
// and spans all of them when `spanAll`.
void checkRing(const RingPlan& ring, int size, bool spanAll);

struct Range {
  size_t offset;
  size_t length;
};
// Splits [0, count) into `parts` contiguous ranges whose lengths differ by at most one.
std::vector<Range> splitEven(size_t count, size_t parts);
// Range `i` of splitEven(count, parts), without the others.
Range evenPart(size_t count, size_t parts, size_t i);

}  // namespace ddl
