#include "scenario.h"

#include <algorithm>
#include <cmath>

namespace ddl {
namespace {

// splitmix64: small, fast, and the same on every machine.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // [lo, hi]
  int between(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return uniform() < p; }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[next() % v.size()];
  }

 private:
  uint64_t state_;
};

std::string rankList(const std::vector<int>& ranks) {
  std::vector<int> r = ranks;
  std::sort(r.begin(), r.end());
  std::string s;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(r[i]) +
         (j > i ? "-" + std::to_string(r[j]) : std::string());
    i = j + 1;
  }
  return s;
}

// One op of a training step or around it. Large worlds keep to the ops whose messages grow as
// P log P at most (a flat all_gather of a thousand ranks is a million messages).
SimCall drawCall(Rng& rng, int ranks, uint64_t seed) {
  static const std::vector<std::string> any = {
      "allreduce", "allreduce",      "allreduce", "allreduce", "broadcast",
      "allgather", "reduce_scatter", "alltoall",  "barrier",   "reduce",
      "gather",    "scatter",        "sendrecv"};
  static const std::vector<std::string> large = {"allreduce", "allreduce", "allreduce", "broadcast",
                                                 "barrier",   "reduce",    "sendrecv"};
  SimCall call;
  call.collective = rng.pick(ranks > 128 ? large : any);
  if (call.collective == "alltoall" && ranks > 64) call.collective = "allreduce";
  call.seed = seed;
  call.root = rng.between(0, ranks - 1);
  static const std::vector<int> counts = {1, 2, 7, 31, 131, 1031, 4099, 16411, 65537};
  const bool blocks = call.collective == "allgather" || call.collective == "reduce_scatter" ||
                      call.collective == "gather" || call.collective == "scatter" ||
                      call.collective == "alltoall";
  call.count =
      blocks ? static_cast<size_t>(rng.between(1, 64)) : static_cast<size_t>(rng.pick(counts));
  if (call.collective == "barrier") call.count = 0;
  return call;
}

// Half the scenarios with an all_to_all run it by Bruck's rounds, which auto takes from 1 024
// ranks only, drawn from a stream of the seed's own (the rest of the scenario is unchanged).
void drawAlltoallSchedule(Scenario& s) {
  auto anAlltoall = [](const std::vector<SimCall>& calls) {
    return std::any_of(calls.begin(), calls.end(),
                       [](const SimCall& c) { return c.collective == "alltoall"; });
  };
  Rng schedules(s.seed ^ 0x3c6ef372fe94f82bull);
  if ((anAlltoall(s.ops) || anAlltoall(s.after)) && schedules.chance(0.5)) {
    s.alltoallBruck = true;
    s.cluster.plan = planRequest();
    s.cluster.plan->alltoall = AlltoallSchedule::kBruck;
  }
}

}  // namespace

const char* faultKindName(Fault::Kind kind) {
  switch (kind) {
    case Fault::Kind::kKill:
      return "kill";
    case Fault::Kind::kKillHost:
      return "host";
    case Fault::Kind::kKillRack:
      return "rack";
    case Fault::Kind::kCut:
      return "cut";
    case Fault::Kind::kPartition:
      return "partition";
    case Fault::Kind::kStall:
      return "stall";
    case Fault::Kind::kSlowRank:
      return "slow_rank";
    case Fault::Kind::kSlowLink:
      return "slow_link";
    case Fault::Kind::kDisagree:
      return "disagree";
  }
  return "?";
}

std::string Fault::describe() const {
  std::string s = faultKindName(kind);
  if (kind == Kind::kSlowLink) {
    s += " host " + std::to_string(host);
  } else {
    s += " " + rankList(ranks);
  }
  if (kind == Kind::kStall) {
    s += millis < 0 ? " for good" : " for " + std::to_string(static_cast<int>(millis)) + " ms";
  }
  if (kind == Kind::kSlowRank || kind == Kind::kSlowLink) {
    s += " x" + std::to_string(static_cast<int>(factor));
  }
  if (kind == Kind::kDisagree) s += " (" + how + ")";
  return s + " in op " + std::to_string(op) + " at " + std::to_string(static_cast<int>(micros)) +
         " us";
}

int Scenario::ranks() const {
  int ranks = 0;
  for (int h : cluster.hostSizes) ranks += h;
  return ranks;
}

