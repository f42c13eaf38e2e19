// The planner's choice: every candidate for a size, each priced by the cost model, the cheapest
// first (allreduce_plan.h).
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <numeric>

#include "../base/config.h"
#include "../base/tag.h"
#include "allreduce_plan.h"
#include "cost_model.h"

namespace ddl {
namespace {

AllreducePlan simplePlan(AllreduceAlgorithm algorithm, size_t count, size_t elementSize,
                         int rings = 1) {
  AllreducePlan plan;
  plan.algorithm = algorithm;
  plan.count = count;
  plan.elementSize = elementSize;
  plan.rings = rings;
  return plan;
}

// One host's shared memory: kShared, or kSharedRing, kDirect or kStaged where the request forces
// them.
// Whether an allreduce of `bytes` at `ranks` ranks runs in one step: each rank reads the other
// ranks' tensors, (ranks - 1) x bytes, at most request.onceBytes of them.
bool runsOnce(size_t bytes, int ranks, const PlanRequest& request) {
  return bytes <= request.stagedBytes &&
         bytes * static_cast<size_t>(std::max(ranks - 1, 1)) <= request.onceBytes;
}

AllreducePlan sharedPlan(AllreduceAlgorithm algorithm, size_t count, size_t elementSize,
                         const PlanRequest& request, int ranks) {
  using A = AllreduceAlgorithm;
  AllreducePlan plan = simplePlan(algorithm, count, elementSize);
  const bool large = count * elementSize >= request.directMinBytes;
  plan.asksDirect = algorithm == A::kDirect || (algorithm == A::kShared && large);
  plan.staged = algorithm == A::kStaged ||
                (algorithm == A::kShared && count * elementSize <= request.stagedBytes);
  plan.once = plan.staged && runsOnce(count * elementSize, ranks, request);
  plan.doublesUnshared = algorithm == A::kShared && count * elementSize <= kUnsharedDoublingBytes;
  plan.adopts = algorithm != A::kSharedRing && algorithm != A::kStaged && request.shareTensors;
  plan.offersAdoption = plan.adopts && large && request.algorithm != A::kShared;
  return plan;
}

AllreducePlan leadersPlan(const Topology& t, size_t count, size_t elementSize) {
  AllreducePlan plan = simplePlan(AllreduceAlgorithm::kLeaders, count, elementSize);
  plan.hosts = t.members(0);
  plan.hostOf.assign(static_cast<size_t>(t.size), -1);
  for (size_t h = 0; h < plan.hosts.size(); ++h) {
    plan.leaders.push_back(plan.hosts[h].front());
    for (int r : plan.hosts[h]) plan.hostOf[static_cast<size_t>(r)] = static_cast<int>(h);
  }
  return plan;
}

// Where the candidates go, one at a time: each is made, passed over where auto would not run it
// (`passedOver`), and priced. Where only the cheapest is wanted whole (the planner's choice), a
// multidim plan lets its lanes go once priced and keeps how it was made, so that one plan's
// stages are held at a time: every candidate held whole took 7 GB at 65 536 ranks.
class Candidates {
 public:
  Candidates(const Topology& t, const LinkCosts& links, bool autoPlan, int dims, bool whole)
      : t_(t), links_(links), auto_(autoPlan), dims_(dims), whole_(whole) {}

  void add(std::function<AllreducePlan()> make) {
    AllreducePlan plan = make();
    if (passedOver(plan)) return;
    plan.predicted = predictSeconds(plan, t_, links_);
    if (!whole_ && !plan.lanes.empty()) {
      plan.lanes = {};
      makers_.emplace(plans_.size(), std::move(make));
    }
    plans_.push_back(std::move(plan));
  }
  void add(AllreducePlan plan) {
    add([plan = std::move(plan)] { return plan; });
  }

