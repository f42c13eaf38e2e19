#include "ring_plan.h"

#include <algorithm>
#include <string>

#include "../base/types.h"

namespace ddl {

int RingPlan::positionOf(int rank) const {
  for (int p = 0; p < length(); ++p) {
    if (order[p] == rank) return p;
  }
  return -1;
}

RingPlan naturalRing(int size, bool reversed) {
  RingPlan ring;
  ring.order.resize(size);
  for (int i = 0; i < size; ++i) ring.order[i] = reversed ? size - 1 - i : i;
  return ring;
}

std::vector<RingPlan> alternatingRings(int size, int rings) {
  std::vector<RingPlan> plans;
  for (int r = 0; r < rings; ++r) plans.push_back(naturalRing(size, r % 2 == 1));
  for (const RingPlan& plan : plans) checkRing(plan, size, true);
  return plans;
}

void checkRing(const RingPlan& ring, int size, bool spanAll) {
  std::vector<bool> seen(size, false);
  for (int rank : ring.order) {
    if (rank < 0 || rank >= size) {
      throw Error("ddl: ring plan names rank " + std::to_string(rank) + " outside [0, " +
                  std::to_string(size) + ")");
    }
    if (seen[rank]) throw Error("ddl: ring plan visits rank " + std::to_string(rank) + " twice");
    seen[rank] = true;
  }
  if (spanAll && ring.length() != size) {
    throw Error("ddl: ring plan spans " + std::to_string(ring.length()) + " of " +
                std::to_string(size) + " ranks");
  }
}

std::vector<Range> splitEven(size_t count, size_t parts) {
  std::vector<Range> ranges(parts);
  for (size_t i = 0; i < parts; ++i) ranges[i] = evenPart(count, parts, i);
  return ranges;
}

Range evenPart(size_t count, size_t parts, size_t i) {
  const size_t base = count / parts, extra = count % parts;
  return Range{i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

}  // namespace ddl
