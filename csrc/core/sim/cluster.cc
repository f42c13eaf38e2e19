#include "cluster.h"

#include <algorithm>
#include <map>

#include "../base/types.h"
#include "../runtime/stats.h"
#include "../runtime/status.h"

namespace ddl {

// The job's store, in memory, as one server: every request counted and served in the order
// they come (ClusterSpec::storeMicros); the rank that asks (the rank being turned, or the one
// whose creation begins: asking()) waits for an answer, not for a set. A key a rank reads must have
// been set already (creation reads only keys of lower ranks, which the cluster creates first).
class SimCluster::Store : public KeyValueStore {
 public:
  Store(SimNetwork& network, const ClusterSpec& spec)
      : network_(network),
        answered_(nanos(spec.storeMicros)),
        set_(nanos(spec.storeSetMicros)),
        perKey_(nanos(spec.storeKeyMicros)) {}
  void asking(int rank) { asking_ = rank; }
  void answerIn(double micros) { answered_ = nanos(micros); }
  void set(const std::string& key, const std::string& value) override {
    serve(1, false);
    values_[key] = value;
  }
  std::string get(const std::string& key) override {
    serve();
    auto it = values_.find(key);
    if (it == values_.end()) {
      throw Error("ddl: simulated store: '" + key + "' was read before any rank set it");
    }
    return it->second;
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    serve(keys.size());
    std::vector<std::string> values;
    for (const std::string& key : keys) {
      auto it = values_.find(key);
      if (it == values_.end()) {
        throw Error("ddl: simulated store: '" + key + "' was read before any rank set it");
      }
      values.push_back(it->second);
    }
    return values;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    serve();
    auto it = values_.find(key);
    const int64_t sum = (it == values_.end() ? 0 : std::stoll(it->second)) + delta;
    values_[key] = std::to_string(sum);
    return sum;
  }
  uint64_t nextGroupNumber() override {
    serve();
    return groups_++;
  }
  uint64_t requests() const { return requests_; }