std::string Scenario::describe() const {
  std::string s =
      std::to_string(ranks()) + " ranks on " + std::to_string(cluster.hostSizes.size()) + " hosts";
  if (cluster.hostsPerRack > 0) s += " (" + std::to_string(cluster.hostsPerRack) + " a rack)";
  if (cluster.sharedMemory) s += ", sharing memory within each";
  s += "; ops:";
  for (const SimCall& call : ops) s += " " + call.describe() + ";";
  s += " faults:";
  for (const Fault& f : faults) s += " " + f.describe() + ";";
  s += shrink ? " then shrink" : " then give up";
  if (firstOp != 0) s += "; ops numbered from " + std::to_string(firstOp);
  if (refuser >= 0) s += "; rank " + std::to_string(refuser) + "'s first shrink refused";
  if (lifecycle) s += "; then split, a failed op, destroy, split again";
  if (windows > 0) {
    s += "; first " + std::to_string(windows) + " window(s), " + std::to_string(windowRounds) +
         " rounds of " + std::to_string(windowFloats) + " floats, rank " +
         std::to_string(lateSignaler) + "'s signal of round " + std::to_string(lateRound) + " late";
  }
  if (twoGroups) s += "; every op also on a second group at once";
  if (!hostOps.empty()) {
    s += "; after each op, on each host's group, an allreduce of";
    for (const SimCall& call : hostOps) s += " " + std::to_string(call.count);
    s += " floats";
  }
  if (alltoallBruck) s += "; all_to_all by Bruck's rounds";
  if (slowReducer >= 0) {
    s += "; rank " + std::to_string(slowReducer) + " reduces " +
         std::to_string(static_cast<int>(slowReduction)) + "x slower";
  }
  if (hostile >= 0) {
    s += "; rank " + std::to_string(hostile) + " hostile in op " + std::to_string(hostileOp) + " (";
    const char* sends[] = {"replays", "call prints", "control", "data"};
    for (int bit = 0, listed = 0; bit < 4; ++bit) {
      if (hostileSends & (1 << bit)) s += std::string(listed++ ? ", " : "") + sends[bit];
    }
    s += ")";
  }
  if (slowStoreMicros > 0) {
    s += "; the store answers in " + std::to_string(static_cast<int>(slowStoreMicros)) +
         " us from the first op";
  }
  return s;
}

uint64_t scenarioSeed(uint64_t campaignSeed, uint64_t index) {
  Rng rng(campaignSeed * 0x2545f4914f6cdd1dull + index);
  return rng.next();
}

