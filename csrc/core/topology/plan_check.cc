// The check of a plan: its rings and steps are well formed and replaying it leaves every element
// with one holder of the whole sum (allreduce_plan.h).
#include <algorithm>
#include <string>

#include "../base/tag.h"
#include "../base/types.h"
#include "allreduce_plan.h"
#include "plan_holdings.h"

namespace ddl {

bool talksToMoreThan(const AllreducePlan& plan, int size, int most) {
  std::vector<std::vector<int>> peers(size);
  auto meet = [&](int r, int q) {
    std::vector<int>& p = peers[r];
    if (r == q || std::find(p.begin(), p.end(), q) != p.end()) return false;
    p.push_back(q);
    return static_cast<int>(p.size()) > most;
  };
  for (const Lane& lane : plan.lanes) {
    for (const Stage& stage : lane.stages) {
      for (const StageRing& ring : stage.rings) {
        const size_t n = ring.order.size();
        for (size_t i = 0; i < n; ++i) {
          const int r = ring.order[i], next = ring.order[(i + 1) % n];
          if (r < 0 || r >= size || next < 0 || next >= size) continue;
          if (meet(r, next) || meet(next, r)) return true;
        }
      }
    }
  }
  return false;
}

bool needsClosingStage(const AllreducePlan& plan) {
  for (const Lane& lane : plan.lanes) {
    for (const Stage& stage : lane.stages) {
      if (stage.dimension < 0) return true;
    }
  }
  return false;
}

uint64_t stepsNeeded(const AllreducePlan& plan) {
  uint64_t most = 0;
  for (const Lane& lane : plan.lanes) {
    for (const Stage& stage : lane.stages) {
      for (const StageRing& ring : stage.rings) {
        if (ring.order.size() < 2) continue;
        most = std::max<uint64_t>(most, uint64_t{ring.firstStep} + 2 * (ring.order.size() - 1));
      }
    }
  }
  return most;
}

void checkPlan(const AllreducePlan& plan, int size) {
  if (plan.algorithm != AllreduceAlgorithm::kMultiDim) return;
  size_t covered = 0;
  std::vector<bool> phaseUsed(tag::kPlanPhases, false);
  for (const Lane& lane : plan.lanes) {
    if (lane.range.offset != covered) throw Error("ddl: plan lanes do not tile the buffer");
    covered += lane.range.length;
    if (lane.phase >= tag::kPlanPhases || phaseUsed[lane.phase]) {
      throw Error("ddl: plan lane phase " + std::to_string(lane.phase) + " is reused or too large");
    }
    phaseUsed[lane.phase] = true;
    const int index = static_cast<int>(&lane - plan.lanes.data());
    if (lane.after >= index) {
      throw Error("ddl: plan lane " + std::to_string(index) + " follows lane " +
                  std::to_string(lane.after) + ", which is not an earlier wave of it");
    }
    Holdings holdings = initialHoldings(size, lane.range);
    // By rank: the step ranges of the rings it is in (rings that share a rank share no step).
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> steps(size);
    for (const Stage& stage : lane.stages) {
      for (const StageRing& ring : stage.rings) {
        const size_t n = ring.order.size();
        if (n < 2 || ring.chunks.size() != n) {
          throw Error("ddl: plan ring of " + std::to_string(n) + " ranks has " +
                      std::to_string(ring.chunks.size()) + " chunks");
        }
        checkRing(RingPlan{ring.order}, size, false);
        for (size_t p = 1; p < n; ++p) {
          if (ring.chunks[p].offset != ring.chunks[p - 1].offset + ring.chunks[p - 1].length) {
            throw Error("ddl: plan ring chunks are not contiguous");
          }
        }
        uint64_t last = uint64_t{ring.firstStep} + 2 * (n - 1);
        if (last > tag::kMaxSteps) {
          throw Error("ddl: plan needs " + std::to_string(last) + " tag steps in one lane; " +
                      std::to_string(tag::kMaxSteps) + " fit");
        }
        for (int r : ring.order) steps[r].emplace_back(ring.firstStep, static_cast<uint32_t>(last));
        applyRing(holdings, ring);
      }
    }
    for (auto& ranges : steps) {
      std::sort(ranges.begin(), ranges.end());
      for (size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].first < ranges[i - 1].second) {
          throw Error("ddl: plan rings with a rank in common share tag steps");
        }
      }
    }
    std::vector<Held> all;
    for (const auto& h : holdings) all.insert(all.end(), h.begin(), h.end());
    std::sort(all.begin(), all.end(),
              [](const Held& a, const Held& b) { return a.begin < b.begin; });
    size_t at = lane.range.offset;
    for (const Held& h : all) {
      if (h.begin != at || h.weight != size) {
        throw Error("ddl: plan leaves elements [" + std::to_string(h.begin) + ", " +
                    std::to_string(h.end) + ") with a sum over " + std::to_string(h.weight) +
                    " of " + std::to_string(size) + " ranks, or held twice");
      }
      at = h.end;
    }
    if (at != lane.range.offset + lane.range.length) {
      throw Error("ddl: plan leaves elements from " + std::to_string(at) + " unreduced");
    }
  }
  if (covered != plan.count) throw Error("ddl: plan lanes do not cover the buffer");
}

}  // namespace ddl
