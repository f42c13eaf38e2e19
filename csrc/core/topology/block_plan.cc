#include "block_plan.h"

#include <algorithm>
#include <string>

#include "../base/tag.h"
#include "../base/types.h"

namespace ddl {
namespace {

// Binomial tree over n places (place 0 the root; rankAt(v) the rank at place v): the parent and
// children of place v.
template <typename RankAt>
void binomial(int n, int v, RankAt rankAt, TreePlace& place) {
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      place.parent = rankAt(v - mask);
      break;
    }
    mask <<= 1;
  }
  for (int m = mask >> 1; m > 0; m >>= 1) {
    if (v + m < n) place.children.push_back(rankAt(v + m));
  }
}

}  // namespace

BlockPlan planBlockStages(const Topology& t, bool reduceScatter) {
  BlockPlan plan;
  if (t.hosts() < 2) return plan;
  const Grid grid = gridOf(t);
  if (!grid.regular) return plan;
  plan.dims = grid.dims;
  plan.coords = grid.coords;
  size_t places = 1;
  for (int d : grid.dims) places *= static_cast<size_t>(d);
  if (places != static_cast<size_t>(t.size)) return {};
  plan.rankAt.assign(places, -1);
  for (int r = 0; r < t.size; ++r) {
    const size_t at = plan.placeOf(grid.coords[r]);
    if (plan.rankAt[at] != -1) return {};
    plan.rankAt[at] = r;
  }
  std::vector<int> dims;
  for (int k = 0; k < static_cast<int>(grid.dims.size()); ++k) {
    if (grid.dims[k] > 1) dims.push_back(k);
  }
  if (!reduceScatter) std::reverse(dims.begin(), dims.end());
  uint32_t nextStep = 0;
  for (int j : dims) {
    BlockStage stage;
    stage.dimension = j;
    for (int k : dims) {
      if (k > j) stage.above.push_back(k);
    }
    for (int k : stage.above) stage.combinations *= static_cast<size_t>(grid.dims[k]);
    stage.rings = dimensionRings(t, grid, j);
    stage.ringOf.assign(t.size, -1);
    // The dimension rings of a stage have no rank in common: each numbers its rings' steps from
    // the stage's base (the rings of one, over the same ranks, need ranges apart), so the steps
    // grow with a ring's share of the job, not with the number of hosts.
    stage.firstStep = nextStep;
    uint64_t end = nextStep;
    for (size_t i = 0; i < stage.rings.size(); ++i) {
      for (int r : stage.rings[i]) stage.ringOf[r] = static_cast<int>(i);
      end = std::max<uint64_t>(end, nextStep + stage.combinations * (stage.rings[i].size() - 1));
    }
    if (end > tag::kMaxSteps) return {};
    nextStep = static_cast<uint32_t>(end);
    if (!stage.rings.empty()) plan.stages.push_back(std::move(stage));
  }
  checkBlockStages(plan, t.size, reduceScatter);
  return plan;
}

size_t BlockPlan::placeOf(const std::vector<int>& c) const {
  size_t at = 0, stride = 1;
  for (size_t k = 0; k < dims.size(); ++k) {
    at += static_cast<size_t>(c[k]) * stride;
    stride *= static_cast<size_t>(dims[k]);
  }
  return at;
}

BlockRing BlockPlan::ring(size_t stage, int index, size_t q) const {
  const BlockStage& s = stages.at(stage);
  const std::vector<int>& order = s.rings.at(index);
  BlockRing ring;
  ring.order = order;
  ring.firstStep = s.firstStep + static_cast<uint32_t>(q * (order.size() - 1));
  std::vector<int> c = coords.at(order[0]);
  for (int k : s.above) {
    c[k] = static_cast<int>(q % static_cast<size_t>(dims[k]));
    q /= static_cast<size_t>(dims[k]);
  }
  for (int r : order) {
    c[s.dimension] = coords.at(r)[s.dimension];
    ring.blocks.push_back(rankAt.at(placeOf(c)));
  }
  return ring;
}

std::vector<BlockRing> BlockPlan::ringsOf(size_t stage, int rank) const {
  const BlockStage& s = stages.at(stage);
  std::vector<BlockRing> rings;
  if (rank < 0 || rank >= static_cast<int>(s.ringOf.size()) || s.ringOf[rank] < 0) return rings;
  for (size_t q = 0; q < s.combinations; ++q) rings.push_back(ring(stage, s.ringOf[rank], q));
  return rings;
}