  std::vector<size_t> order() const {
    std::vector<double> predicted;
    for (const AllreducePlan& plan : plans_) predicted.push_back(plan.predicted);
    return cheapestFirst(predicted);
  }
  std::vector<AllreducePlan> sorted() {
    std::vector<AllreducePlan> out;
    for (size_t i : order()) out.push_back(std::move(plans_[i]));
    return out;
  }
  AllreducePlan cheapest() {
    const size_t first = order().front();
    auto maker = makers_.find(first);
    if (maker == makers_.end()) return std::move(plans_[first]);
    AllreducePlan plan = maker->second();
    plan.predicted = plans_[first].predicted;
    return plan;
  }

 private:
  // Auto passes over a multidim plan in which a rank talks to more peers than two a lane and
  // level and a few: on an irregular machine the closing stage's rings can run through a
  // scattered rank of each block, a different one for each piece, and one rank then opens an
  // endpoint to most of the group (245 of 273 on 137 hosts of 2 and 1 in racks of 4: a
  // campaign's finding). The cost model does not price endpoints; the flat ring or the
  // leaders serve such a machine. So does it pass over one whose irregular closing stage
  // needs more tag steps than a tag holds (798 ranks on 323 uneven hosts, shrunk: 16 386).
  //
  // It passes over every plan that needs a closing stage at all: where a short host breaks
  // the grid, that stage merges up to half the buffer in many small rings meeting on the short
  // host's ranks, after the other stages, and the simulation ran such plans 1.3 - 43 times
  // longer than the model predicted and up to 22 times longer than the flat ring
  // (Sim.UnevenMachinesTakeNoSlowerPlanThanTheRing).
  bool passedOver(const AllreducePlan& plan) const {
    if (!auto_ || plan.algorithm != AllreduceAlgorithm::kMultiDim) return false;
    if (needsClosingStage(plan)) return true;
    if (stepsNeeded(plan) > tag::kMaxSteps) return true;
    const int most = 2 * static_cast<int>(plan.lanes.size()) * (dims_ + 1) + 16;
    return talksToMoreThan(plan, t_.size, most);
  }