 private:
  static std::chrono::nanoseconds nanos(double micros) {
    return std::chrono::nanoseconds(static_cast<int64_t>(micros * 1e3));
  }
  void serve(size_t keys = 1, bool answered = true) {
    ++requests_;
    const int rank = network_.turning() >= 0 ? network_.turning() : asking_;
    if (rank < 0) return;
    const TimePoint asked = network_.timeOf(rank);
    const auto extra = perKey_ * static_cast<int64_t>(keys > 0 ? keys - 1 : 0);
    freeAt_ = std::max(freeAt_, asked) + (answered ? answered_ + extra : set_);
    if (answered) network_.waitUntil(rank, freeAt_);
  }
  SimNetwork& network_;
  std::chrono::nanoseconds answered_;
  const std::chrono::nanoseconds set_, perKey_;
  TimePoint freeAt_{};
  int asking_ = -1;
  std::map<std::string, std::string> values_;
  uint64_t requests_ = 0;
  uint64_t groups_ = 0;
};

SimCluster::SimCluster(const ClusterSpec& spec) : spec_(spec) {
  std::vector<int> hostSizes = spec.hostSizes;
  if (hostSizes.empty()) {
    if (spec.ranks < 1 || spec.ranksPerHost < 1) {
      throw Error("ddl: a simulated cluster needs at least one rank and one rank per host");
    }
    for (int left = spec.ranks; left > 0; left -= spec.ranksPerHost) {
      hostSizes.push_back(std::min(left, spec.ranksPerHost));
    }
  }
  SimNetworkSpec layout;
  for (size_t h = 0; h < hostSizes.size(); ++h) {
    if (hostSizes[h] < 1) throw Error("ddl: a simulated host needs at least one rank");
    for (int i = 0; i < hostSizes[h]; ++i) layout.hostOf.push_back(static_cast<int>(h));
    layout.rackOf.push_back(spec.hostsPerRack > 0 ? static_cast<int>(h) / spec.hostsPerRack : 0);
  }
  links_ = parseLinks(spec.links);
  for (int level = 0; level < 3; ++level) {
    const LinkCost& cost = links_.at(level);
    layout.levels.push_back(SimLevel{cost.latency, cost.bandwidth, cost.overhead});
  }
  layout.payload = spec.payload;
  layout.windows = spec.sharedMemory && spec.payload;
  const int racks = layout.rackOf.back() + 1;
  if (spec.hostsPerRack > 0 && racks > 1) {
    std::vector<std::string> entries(racks);
    for (size_t h = 0; h < hostSizes.size(); ++h) {
      entries[layout.rackOf[h]] += " host" + std::to_string(h);
    }
    for (int k = 0; k < racks; ++k) {
      rackMap_ += (k ? ";" : "") + ("rack" + std::to_string(k) + ":") + entries[k];
    }
  }
  const int n = static_cast<int>(layout.hostOf.size());
  for (int r = 0; r < n; ++r) {
    Locality l;
    l.hostName = "host" + std::to_string(layout.hostOf[r]);
    l.machineKey = "simulated/" + l.hostName;
    localities_.push_back(l);
  }
  network_ = std::make_unique<SimNetwork>(std::move(layout));
  memory_ = std::make_unique<SimMemory>(*network_, spec.payload, spec.reduceBandwidth,
                                        spec.copyBandwidth);
  store_ = std::make_shared<Store>(*network_, spec);
  comms_.resize(n);
  settings_ = config();
  settings_.traceFile.clear();
  for (int r = 0; r < n; ++r) {
    clocks_.push_back(std::make_unique<SimClock>(*network_, r));
    engines_.push_back(std::make_unique<Engine>(network_->join(r), Engine::Drive::kExternal,
                                                *clocks_.back(), memory_.get(), &settings_));
    SimNetwork* network = network_.get();
    engines_.back()->setWakeHook([network, r] { network->wake(r, network->now()); });
    engines_.back()->letCallersHoldTurn();  // calls come between events (the quick path's)
    // A lookup at the store charges the rank the store's answer; its beats go on meanwhile.
    engines_.back()->runtime().setOutsideRunner(
        [network](const auto& call, const auto& meanwhile, std::chrono::milliseconds every) {
          network->waitingFor(call, meanwhile, every);
        });
  }
  network_->setTurn([this](int r) {
    Engine& engine = *engines_[r];
    // A rank whose work charges its clock (a slow reduction) is turned again after a slice of
    // it, once what arrived meanwhile was delivered: its beats and messages are taken in the
    // meantime, as a progress thread that yields every slice takes them.
    const TimePoint now = engine.runtime().clock().now();
    if (!engine.settle(now + Op::kTurnSlice)) return engine.runtime().clock().now();
    return engine.nextTimer();
  });
}

SimCluster::~SimCluster() {
  comms_.clear();
  engines_.clear();  // each fails what it still runs
}

uint64_t SimCluster::storeRequests() const { return store_->requests(); }

void SimCluster::slowStore(double micros) { store_->answerIn(micros); }

void SimCluster::carryPayload(bool on) {
  if (!on && network_->spec().windows) {
    throw Error("ddl: a simulated cluster with shared memory carries the payload throughout");
  }
  network_->carryPayload(on);
  memory_->carryPayload(on);
}

int SimCluster::maxEndpoints() const {
  int most = 0;
  for (int r = 0; r < size(); ++r) most = std::max(most, network_->endpoints(r));
  return most;
}

uint64_t SimCluster::quickOps() const {
  uint64_t ops = 0;
  for (const auto& engine : engines_) ops += engine->runtime().stats().quickOps();
  return ops;
}

uint64_t SimCluster::handedOps() const {
  uint64_t ops = 0;
  for (const auto& engine : engines_) ops += engine->runtime().stats().handedOps();
  return ops;
}

void SimCluster::createGroup() {
  const int n = size();
  std::vector<std::unique_ptr<Creation>> pending(n);
  // The planner prices reductions at the rate the simulated ranks reduce.
  std::string groupLinks = spec_.links;
  if (spec_.reduceBandwidth > 0) {
    groupLinks += (groupLinks.empty() ? "" : ",") + std::string("reduce:") +
                  std::to_string(spec_.reduceBandwidth / 1e6) + "MB";
  }
  for (int r = 0; r < n; ++r) {
    GroupOptions options;
    options.timeout = spec_.timeout;
    options.locality = localities_[r];
    options.identity = "";  // the ranks share one process: none is watched
    options.racks = rackMap_;
    options.links = groupLinks;
    // The simulated transport maps no shared-memory windows: host rings run over messages from
    // the first op, where a real process that cannot map them would try once and go on so.
    options.plan = spec_.plan ? *spec_.plan : planRequest();
    options.plan->hostSlots = false;
    store_->asking(r);
    pending[r] = Creation::begin(*engines_[r], store_, r, n, options);
  }
  store_->asking(-1);
  size_t done = 0;  // ranks before it have finished the exchange
  network_->run(
      [&] {
        while (done < pending.size() && pending[done]->work()->done()) ++done;
        return done == pending.size();
      },
      network_->now() + spec_.timeout + std::chrono::seconds(1));
  for (int r = 0; r < n; ++r) {
    if (!pending[r]->work()->done()) {
      throw Error("ddl: simulated rank " + std::to_string(r) +
                  " did not finish creating the group");
    }
    comms_[r] = pending[r]->finish();
  }
  // What comes next starts once every rank is done creating (a rank's last turn may have taken
  // it past the event that ended it: waiting for the store).
  TimePoint latest = network_->now();
  for (int r = 0; r < n; ++r) {
    if (!network_->dead(r)) latest = std::max(latest, network_->timeOf(r));
  }
  network_->advanceTo(latest);
}

std::vector<Communicator*> SimCluster::members() {
  std::vector<Communicator*> all(comms_.size());
  for (size_t r = 0; r < comms_.size(); ++r) all[r] = comms_[r].get();
  return all;
}

bool SimCluster::runUntil(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  return network_->run(done, network_->now() + limit);
}

SimCluster::Outcome SimCluster::run(const Start& start, std::chrono::milliseconds limit) {
  return run(members(), start, limit);
}

SimCluster::Outcome SimCluster::run(const std::vector<Communicator*>& comms, const Start& start,
                                    std::chrono::milliseconds limit) {
  const int n = size();
  Outcome outcome;
  outcome.began = network_->now();
  outcome.ended.resize(n);
  outcome.errors.resize(n);
  outcome.statuses.resize(n);
  std::vector<std::shared_ptr<Work>> works(n);
  // The hooks may run after this returns (a dead rank's op ends when its engine is destroyed).
  auto ended = std::make_shared<std::vector<std::optional<TimePoint>>>(n);
  auto running = std::make_shared<int>(0);  // ops started and not ended
  for (int r = 0; r < n; ++r) {
    if (network_->dead(r) || comms[r] == nullptr) continue;
    CallOptions options;
    options.work = std::make_shared<Work>("simulated op");
    SimNetwork* network = network_.get();
    options.work->setCompletionHook([network, ended, running, r] {
      (*ended)[r] = network->timeOf(r);
      --*running;
    });
    works[r] = start(r, *comms[r], options);
    if (works[r]) ++*running;
  }
  // Checked after every event: a count, and while no more ops run than ranks have died (the dead
  // never end theirs), a look at the dead: whether every op still running is a dead rank's. (A
  // look at every rank there was O(P) an event, as the last ops of a group that lost a host ran
  // out: at 65 536 ranks nearly all of a shrunk group's all_gather.)
  int holding = 0;
  auto allEnded = [&] {
    if (look_ && network_->now() >= lookWhen_) {
      std::function<void()> look = std::move(look_);
      look_ = nullptr;
      look();
    }
    if (!waitFor) {
      if (*running > network_->deaths()) return false;
      int deadRunning = 0;
      for (int r : network_->deadRanks()) deadRunning += works[r] && !works[r]->done() ? 1 : 0;
      return *running == deadRunning;
    }
    // From the first rank that held the run up when last looked: a rank that no longer does
    // never will again (an op ends once, the dead stay dead, and waitFor lets go of a rank for
    // good), and a look at every rank was O(P) an event.
    for (; holding < n; ++holding) {
      const int r = holding;
      if (works[r] && !works[r]->done() && !network_->dead(r) && (!waitFor || waitFor(r))) {
        return false;
      }
    }
    return true;
  };
  outcome.finished = network_->run(allEnded, outcome.began + limit);
  outcome.ended = *ended;
  for (int r = 0; r < n; ++r) {
    if (works[r] && works[r]->done()) {
      outcome.statuses[r] = works[r]->status();
      if (works[r]->failed()) outcome.errors[r] = works[r]->error();
    }
  }
  return outcome;
}

std::vector<std::string> SimCluster::statusRows() {
  std::vector<std::string> rows;
  for (int r = 0; r < size(); ++r) {
    const char* state = network_->dead(r) ? "dead" : network_->stalled(r) ? "stopped" : "ok";
    std::string row = "{\"rank\": " + std::to_string(r) +
                      ", \"host\": " + jsonString(localities_[r].hostName) + ", \"state\": \"" +
                      state + "\"";
    if (std::string(state) == "ok") {
      Runtime& runtime = engines_[r]->runtime();
      row += ", \"answer\": {\"active_ops\": " + std::to_string(runtime.activeOps()) +
             ", \"in_flight\": \"simulated\", " + inFlightJson(runtime) +
             ", \"stats\": " + runtime.stats().json(runtime.clock().now()) + "}";
    }
    rows.push_back(row + "}");
  }
  return rows;
}

std::set<uint32_t> SimCluster::Shrink::ids() const {
  std::set<uint32_t> ids;
  for (const auto& g : groups) {
    if (g) ids.insert(g->id());
  }
  return ids;
}

std::vector<Communicator*> SimCluster::Shrink::members() const {
  std::vector<Communicator*> members;
  for (const auto& g : groups) members.push_back(g.get());
  return members;
}

int SimCluster::Shrink::size() const {
  for (const auto& g : groups) {
    if (g) return g->size();
  }
  return 0;
}

void SimCluster::awaitDerivations(const std::vector<std::unique_ptr<Derivation>>& pending,
                                  std::chrono::milliseconds limit) {
  size_t holding = 0;  // as in run(): the ranks before it hold nothing up, for good
  runUntil(
      [&] {
        for (; holding < pending.size(); ++holding) {
          const bool waited = !waitFor || waitFor(static_cast<int>(holding));
          if (pending[holding] && waited && !pending[holding]->work()->done()) return false;
        }
        return true;
      },
      limit);
}

SimCluster::Shrink SimCluster::shrink(std::vector<bool> trying, std::chrono::milliseconds limit,
                                      int refuser) {
  const int n = size();
  Shrink result;
  result.groups.resize(n);
  for (int attempt = 0; attempt < Shrink::kAttempts; ++attempt) {
    if (attempt > 0) runUntil([] { return false; }, std::chrono::milliseconds(100));  // news
    bool again = false;
    std::vector<std::unique_ptr<Derivation>> pending(n);
    std::vector<std::vector<int>> asked(n);  // the ranks each rank excludes (ascending)
    for (int r = 0; r < n; ++r) {
      if (!trying[r]) continue;
      try {
        asked[r] = comm(r).goneRanks();
        if (attempt == 0 && r == refuser) {
          std::vector<int> wrong = asked[r];
          wrong.push_back(comm(r).rank());
          try {
            (void)Derivation::shrink(comm(r), wrong);
          } catch (const Error& e) {
            result.lastError = "rank " + std::to_string(r) + ": " + e.what();
            again = true;  // it calls again, rightly
            continue;
          }
        }
        pending[r] = Derivation::shrink(comm(r), asked[r]);
      } catch (const Error& e) {
        trying[r] = false;  // no quorum, or arguments refused: this rank gives up
        result.lastError = "rank " + std::to_string(r) + ": " + e.what();
      }
    }
    awaitDerivations(pending, limit);
    for (int r = 0; r < n; ++r) {
      if (!pending[r]) continue;
      if (!pending[r]->work()->done()) {
        result.unfinished.push_back(r);
        trying[r] = false;
        continue;
      }
      try {
        result.groups[r] = pending[r]->finish();
        trying[r] = false;
        if (result.ranks.empty()) {
          const std::vector<int> left = asked[r];
          for (int q = 0; q < n; ++q) {
            if (!std::binary_search(left.begin(), left.end(), q)) result.ranks.push_back(q);
          }
        }
      } catch (const Error& e) {
        result.lastError = "rank " + std::to_string(r) + ": " + e.what();
        // Views that differ, a peer found gone, or a rank that refused its arguments (told
        // here): the job calls again.
        trying[r] = e.kind() == StatusKind::kMismatch || e.kind() == StatusKind::kPeerLost ||
                    e.kind() == StatusKind::kInvalidArgument;
        again = again || trying[r];
      }
    }
    result.attempts = attempt + 1;
    if (!again) break;
  }
  return result;
}

std::vector<std::shared_ptr<Communicator>> SimCluster::split(const std::vector<Communicator*>& of,
                                                             std::chrono::milliseconds limit,
                                                             std::string* error,
                                                             const std::vector<int>& ranks) {
  const int n = size();
  std::vector<std::unique_ptr<Derivation>> pending(n);
  std::vector<std::shared_ptr<Communicator>> groups(n);
  for (int r = 0; r < n; ++r) {
    if (of[r] == nullptr || network_->dead(r)) continue;
    std::vector<int> all = ranks;
    for (int k = 0; ranks.empty() && k < of[r]->size(); ++k) all.push_back(k);
    try {
      pending[r] = Derivation::split(*of[r], all);
    } catch (const Error& e) {
      *error = "rank " + std::to_string(r) + ": " + e.what();
    }
  }
  awaitDerivations(pending, limit);
  for (int r = 0; r < n; ++r) {
    if (!pending[r] || !pending[r]->work()->done()) continue;
    try {
      groups[r] = pending[r]->finish();
    } catch (const Error& e) {
      *error = "rank " + std::to_string(r) + ": " + e.what();
    }
  }
  return groups;
}

}  // namespace ddl