namespace {

[[noreturn]] void refuse(const std::string& what) { throw Error("ddl: block plan " + what); }

// Each stage's rings partition the ranks; a ring's members differ in the stage's dimension
// alone and hold each of its coordinates once.
void checkRings(const BlockPlan& plan, const BlockStage& stage, int size) {
  if (static_cast<int>(stage.ringOf.size()) != size)
    refuse("stage has no ring index for every rank");
  const int j = stage.dimension;
  size_t members = 0;
  std::vector<char> seen;
  for (size_t i = 0; i < stage.rings.size(); ++i) {
    const std::vector<int>& ring = stage.rings[i];
    if (ring.size() < 2 || ring.size() != static_cast<size_t>(plan.dims[j])) {
      refuse("ring is malformed");
    }
    seen.assign(ring.size(), 0);
    for (int r : ring) {
      if (r < 0 || r >= size) refuse("names rank " + std::to_string(r));
      if (stage.ringOf[r] != static_cast<int>(i)) {
        refuse("puts rank " + std::to_string(r) + " in two rings");
      }
      for (size_t k = 0; k < plan.dims.size(); ++k) {
        if (static_cast<int>(k) != j && plan.coords[r][k] != plan.coords[ring[0]][k]) {
          refuse("ring " + std::to_string(i) + " spans dimension " + std::to_string(k));
        }
      }
      const int c = plan.coords[r][j];
      if (c < 0 || c >= plan.dims[j] || seen[c]++ > 0) {
        refuse("ring " + std::to_string(i) + " holds coordinate " + std::to_string(c) + " twice");
      }
    }
    members += ring.size();
  }
  if (members != static_cast<size_t>(size)) refuse("leaves a rank out of a stage's rings");
}

}  // namespace

void checkBlockStages(const BlockPlan& plan, int size, bool reduceScatter) {
  // The grid: one rank at each place, its coordinates in range.
  size_t places = 1;
  for (int d : plan.dims) {
    if (d < 1) refuse("has an empty dimension");
    places *= static_cast<size_t>(d);
  }
  if (places != static_cast<size_t>(size) || plan.rankAt.size() != places ||
      plan.coords.size() != places) {
    refuse("does not place every rank once");
  }
  for (int r = 0; r < size; ++r) {
    const std::vector<int>& c = plan.coords[r];
    if (c.size() != plan.dims.size()) refuse("gives rank " + std::to_string(r) + " no place");
    for (size_t k = 0; k < c.size(); ++k) {
      if (c[k] < 0 || c[k] >= plan.dims[k])
        refuse("puts rank " + std::to_string(r) + " off the grid");
    }
    if (plan.rankAt[plan.placeOf(c)] != r)
      refuse("puts two ranks at rank " + std::to_string(r) + "'s place");
  }
  // Every dimension of more than one place once, in order (allgather outermost first), each
  // stage's combinations over the dimensions above it, and tag steps apart.
  std::vector<int> wanted;
  for (int k = 0; k < static_cast<int>(plan.dims.size()); ++k) {
    if (plan.dims[k] > 1) wanted.push_back(k);
  }
  if (!reduceScatter) std::reverse(wanted.begin(), wanted.end());
  if (plan.stages.size() != wanted.size()) refuse("has a stage too many or too few");
  uint64_t stepsFrom = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const BlockStage& stage = plan.stages[s];
    if (stage.dimension != wanted[s]) refuse("runs its stages out of order");
    std::vector<int> above;
    size_t combinations = 1;
    for (int k : wanted) {
      if (k > stage.dimension) above.push_back(k);
    }
    for (int k : above) combinations *= static_cast<size_t>(plan.dims[k]);
    if (stage.above != above || stage.combinations != combinations) {
      refuse("stage " + std::to_string(s) + " has the wrong dimensions above it");
    }
    checkRings(plan, stage, size);
    const uint64_t steps = combinations * static_cast<uint64_t>(plan.dims[stage.dimension] - 1);
    if (stage.firstStep < stepsFrom || stage.firstStep + steps > tag::kMaxSteps) {
      refuse("stage " + std::to_string(s) + "'s tag steps overlap or overflow");
    }
    stepsFrom = stage.firstStep + steps;
  }
}