  const Topology& t_;
  const LinkCosts& links_;
  const bool auto_;
  const int dims_;
  const bool whole_;
  std::vector<AllreducePlan> plans_;
  std::map<size_t, std::function<AllreducePlan()>> makers_;  // by plan, where its lanes went
};

// The multidim plans weighed: 1..dims colours, 1..2 rings and 1, 2, 4 or 8 waves, as far as the
// request leaves them open and the tag's phases hold them; over `t` with these dimensions split.
void multiDimChoices(std::shared_ptr<const Topology> t, size_t count, size_t elementSize, int dims,
                     const PlanRequest& request, Candidates& out,
                     std::vector<AllreducePlan::Split> splits = {}) {
  std::vector<int> colorChoices, ringChoices;
  for (int c = 1; c <= std::max(dims, 1); ++c) {
    if (request.colors == 0 || request.colors == c) colorChoices.push_back(c);
  }
  if (colorChoices.empty()) colorChoices.push_back(request.colors);
  for (int r = 1; r <= 2; ++r) {
    if (request.rings == 0 || request.rings == r) ringChoices.push_back(r);
  }
  if (ringChoices.empty()) ringChoices.push_back(request.rings);
  std::vector<int> waveChoices = {1, 2, 4, 8};
  if (request.waves > 0) waveChoices = {request.waves};
  for (int c : colorChoices) {
    for (int r : ringChoices) {
      for (int w : waveChoices) {
        if (c * r * w > static_cast<int>(tag::kPlanPhases)) continue;
        out.add([t, count, elementSize, c, r, w, order = request.order,
                 hostSlots = request.hostSlots, splits] {
          AllreducePlan plan = planMultiDim(*t, count, elementSize, c, r, order, w);
          plan.hostSlots = hostSlots;
          plan.splits = splits;
          return plan;
        });
      }
    }
  }
}

// The same plans over the hosts alone, priced on the machine's links: where racks are uneven
// (the last one short) a grid of equal hosts is regular without them, and its plans need no
// closing stage.
void hostsOnlyChoices(const Topology& t, size_t count, size_t elementSize,
                      const PlanRequest& request, Candidates& out) {
  auto hostsOnly = std::make_shared<Topology>(t);
  hostsOnly->levels.resize(1);
  int dims = 0;
  for (int d : gridOf(*hostsOnly).dims) dims += d > 1 ? 1 : 0;
  if (dims > 0) multiDimChoices(hostsOnly, count, elementSize, dims, request, out);
}

// The same plans over the machine with each wide network dimension split in two (splitDimension,
// topology.h): a ring of d blocks becomes rings of a blocks, then rings of d / a. The same bytes
// cross the same links, in 2(a - 1) + 2(d/a - 1) steps instead of 2(d - 1): where d is large and
// what crosses it is small (256 racks; a rank's share of a 100 MB allreduce after the host and
// rack stages of 65 536 ranks is 400 KB), the steps' latencies are most of the stage. Regular
// machines only (a level of uneven blocks keeps its rings whole).
void splitChoices(const Topology& t, size_t count, size_t elementSize, const PlanRequest& request,
                  Candidates& out) {
  if (!everyLevelOneRun(t)) return;
  const std::vector<int> dims = gridDims(t);
  Topology split = t;
  std::vector<AllreducePlan::Split> splits;
  // From the top down, so that the dimensions below the one split keep their numbers.
  for (int k = static_cast<int>(dims.size()) - 1; k >= 1; --k) {
    const int inner = splitInner(dims[k]);
    if (inner == 0) continue;
    split = splitDimension(split, k, inner);
    splits.insert(splits.begin(), {k, inner, dims[k] / inner});
  }
  if (splits.empty()) return;
  int splitDims = 0;
  for (int d : gridDims(split)) splitDims += d > 1 ? 1 : 0;
  multiDimChoices(std::make_shared<Topology>(std::move(split)), count, elementSize, splitDims,
                  request, out, std::move(splits));
}

// Every candidate the request leaves for this size.
void fill(const Topology& t, size_t count, size_t elementSize, int dims, const PlanRequest& request,
          Candidates& out) {
  using A = AllreduceAlgorithm;
  // The machine, not owned: the candidates are made while the caller holds it.
  const std::shared_ptr<const Topology> machine(std::shared_ptr<void>(), &t);
  const size_t bytes = count * elementSize;
  switch (request.algorithm) {
    case A::kRecursiveDoubling:
      out.add(simplePlan(AllreduceAlgorithm::kRecursiveDoubling, count, elementSize));
      break;
    case A::kLeaders:
      out.add(leadersPlan(t, count, elementSize));
      break;
    case A::kRing:
      out.add(simplePlan(AllreduceAlgorithm::kRing, count, elementSize, request.ringRings));
      break;
    case A::kShared:
    case A::kSharedRing:
    case A::kDirect:
    case A::kStaged:
      out.add(sharedPlan(request.algorithm, count, elementSize, request, t.size));
      break;
    case A::kMultiDim:
      multiDimChoices(machine, count, elementSize, dims, request, out);
      break;
    case A::kAuto:
    case A::kTrivial:  // (not a request: the planner's choice)
      if (t.hosts() == 1) {
        out.add(bytes <= request.smallBytes && !runsOnce(bytes, t.size, request)
                    ? simplePlan(AllreduceAlgorithm::kRecursiveDoubling, count, elementSize)
                    : sharedPlan(AllreduceAlgorithm::kShared, count, elementSize, request, t.size));
        break;
      }
      out.add(simplePlan(AllreduceAlgorithm::kRecursiveDoubling, count, elementSize));
      out.add(leadersPlan(t, count, elementSize));
      out.add(simplePlan(AllreduceAlgorithm::kRing, count, elementSize, request.ringRings));
      if (dims > 0) multiDimChoices(machine, count, elementSize, dims, request, out);
      if (t.levels.size() > 1 && request.order.empty()) {
        hostsOnlyChoices(t, count, elementSize, request, out);
      }
      if (request.order.empty()) splitChoices(t, count, elementSize, request, out);
      break;
  }
}

// The candidates for this size, made and priced one at a time (`whole`: each held whole).
Candidates weigh(const Topology& t, const LinkCosts& links, size_t count, size_t elementSize,
                 const PlanRequest& request, bool whole) {
  int dims = 0;
  if (t.size > 1 && count > 0) {
    for (int d : gridOf(t).dims) dims += d > 1 ? 1 : 0;
  }
  Candidates out(t, links, request.algorithm == AllreduceAlgorithm::kAuto, dims, whole);
  if (t.size == 1 || count == 0) {
    out.add(simplePlan(AllreduceAlgorithm::kTrivial, count, elementSize));
  } else {
    fill(t, count, elementSize, dims, request, out);
  }
  return out;
}

}  // namespace

std::vector<size_t> cheapestFirst(const std::vector<double>& predicted) {
  std::vector<size_t> left(predicted.size()), order;
  std::iota(left.begin(), left.end(), size_t{0});
  while (!left.empty()) {
    double cheapest = predicted[left.front()];
    for (size_t i : left) cheapest = std::min(cheapest, predicted[i]);
    auto first = std::find_if(left.begin(), left.end(),
                              [&](size_t i) { return !(cheapest < predicted[i] * 0.999); });
    if (first == left.end()) first = left.begin();  // no prediction compares (NaN)
    order.push_back(*first);
    left.erase(first);
  }
  return order;
}

std::vector<AllreducePlan> allreduceCandidates(const Topology& t, const LinkCosts& links,
                                               size_t count, size_t elementSize,
                                               const PlanRequest& request) {
  return weigh(t, links, count, elementSize, request, true).sorted();
}

PlanRequest planRequest(const Config& c) {
  PlanRequest request;
  request.algorithm = c.allreduceAlgorithm;
  request.colors = static_cast<int>(c.colors);
  request.rings = static_cast<int>(c.rings);
  request.ringRings = static_cast<int>(std::max<size_t>(c.rings, 1));
  request.order = c.levelOrder;
  request.waves = static_cast<int>(c.waves);
  request.smallBytes = c.smallBytes;
  if (c.allgatherAlgorithm == "bruck") request.allgather = AllgatherSchedule::kGridBruck;
  if (c.allgatherAlgorithm == "ring") request.allgather = AllgatherSchedule::kGrid;
  if (c.alltoallAlgorithm == "pairwise") request.alltoall = AlltoallSchedule::kPairwise;
  if (c.alltoallAlgorithm == "bruck") request.alltoall = AlltoallSchedule::kBruck;
  if (c.gatherAlgorithm == "linear") request.gather = GatherSchedule::kLinear;
  if (c.gatherAlgorithm == "tree") request.gather = GatherSchedule::kTree;
  request.hostSlots = c.hostSlots;
  request.directMinBytes = c.directMinBytes;
  request.shareTensors = c.shareTensors;
  request.stagedBytes = c.stagedBytes;
  request.onceBytes = c.onceBytes;
  return request;
}

PlanRequest planRequest() { return planRequest(config()); }

AllreducePlan planAllreduce(const Topology& t, const LinkCosts& links, size_t count,
                            size_t elementSize, const PlanRequest& request) {
  AllreducePlan plan = weigh(t, links, count, elementSize, request, false).cheapest();
  if (plan.algorithm == AllreduceAlgorithm::kMultiDim) {
    checkPlan(plan, t.size);
    indexMembers(plan, t.size);
  }
  plan.checked = true;
  return plan;
}

}  // namespace ddl