namespace {

constexpr size_t kHugeCount = 4099;  // the most floats a rank an op of a huge world carries

// The world's ranks: most worlds small, a few big (2 %: 129 - 1 024 ranks). A few (0.3 %) of
// 1 025 - 8 192, drawn apart from the rest (every other seed's world is as it was); their ops
// carry at most kHugeCount floats a rank, so that the buffers of a scenario's ops, kept until
// it ends, come to a few GB.
int drawRanks(Rng& rng, uint64_t seed, bool* huge) {
  constexpr int kMostRanks = 1024;
  constexpr double kBigShare = 0.02;
  constexpr int kHugeRanks = 8192;
  constexpr double kHugeShare = 0.003;
  int ranks;
  const double size = rng.uniform();
  if (size < kBigShare) {
    ranks = static_cast<int>(
        std::exp(std::log(129.0) + rng.uniform() * (std::log(kMostRanks + 1.0) - std::log(129.0))));
  } else if (size < 0.3) {
    ranks = rng.between(33, 128);
  } else {
    ranks = rng.between(4, 32);
  }
  ranks = std::clamp(ranks, 4, kMostRanks);
  Rng apart(seed ^ 0xbb67ae8584caa73bull);
  *huge = apart.uniform() < kHugeShare;
  if (!*huge) return ranks;
  ranks = static_cast<int>(
      std::exp(std::log(kMostRanks + 1.0) +
               apart.uniform() * (std::log(kHugeRanks + 1.0) - std::log(kMostRanks + 1.0))));
  return std::clamp(ranks, kMostRanks + 1, kHugeRanks);
}

// One fault of a scenario over `ranks` ranks in hosts starting at hostStart (and ending at its
// last entry), racks of hostsPerRack hosts (0: none), striking in one of `ops` ops.
Fault drawFault(Rng& rng, int ranks, const std::vector<int>& hostStart, int hostsPerRack, int racks,
                int ops) {
  const int hosts = static_cast<int>(hostStart.size()) - 1;
  Fault f;
  f.kind = static_cast<Fault::Kind>(rng.between(0, kFaultKinds - 1));
  if (f.kind == Fault::Kind::kKillRack && racks < 2) f.kind = Fault::Kind::kKillHost;
  if (f.kind == Fault::Kind::kKillHost && hosts < 2) f.kind = Fault::Kind::kKill;
  f.op = rng.between(0, ops - 2);
  f.micros = rng.between(0, 300);
  const int rank = rng.between(0, ranks - 1);
  switch (f.kind) {
    case Fault::Kind::kKill:
    case Fault::Kind::kSlowRank:
      f.ranks = {rank};
      f.factor = rng.between(2, 20);
      break;
    case Fault::Kind::kKillHost: {
      const int h = rng.between(0, hosts - 1);
      for (int r = hostStart[h]; r < hostStart[h + 1]; ++r) f.ranks.push_back(r);
      break;
    }
    case Fault::Kind::kKillRack: {
      const int k = rng.between(0, racks - 1);
      const int first = k * hostsPerRack;
      const int last = std::min(hosts, first + hostsPerRack);
      for (int r = hostStart[first]; r < hostStart[last]; ++r) f.ranks.push_back(r);
      break;
    }
    case Fault::Kind::kCut:
      f.ranks = {rank, (rank + rng.between(1, ranks - 1)) % ranks};
      break;
    case Fault::Kind::kPartition: {
      // A block of hosts (a switch's worth) or ranks drawn at random.
      if (rng.chance(0.5)) {
        const int first = rng.between(0, ranks - 1), length = rng.between(1, ranks - 1);
        for (int k = 0; k < length; ++k) f.ranks.push_back((first + k) % ranks);
      } else {
        for (int r = 0; r < ranks; ++r) {
          if (rng.chance(0.5)) f.ranks.push_back(r);
        }
        if (f.ranks.empty() || static_cast<int>(f.ranks.size()) == ranks) f.ranks = {rank};
      }
      std::sort(f.ranks.begin(), f.ranks.end());
      break;
    }
    case Fault::Kind::kStall:
      f.ranks = {rank};
      f.millis = rng.pick(std::vector<double>{300, 3500, -1});
      break;
    case Fault::Kind::kSlowLink:
      f.host = rng.between(0, hosts - 1);
      f.factor = rng.between(2, 20);
      break;
    case Fault::Kind::kDisagree:
      f.ranks = {rank};
      f.how = rng.pick(std::vector<std::string>{"collective", "size", "dtype", "root"});
      break;
  }
  return f;
}

// Shared memory on the hosts, in half the worlds of up to 64 ranks: the paths of one host's
// ranks (staged, in one step, the caller's quick path, the rings through slots). And host
// groups, in half of those whose hosts have two ranks or more: after each op, an allreduce small
// enough for one step on each host's group. From a generator of their own (every other path's
// draws, the slow store last, stay as they were).
void drawSharedMemory(Scenario& s, int ranks, int ops) {
  Rng shared(s.seed ^ 0xc2b2ae3d27d4eb4full);
  s.cluster.sharedMemory = ranks <= 64 && shared.chance(0.5);
  const auto& sizes = s.cluster.hostSizes;
  if (!s.cluster.sharedMemory || *std::max_element(sizes.begin(), sizes.end()) < 2 ||
      !shared.chance(0.5)) {
    return;
  }
  for (int i = 0; i < ops; ++i) {
    SimCall call;
    call.count = static_cast<size_t>(shared.pick(std::vector<int>{1, 7, 131, 1031, 4099}));
    call.seed = s.seed + 200 + static_cast<uint64_t>(i);
    s.hostOps.push_back(call);
  }
}

// The paths a scenario takes besides its faults (counters near a wrap, refused retries, group
// lifecycles, windows, a second group, all_to_all schedules, slow reductions, a hostile rank),
// drawn from a generator of their own so that adding one leaves the machine, ops and faults of
// every seed as they were.
void drawPaths(Scenario& s, int ranks, int ops, bool slowStore) {
  Rng paths(s.seed ^ 0x9e3779b97f4a7c15ull);
  // Long runs: ops numbered from just before a wrap, a third of the time.
  const double wrap = paths.uniform();
  if (wrap < 1.0 / 6) {
    s.firstOp = (uint64_t{1} << 16) - static_cast<uint64_t>(paths.between(1, 4));
  } else if (wrap < 1.0 / 3) {
    s.firstOp = (uint64_t{1} << 32) - static_cast<uint64_t>(paths.between(1, 4));
  }
  // Retries: a quarter of the shrinks begin with one rank's call refused.
  if (s.shrink && paths.chance(0.25)) s.refuser = paths.between(0, ranks - 1);
  s.lifecycle = s.shrink && paths.chance(0.3);
  if (ranks <= 64 && paths.chance(1.0 / 3)) {
    s.windows = paths.chance(0.5) ? 2 : 1;
    s.windowRounds = paths.between(3, 6);
    s.windowFloats = static_cast<size_t>(paths.pick(std::vector<int>{1, 7, 64}));
    s.lateSignaler = paths.between(0, ranks - 1);
    s.lateRound = paths.between(0, s.windowRounds - 2);
  }
  s.twoGroups = ranks <= 128 && paths.chance(0.2);
  drawAlltoallSchedule(s);
  if (paths.chance(0.15)) {
    s.slowReducer = paths.between(0, ranks - 1);
    s.slowReduction = std::exp(std::log(1e3) + paths.uniform() * (std::log(1e5) - std::log(1e3)));
  }
  if (ranks <= 128 && paths.chance(0.2)) {
    s.hostile = paths.between(0, ranks - 1);
    s.hostileOp = paths.between(0, ops - 1);
    s.hostileSends = paths.between(1, 15);
  }
  if (slowStore && paths.chance(0.5)) {
    s.slowStoreMicros = (0.5e6 + paths.uniform() * 3.5e6) / ranks;
  }
  drawSharedMemory(s, ranks, ops);
}

}  // namespace

