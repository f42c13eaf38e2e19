#include "plan_book.h"

#include <algorithm>

namespace ddl {
namespace {

// Every field of the request is part of the key: books that differ in any plan differently.
std::string keyOf(const Topology& t, const LinkCosts& links, const PlanRequest& r,
                  bool hierarchical) {
  std::string key = std::to_string(t.size) + "|";
  for (const Level& level : t.levels) {
    key += level.name + ":";
    for (const std::string& name : level.blockNames) key += name + ",";
    key += ":";
    if (level.interleaved()) {
      for (int r = 0; r < t.size; ++r) key += std::to_string(level.blockOf(r)) + ",";
    }
    for (const Level::Run& run : level.runs()) {
      key += std::to_string(run.firstRank) + "+" + std::to_string(run.blockSize) + "x" +
             std::to_string(run.blocks) + ",";
    }
    key += "|";
  }
  key += links.describe() + "|" + std::to_string(static_cast<int>(r.algorithm)) + "," +
         std::to_string(r.colors) + "," + std::to_string(r.rings) + "," + std::to_string(r.waves) +
         "," + std::to_string(r.smallBytes) + "," + std::to_string(r.ringRings) + "," +
         (r.hostSlots ? "1" : "0") + "," + (hierarchical ? "1" : "0") + "," +
         std::to_string(r.directMinBytes) + "," + (r.shareTensors ? "1" : "0") + "," +
         std::to_string(r.stagedBytes) + "," + std::to_string(r.onceBytes) + "," +
         (r.allgather ? std::to_string(static_cast<int>(*r.allgather)) : "auto") + "," +
         (r.alltoall ? std::to_string(static_cast<int>(*r.alltoall)) : "auto") + "," +
         (r.gather ? std::to_string(static_cast<int>(*r.gather)) : "auto") + ":";
  for (int d : r.order) key += std::to_string(d) + ",";
  return key;
}

}  // namespace

PlanBook::PlanBook(Topology topology, LinkCosts links, PlanRequest request, bool hierarchical)
    : topology_(std::move(topology)),
      links_(std::move(links)),
      request_(std::move(request)),
      hierarchical_(hierarchical) {}

std::shared_ptr<PlanBook> PlanBook::forMachine(Topology topology, LinkCosts links,
                                               PlanRequest request, bool hierarchical) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<PlanBook>> books;
  const std::string key = keyOf(topology, links, request, hierarchical);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = books.find(key);
  if (it != books.end()) {
    if (auto book = it->second.lock()) return book;
  }
  std::erase_if(books, [](const auto& entry) { return entry.second.expired(); });
  auto book = std::make_shared<PlanBook>(std::move(topology), std::move(links), std::move(request),
                                         hierarchical);
  books[key] = book;
  return book;
}

std::vector<AllreducePlan> PlanBook::candidates(size_t count, size_t elementSize) const {
  return allreduceCandidates(topology_, links_, count, elementSize, request_);
}

std::shared_ptr<const AllreducePlan> PlanBook::allreduce(size_t count, size_t elementSize) {
  const std::pair<size_t, size_t> key{count, elementSize};
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  auto plan = std::make_shared<const AllreducePlan>(
      planAllreduce(topology_, links_, count, elementSize, request_));
  if (plans_.size() >= kCache) plans_.clear();
  plans_.emplace(key, plan);
  return plan;
}

std::shared_ptr<const BlockPlan> PlanBook::blockStages(bool reduceScatter) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& stages = stages_[reduceScatter ? 1 : 0];
  if (!stages) {
    stages = std::make_shared<const BlockPlan>(
        hierarchical_ ? planBlockStages(topology_, reduceScatter) : BlockPlan{});
  }
  return stages;
}

std::shared_ptr<const AllgatherCosts> PlanBook::gatherCosts() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!allgatherCosts_) {
    allgatherCosts_ = std::make_shared<const AllgatherCosts>(allgatherCosts(topology_, links_));
  }
  return allgatherCosts_;
}

double PlanBook::allgatherPredicted(AllgatherSchedule schedule, size_t bytes, bool reduceScatter) {
  return allgatherSeconds(schedule, *gatherCosts(), static_cast<double>(bytes), reduceScatter);
}

double PlanBook::alltoallBruckPredicted(size_t bytes) {
  return alltoallBruckSeconds(*gatherCosts(), static_cast<double>(bytes));
}

AlltoallSchedule PlanBook::alltoallSchedule() const {
  if (request_.alltoall) return *request_.alltoall;
  return topology_.size >= kBruckAlltoallRanks ? AlltoallSchedule::kBruck
                                               : AlltoallSchedule::kPairwise;
}

GatherSchedule PlanBook::gatherSchedule(size_t bytes) const {
  if (request_.gather) return *request_.gather;
  const int n = topology_.size;
  if (n < kGatherTreeRanks) return GatherSchedule::kLinear;
  // The subtree of v = 2^k holds min(2^k, P - 2^k) blocks; no other is larger.
  int largest = 1;
  for (int p = 1; p < n; p <<= 1) largest = std::max(largest, std::min(p, n - p));
  const bool fits = bytes <= kGatherTreeScratch / static_cast<size_t>(largest);
  return fits ? GatherSchedule::kTree : GatherSchedule::kLinear;
}

AllgatherSchedule PlanBook::allgatherSchedule(size_t bytes, bool reduceScatter) {
  const bool staged = !blockStages(false)->empty();
  const AllgatherSchedule rings = staged ? AllgatherSchedule::kGrid : AllgatherSchedule::kRing;
  if (request_.allgather) {
    switch (*request_.allgather) {
      case AllgatherSchedule::kGrid:
        return rings;
      case AllgatherSchedule::kGridBruck:
        return staged ? AllgatherSchedule::kGridBruck : AllgatherSchedule::kBruck;
      default:
        return *request_.allgather;
    }
  }
  if (bytes > kBruckMaxBytes || topology_.size <= 2) return rings;
  const std::shared_ptr<const AllgatherCosts> costs = gatherCosts();
  const double b = static_cast<double>(bytes);
  AllgatherSchedule best = rings;
  double cheapest = allgatherSeconds(rings, *costs, b, reduceScatter) * 0.999;
  std::vector<AllgatherSchedule> others{AllgatherSchedule::kBruck};
  if (staged) others.push_back(AllgatherSchedule::kGridBruck);
  for (AllgatherSchedule other : others) {
    // The model prices the grid's rings without their overlap across combinations: the
    // simulator finds them up to a third faster than priced (Sim.SmallAllgathersTakeBrucks...),
    // so Bruck level by level replaces them only where it is priced 20% cheaper.
    const double margin = other == AllgatherSchedule::kGridBruck ? 0.8 : 1.0;
    const double seconds = allgatherSeconds(other, *costs, b, reduceScatter) / margin;
    if (seconds < cheapest) {
      best = other;
      cheapest = seconds * 0.999;
    }
  }
  return best;
}

}  // namespace ddl