void replayBlockStages(const BlockPlan& plan, int size, bool reduceScatter) {
  // The blocks are followed a batch at a time, so that the check holds a bounded number of
  // counts whatever P: per rank and block of the batch, allgather: whether the rank holds the
  // block; reduce-scatter: over how many ranks its partial sum runs (0: not held).
  constexpr size_t kCounts = size_t{1} << 20;
  const int batch = static_cast<int>(std::max<size_t>(64, kCounts / static_cast<size_t>(size)));
  std::vector<int32_t> held;
  for (int first = 0; first < size; first += batch) {
    const int width = std::min(batch, size - first);
    held.assign(static_cast<size_t>(size) * width, reduceScatter ? 1 : 0);
    auto at = [&](int r, int b) -> int32_t& {
      return held[static_cast<size_t>(r) * width + (b - first)];
    };
    if (!reduceScatter) {
      for (int b = first; b < first + width; ++b) at(b, b) = 1;
    }
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const BlockStage& stage = plan.stages[s];
      for (size_t i = 0; i < stage.rings.size(); ++i) {
        for (size_t q = 0; q < stage.combinations; ++q) {
          const BlockRing ring = plan.ring(s, static_cast<int>(i), q);
          const size_t n = ring.order.size();
          for (size_t p = 0; p < n; ++p) {
            const int b = ring.blocks[p];
            if (b < 0 || b >= size) throw Error("ddl: block plan names block " + std::to_string(b));
            if (b < first || b >= first + width) continue;
            if (reduceScatter) {
              int32_t total = 0;
              for (int r : ring.order) {
                if (at(r, b) == 0) {
                  throw Error("ddl: block plan reduces block " + std::to_string(b) + " on rank " +
                              std::to_string(r) + ", which gave it away");
                }
                total += at(r, b);
                at(r, b) = 0;
              }
              at(ring.order[p], b) = total;
            } else {
              if (at(ring.order[p], b) == 0) {
                throw Error("ddl: block plan has rank " + std::to_string(ring.order[p]) +
                            " send block " + std::to_string(b) + " it does not hold");
              }
              for (int r : ring.order) at(r, b) = 1;
            }
          }
        }
      }
    }
    for (int r = 0; r < size; ++r) {
      bool ok = true;
      if (reduceScatter) {
        ok = r < first || r >= first + width || at(r, r) == size;
      } else {
        for (int b = first; b < first + width && ok; ++b) ok = at(r, b) == 1;
      }
      if (!ok) throw Error("ddl: block plan leaves rank " + std::to_string(r) + " incomplete");
    }
  }
}

TreePlace broadcastTreePlace(const Topology& t, int root, int rank, bool hierarchical) {
  TreePlace place;
  if (!hierarchical || t.hosts() < 2) {
    binomial(
        t.size, (rank - root + t.size) % t.size, [&](int v) { return (root + v) % t.size; }, place);
    return place;
  }
  // Across hosts first: one leader a host, the root first, then the other hosts' lowest ranks in
  // host order. Each place is found from its host's index, so a rank's place costs O(log hosts)
  // lookups, not a list of every host.
  const Level& host = t.levels[0];
  const int rootHost = host.blockOf(root);
  const int myHost = host.blockOf(rank);
  const int leader = myHost == rootHost ? root : host.firstRankOf(myHost);
  if (rank == leader) {
    const int v = myHost == rootHost ? 0 : (myHost < rootHost ? myHost + 1 : myHost);
    binomial(
        t.hosts(), v,
        [&](int w) { return w == 0 ? root : host.firstRankOf(w - 1 < rootHost ? w - 1 : w); },
        place);
  }
  // Then within each host from its leader, the others in rank order from it, round the host.
  std::vector<int> order = host.membersOf(myHost);
  std::rotate(order.begin(), std::find(order.begin(), order.end(), leader), order.end());
  TreePlace inside;
  binomial(
      static_cast<int>(order.size()),
      static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin()),
      [&](int v) { return order[v]; }, inside);
  if (rank != leader) place.parent = inside.parent;
  place.children.insert(place.children.end(), inside.children.begin(), inside.children.end());
  return place;
}

}  // namespace ddl
