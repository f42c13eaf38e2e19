#include "block_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "../base/tag.h"
#include "../base/types.h"

namespace ddl {
namespace {

// Binomial tree over `ranks` (ranks[0] the root): the parent and children of ranks[v].
void binomial(const std::vector<int>& ranks, int v, TreePlace& place) {
  const int n = static_cast<int>(ranks.size());
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      place.parent = ranks[v - mask];
      break;
    }
    mask <<= 1;
  }
  for (int m = mask >> 1; m > 0; m >>= 1) {
    if (v + m < n) place.children.push_back(ranks[v + m]);
  }
}

}  // namespace

std::vector<BlockStage> planBlockStages(const Topology& t, bool reduceScatter) {
  if (t.hosts() < 2) return {};
  const Grid grid = gridOf(t);
  if (!grid.regular) return {};
  std::map<std::vector<int>, int> rankAt;
  for (int r = 0; r < t.size; ++r) rankAt[grid.coords[r]] = r;
  std::vector<int> dims;
  for (int k = 0; k < static_cast<int>(grid.dims.size()); ++k) {
    if (grid.dims[k] > 1) dims.push_back(k);
  }
  if (!reduceScatter) std::reverse(dims.begin(), dims.end());
  std::vector<BlockStage> stages;
  uint32_t nextStep = 0;
  for (int j : dims) {
    BlockStage stage;
    stage.dimension = j;
    // Every combination of the coordinates above j.
    std::vector<int> above;
    for (int k : dims) {
      if (k > j) above.push_back(k);
    }
    size_t combinations = 1;
    for (int k : above) combinations *= static_cast<size_t>(grid.dims[k]);
    // The dimension rings of a stage have no rank in common: each numbers its rings' steps from
    // the stage's base (the rings of one, over the same ranks, need ranges apart), so the steps
    // grow with a ring's share of the job, not with the number of hosts.
    const uint32_t base = nextStep;
    uint32_t end = base;
    for (const std::vector<int>& ring : dimensionRings(t, grid, j)) {
      nextStep = base;
      for (size_t index = 0; index < combinations; ++index) {
        BlockRing br;
        br.order = ring;
        size_t rest = index;
        for (int position = 0; position < static_cast<int>(ring.size()); ++position) {
          std::vector<int> c = grid.coords[ring[0]];
          c[j] = grid.coords[ring[position]][j];
          size_t q = rest;
          for (int k : above) {
            c[k] = static_cast<int>(q % grid.dims[k]);
            q /= grid.dims[k];
          }
          br.blocks.push_back(rankAt.at(c));
        }
        br.firstStep = nextStep;
        nextStep += static_cast<uint32_t>(ring.size() - 1);
        stage.rings.push_back(std::move(br));
      }
      end = std::max(end, nextStep);
    }
    nextStep = end;
    if (!stage.rings.empty()) stages.push_back(std::move(stage));
  }
  if (nextStep > tag::kMaxSteps) return {};
  checkBlockStages(stages, t.size, reduceScatter);
  return stages;
}

void checkBlockStages(const std::vector<BlockStage>& stages, int size, bool reduceScatter) {
  // Allgather: which blocks each rank holds. Reduce-scatter: per rank and block, over how many
  // ranks its partial sum runs (absent: not held).
  std::vector<std::set<int>> holds(size);
  std::vector<std::map<int, int>> sums(size);
  for (int r = 0; r < size; ++r) {
    holds[r].insert(r);
    for (int b = 0; b < size; ++b) sums[r][b] = 1;
  }
  for (const BlockStage& stage : stages) {
    for (const BlockRing& ring : stage.rings) {
      const size_t n = ring.order.size();
      if (n < 2 || ring.blocks.size() != n) throw Error("ddl: block plan ring is malformed");
      for (size_t p = 0; p < n; ++p) {
        int r = ring.order[p];
        if (r < 0 || r >= size) throw Error("ddl: block plan names rank " + std::to_string(r));
        if (reduceScatter) {
          for (int b : ring.blocks) {
            if (!sums[r].count(b)) {
              throw Error("ddl: block plan reduces block " + std::to_string(b) + " on rank " +
                          std::to_string(r) + ", which gave it away");
            }
          }
        } else if (!holds[r].count(ring.blocks[p])) {
          throw Error("ddl: block plan has rank " + std::to_string(r) + " send block " +
                      std::to_string(ring.blocks[p]) + " it does not hold");
        }
      }
      if (reduceScatter) {
        for (size_t p = 0; p < n; ++p) {
          int total = 0;
          for (int r : ring.order) total += sums[r].at(ring.blocks[p]);
          for (int r : ring.order) sums[r].erase(ring.blocks[p]);
          sums[ring.order[p]][ring.blocks[p]] = total;
        }
      } else {
        for (int r : ring.order) holds[r].insert(ring.blocks.begin(), ring.blocks.end());
      }
    }
  }
  for (int r = 0; r < size; ++r) {
    bool ok = reduceScatter ? sums[r].count(r) && sums[r].at(r) == size
                            : static_cast<int>(holds[r].size()) == size;
    if (!ok) throw Error("ddl: block plan leaves rank " + std::to_string(r) + " incomplete");
  }
}

TreePlace broadcastTreePlace(const Topology& t, int root, int rank, bool hierarchical) {
  TreePlace place;
  std::vector<int> all;
  if (!hierarchical || t.hosts() < 2) {
    for (int i = 0; i < t.size; ++i) all.push_back((root + i) % t.size);
    binomial(all, static_cast<int>(std::find(all.begin(), all.end(), rank) - all.begin()), place);
    return place;
  }
  const std::vector<int>& hostOf = t.levels[0].blockOf;
  std::vector<std::vector<int>> hosts = t.members(0);
  std::vector<int> leaders = {root};
  for (const std::vector<int>& h : hosts) {
    if (hostOf[h[0]] != hostOf[root]) leaders.push_back(h[0]);
  }
  std::vector<int> local = hosts[hostOf[rank]];
  const int leader = hostOf[rank] == hostOf[root] ? root : local[0];
  std::rotate(local.begin(), std::find(local.begin(), local.end(), leader), local.end());
  std::vector<int>::iterator at = std::find(leaders.begin(), leaders.end(), rank);
  if (at != leaders.end()) {
    binomial(leaders, static_cast<int>(at - leaders.begin()), place);  // across hosts first
  }
  TreePlace inside;
  std::vector<int> order = {leader};
  for (int r : local) {
    if (r != leader) order.push_back(r);
  }
  binomial(order, static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin()),
           inside);
  if (rank != leader) place.parent = inside.parent;
  place.children.insert(place.children.end(), inside.children.begin(), inside.children.end());
  return place;
}

}  // namespace ddl