Scenario drawScenario(uint64_t seed, bool slowStore) {
  Rng rng(seed);
  Scenario s;
  s.seed = seed;
  // The machine: its ranks; hosts of uneven sizes; racks half the time.
  bool huge = false;
  const int ranks = drawRanks(rng, seed, &huge);
  const int perHost = rng.pick(std::vector<int>{1, 2, 4, 4, 8});
  const bool uneven = rng.chance(0.3);
  for (int left = ranks; left > 0;) {
    int h = std::min(left, uneven ? rng.between(1, perHost) : perHost);
    s.cluster.hostSizes.push_back(h);
    left -= h;
  }
  const int hosts = static_cast<int>(s.cluster.hostSizes.size());
  s.cluster.hostsPerRack =
      hosts >= 4 && rng.chance(0.5) ? rng.between(2, std::min(8, hosts / 2)) : 0;
  s.cluster.links = kSimulatedLinks;
  s.cluster.timeout = std::chrono::milliseconds(10000);
  s.cluster.payload = true;
  // The ops: a few, the faults striking in them.
  const int ops = rng.between(2, 5);
  for (int i = 0; i < ops; ++i) s.ops.push_back(drawCall(rng, ranks, seed + 1 + i));
  // The faults: one most of the time, sometimes two or three at once.
  const int faults = rng.chance(0.8) ? 1 : rng.between(2, 3);
  std::vector<int> hostStart(hosts + 1, 0);
  for (int h = 0; h < hosts; ++h) hostStart[h + 1] = hostStart[h] + s.cluster.hostSizes[h];
  const int racks = s.cluster.hostsPerRack > 0
                        ? (hosts + s.cluster.hostsPerRack - 1) / s.cluster.hostsPerRack
                        : 1;
  for (int i = 0; i < faults; ++i) {
    s.faults.push_back(drawFault(rng, ranks, hostStart, s.cluster.hostsPerRack, racks, ops));
  }
  s.shrink = rng.chance(0.85);
  const int after = ranks > 128 ? 2 : 3;
  for (int i = 0; i < after; ++i) s.after.push_back(drawCall(rng, ranks, seed + 100 + i));
  if (huge) {
    for (SimCall& call : s.ops) call.count = std::min(call.count, kHugeCount);
    for (SimCall& call : s.after) call.count = std::min(call.count, kHugeCount);
  }
  drawPaths(s, ranks, ops, slowStore);
  return s;
}

}  // namespace ddl
