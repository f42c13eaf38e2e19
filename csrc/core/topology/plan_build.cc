// The builders: plans made by pure functions from the machine (allreduce_plan.h).
#include <algorithm>
#include <sstream>

#include "../base/tag.h"
#include "../base/types.h"
#include "allreduce_plan.h"
#include "plan_holdings.h"

namespace ddl {
namespace {

using Pieces = std::vector<std::pair<Range, std::vector<int>>>;

// The pieces of a group whose members hold the same ranges with the same weights (every group
// of a regular grid's stage): each range is a piece that all of them hold, in order (a member's
// ranges are disjoint and never touch with one weight: addRange merges them). False otherwise.
bool samePieces(const Holdings& holdings, const std::vector<int>& members, Pieces& pieces) {
  const std::vector<Held>& first = holdings[members.front()];
  for (int r : members) {
    const std::vector<Held>& held = holdings[r];
    if (held.size() != first.size()) return false;
    for (size_t i = 0; i < held.size(); ++i) {
      if (held[i].begin != first[i].begin || held[i].end != first[i].end ||
          held[i].weight != first[i].weight) {
        return false;
      }
    }
  }
  for (size_t i = 0; i < first.size(); ++i) {
    if (i > 0 && first[i - 1].end == first[i].begin && first[i - 1].weight == first[i].weight) {
      return false;  // (not as addRange leaves them: the general way merges them)
    }
  }
  for (const Held& h : first) pieces.emplace_back(Range{h.begin, h.end - h.begin}, members);
  return true;
}

// Any group's pieces held by two or more members: each interval between the ends of what its
// members hold, with the members holding it (in member order); neighbours held alike, with the
// same weights, merged.
void differentPieces(const Holdings& holdings, const std::vector<int>& members, Pieces& pieces) {
  std::vector<size_t> cuts;
  for (int r : members) {
    for (const Held& h : holdings[r]) {
      cuts.push_back(h.begin);
      cuts.push_back(h.end);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  if (cuts.size() < 2) return;
  // A member's ranges are disjoint and their ends are cuts, so each covers a run of intervals:
  // O(what the members hold), where asking every member of every interval was O(members x
  // intervals), O(P^2) for the closing stage over the whole group. Only intervals that two or
  // more hold are spelled out (where every member holds its own, as the closing stage mostly
  // finds them, none).
  std::vector<std::pair<size_t, size_t>> spans;  // by member's range: its intervals [from, to)
  std::vector<int> holders(cuts.size(), 0);      // by interval, once summed
  for (int r : members) {
    for (const Held& h : holdings[r]) {
      const auto from =
          static_cast<size_t>(std::lower_bound(cuts.begin(), cuts.end(), h.begin) - cuts.begin());
      const auto to =
          static_cast<size_t>(std::lower_bound(cuts.begin(), cuts.end(), h.end) - cuts.begin());
      spans.emplace_back(from, to);
      ++holders[from];
      --holders[to];
    }
  }
  for (size_t i = 1; i < holders.size(); ++i) holders[i] += holders[i - 1];
  using Key = std::vector<std::pair<int, int64_t>>;
  std::vector<Key> keys(cuts.size() - 1);
  size_t span = 0;
  for (int r : members) {
    for (const Held& h : holdings[r]) {
      const auto [from, to] = spans[span++];
      for (size_t i = from; i < to; ++i) {
        if (holders[i] >= 2) keys[i].emplace_back(r, h.weight);
      }
    }
  }
  std::vector<std::pair<Range, Key>> keyed;
  bool follows = false;  // the last interval is keyed's last
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    if (holders[i] < 2) {
      follows = false;
      continue;
    }
    Range range{cuts[i], cuts[i + 1] - cuts[i]};
    if (follows && keyed.back().second == keys[i]) {
      keyed.back().first.length += range.length;
    } else {
      keyed.emplace_back(range, std::move(keys[i]));
    }
    follows = true;
  }
  for (auto& [range, key] : keyed) {
    std::vector<int> members;
    for (auto& [r, w] : key) members.push_back(r);
    pieces.emplace_back(range, std::move(members));
  }
}

// One stage: within each group of `rings` (ranks in ring order), every piece held by two or more
// members with the same weights becomes a ring. Updates `holdings` and the lane's step counter.
// The groups of a stage have no rank in common, so their rings number their steps from the
// same base (only the rings of one group, which share ranks, need ranges apart): a stage takes
// the steps of its busiest group, not of every ring of the job.
Stage runStage(Holdings& holdings, const std::vector<std::vector<int>>& rings, int dimension,
               bool reversed, uint32_t& nextStep) {
  Stage stage;
  stage.dimension = dimension;
  const uint32_t base = nextStep;
  uint32_t end = base;
  for (const std::vector<int>& members : rings) {
    nextStep = base;
    if (members.empty()) continue;
    Pieces pieces;  // each with the members holding it, in member order
    if (!samePieces(holdings, members, pieces)) differentPieces(holdings, members, pieces);
    for (auto& [piece, holders] : pieces) {
      if (holders.size() < 2 || piece.length == 0) continue;
      StageRing ring;
      ring.order = std::move(holders);
      if (reversed) std::reverse(ring.order.begin(), ring.order.end());
      ring.chunks = splitEven(piece.length, ring.order.size());
      for (Range& c : ring.chunks) c.offset += piece.offset;
      ring.firstStep = nextStep;
      nextStep += 2 * static_cast<uint32_t>(ring.order.size() - 1);
      applyRing(holdings, ring);
      stage.rings.push_back(std::move(ring));
    }
    end = std::max(end, nextStep);
  }
  nextStep = end;
  return stage;
}

}  // namespace

std::string AllreducePlan::describe() const {
  std::ostringstream out;
  out << algorithmName(algorithm);
  if (algorithm == AllreduceAlgorithm::kRing) out << " rings=" << rings;
  if (staged) out << (once ? " staged once" : " staged");
  if (algorithm == AllreduceAlgorithm::kMultiDim) {
    out << " colors=" << colors << " rings=" << rings << " waves=" << waves;
    if (!hostSlots) out << " host=messages";
    if (!lanes.empty()) {
      out << " order=";
      for (size_t i = 0; i < lanes[0].order.size(); ++i) {
        out << (i ? "," : "") << lanes[0].order[i];
      }
    }
    for (const Split& s : splits) {
      out << " split" << s.dimension << "=" << s.inner << "x" << s.outer;
    }
  }
  return out.str();
}

AllreducePlan planMultiDim(const Topology& t, size_t count, size_t elementSize, int colors,
                           int rings, const std::vector<int>& order, int waves) {
  colors = std::max(colors, 1);
  rings = std::max(rings, 1);
  waves = std::max(waves, 1);
  if (colors * rings * waves > static_cast<int>(tag::kPlanPhases)) {
    throw Error("ddl: " + std::to_string(colors) + " colours x " + std::to_string(rings) +
                " rings x " + std::to_string(waves) + " waves need more than the " +
                std::to_string(tag::kPlanPhases) + " tag phases a plan has");
  }
  const Grid grid = gridOf(t);
  std::vector<int> dims;
  for (int k : order) {
    if (k < 0 || k >= static_cast<int>(grid.dims.size())) {
      throw Error("ddl: level order names dimension " + std::to_string(k) + "; this topology has " +
                  std::to_string(grid.dims.size()) + " (0 within a host, 1 across hosts, ...)");
    }
    if (std::find(dims.begin(), dims.end(), k) != dims.end()) {
      throw Error("ddl: level order names dimension " + std::to_string(k) + " twice");
    }
    dims.push_back(k);
  }
  for (int k = 0; k < static_cast<int>(grid.dims.size()); ++k) {
    if (std::find(dims.begin(), dims.end(), k) == dims.end()) dims.push_back(k);
  }
  std::erase_if(dims, [&](int k) { return grid.dims[k] < 2; });
  std::vector<std::vector<std::vector<int>>> ringsOf(grid.dims.size());
  for (int k : dims) ringsOf[k] = dimensionRings(t, grid, k);

  AllreducePlan plan;
  plan.algorithm = AllreduceAlgorithm::kMultiDim;
  plan.count = count;
  plan.elementSize = elementSize;
  plan.colors = colors;
  plan.rings = rings;
  plan.waves = waves;
  std::vector<Range> shares = splitEven(count, static_cast<size_t>(colors * rings * waves));
  for (int c = 0; c < colors; ++c) {
    for (int r = 0; r < rings; ++r) {
      for (int w = 0; w < waves; ++w) {
        const int index = (c * rings + r) * waves + w;
        Lane lane;
        lane.range = shares[index];
        lane.phase = static_cast<uint32_t>(index);
        lane.after = w > 0 ? index - 1 : -1;
        lane.reversed = r % 2 == 1;
        lane.order = dims;
        if (!dims.empty()) {
          std::rotate(lane.order.begin(), lane.order.begin() + c % dims.size(), lane.order.end());
        }
        Holdings holdings = initialHoldings(t.size, lane.range);
        uint32_t nextStep = 0;
        for (int k : lane.order) {
          Stage stage = runStage(holdings, ringsOf[k], k, lane.reversed, nextStep);
          if (!stage.rings.empty()) lane.stages.push_back(std::move(stage));
        }
        Stage closing =
            runStage(holdings, {naturalRing(t.size, false).order}, -1, lane.reversed, nextStep);
        if (!closing.rings.empty()) lane.stages.push_back(std::move(closing));
        plan.lanes.push_back(std::move(lane));
      }
    }
  }
  return plan;
}

void indexMembers(AllreducePlan& plan, int size) {
  for (Lane& lane : plan.lanes) {
    for (Stage& stage : lane.stages) {
      std::vector<uint32_t> count(static_cast<size_t>(size) + 1, 0);
      for (const StageRing& ring : stage.rings) {
        for (int r : ring.order) ++count[static_cast<size_t>(r) + 1];
      }
      for (size_t r = 1; r < count.size(); ++r) count[r] += count[r - 1];
      stage.memberFrom = count;
      stage.memberRings.assign(count.back(), 0);
      for (uint32_t i = 0; i < stage.rings.size(); ++i) {  // in ring order
        for (int r : stage.rings[i].order) stage.memberRings[count[static_cast<size_t>(r)]++] = i;
      }
    }
  }
}

std::vector<uint32_t> ringsWith(const Stage& stage, int rank) {
  const size_t r = static_cast<size_t>(rank);
  if (r + 1 < stage.memberFrom.size()) {
    return std::vector<uint32_t>(stage.memberRings.begin() + stage.memberFrom[r],
                                 stage.memberRings.begin() + stage.memberFrom[r + 1]);
  }
  std::vector<uint32_t> rings;
  for (uint32_t i = 0; i < stage.rings.size(); ++i) {
    const std::vector<int>& order = stage.rings[i].order;
    if (std::find(order.begin(), order.end(), rank) != order.end()) rings.push_back(i);
  }
  return rings;
}

}  // namespace ddl
