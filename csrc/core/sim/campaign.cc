#include "campaign.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "../base/tag.h"
#include "host_groups.h"
#include "paths.h"

namespace ddl {
namespace {

using Wall = std::chrono::steady_clock;

class Run {
 public:
  explicit Run(const Scenario& s) : s_(s), cluster_(s.cluster) {
    result_.seed = s.seed;
    result_.description = s.describe();
    result_.ranks = cluster_.size();
  }

  ScenarioResult go() {
    if (s_.hostile >= 0) cluster_.network().record(s_.hostile);
    cluster_.createGroup();
    const int n = cluster_.size();
    for (int r = 0; r < n; ++r) cluster_.comm(r).startSequenceAt(s_.firstOp);
    if (s_.slowReducer >= 0) cluster_.network().slowReductions(s_.slowReducer, s_.slowReduction);
    if (s_.slowStoreMicros > 0) cluster_.slowStore(s_.slowStoreMicros);
    if (s_.windows > 0) {
      windows_ = std::make_unique<WindowRounds>(cluster_, s_);
      const WindowRounds::Broken broken = windows_->run();
      if (!broken.hang.empty()) broke(result_.hang, broken.hang);
      if (!broken.wrong.empty()) broke(result_.wrong, broken.wrong);
      if (!broken.unnamed.empty()) broke(result_.unnamed, broken.unnamed);
      result_.earlySignals = broken.earlySignals;
    }
    if (s_.twoGroups) secondGroup();
    if (!s_.hostOps.empty()) {
      const std::string why = hostGroups_.form(cluster_, s_.cluster.timeout + kGrace);
      if (!why.empty()) broke(result_.split, why);
    }
    if (result_.failed()) {
      result_.digest = cluster_.network().digest();
      return result_;
    }
    cluster_.waitFor = [this](int r) { return !frozen_.count(r); };
    std::vector<Communicator*> members = cluster_.members();
    const uint64_t noticeSlot = tag::slot(tag::kControlPhase, tag::kNoticeStep);
    const uint64_t abortSlot = tag::slot(tag::kControlPhase, tag::kAgreementAbortStep);
    auto failureMessages = [&] {
      return cluster_.network().messagesOfSlot(noticeSlot) +
             cluster_.network().messagesOfSlot(abortSlot);
    };
    const uint64_t messagesBefore = failureMessages();
    for (size_t i = 0; i < s_.ops.size(); ++i) {
      strike(static_cast<int>(i));
      runOp(members, s_.ops[i], static_cast<int>(i), "op " + std::to_string(i), nullptr,
            s_.twoGroups ? &second_ : nullptr);
      for (const auto& host : hostGroups_.groups()) {
        runOp(rawMembers(host), s_.hostOps[i], static_cast<int>(i),
              "a host's op " + std::to_string(i));
      }
    }
    checkNews();
    if (s_.shrink) shrink();
    result_.failureMessages = failureMessages() - messagesBefore;
    // Faults that cost messages (slowness none), each stalling an op of every group running,
    // reported there (up to 64 ranks, each rank's halfway wait report reaches every rank).
    const auto costly = std::count_if(struck_.begin(), struck_.end(), [](const Fault& f) {
      return f.kind != Fault::Kind::kSlowRank && f.kind != Fault::Kind::kSlowLink;
    });
    const double budget = 20.0 * n * std::log2(std::max(n, 2)) * std::max<double>(costly, 1) *
                          ((s_.twoGroups ? 2 : 1) + (s_.hostOps.empty() ? 0 : 1));
    if (static_cast<double>(result_.failureMessages) > budget) {
      broke(result_.overBudget, std::to_string(result_.failureMessages) +
                                    " failure messages, over 20 P log2 P a fault and group (" +
                                    std::to_string(static_cast<uint64_t>(budget)) + ")");
    }
    result_.maxEndpoints = cluster_.maxEndpoints();
    result_.quickOps = cluster_.quickOps();
    result_.handedOps = cluster_.handedOps();
    bool everyone = false;  // an op that talks to every rank
    for (const std::vector<SimCall>* calls : {&s_.ops, &s_.after}) {
      for (const SimCall& c : *calls) {
        everyone |=
            c.collective == "alltoall" || c.collective == "gather" || c.collective == "scatter";
      }
    }
    // A group's: heartbeats and news both ways at distances 2^k, a tree, recursive doubling and
    // the agreements' successors (5 log2 P), a grid's row and column (2 sqrt P), and the
    // multidimensional rings: two neighbours a lane, colour and level, where a rank alone on its
    // host carries every lane of its host's level (16 times the largest host). The group a
    // shrink forms numbers its ranks anew and has as many again.
    const double log2n = std::ceil(std::log2(std::max(n, 2)));
    const int largestHost =
        *std::max_element(s_.cluster.hostSizes.begin(), s_.cluster.hostSizes.end());
    const int groups = result_.groups > 0 ? 2 : 1;
    const int endpoints = everyone
                              ? n
                              : groups * static_cast<int>(5 * log2n + 2 * std::ceil(std::sqrt(n)) +
                                                          16 * largestHost + 8);
    if (result_.maxEndpoints > endpoints) {
      broke(result_.overBudget, "a rank opened " + std::to_string(result_.maxEndpoints) +
                                    " endpoints, over " + std::to_string(endpoints));
    }
    if (cluster_.network().strayPuts() > 0) {
      broke(result_.wrong, std::to_string(cluster_.network().strayPuts()) +
                               " puts landed in memory a window had let go");
    }
    result_.digest = cluster_.network().digest();
    return result_;
  }

 private:
  void broke(bool& flag, const std::string& why) {
    flag = true;
    if (result_.why.empty()) result_.why = why;
  }

  // The faults of op `i`, at their times after it starts.
  void strike(int i) {
    const bool pointToPoint = s_.ops[i].collective == "sendrecv";
    SimNetwork& net = cluster_.network();
    const TimePoint start = net.now();
    disagree_.clear();
    if (s_.hostile >= 0 && s_.hostileOp == i && !dead_.count(s_.hostile)) {
      sendHostile(cluster_, s_, &hostileRequests_);
      hostileStruck_ = true;
    }
    for (const Fault& f : s_.faults) {
      if (f.op != i) continue;
      const TimePoint at = after(start, f.micros);
      struck_.push_back(f);
      switch (f.kind) {
        case Fault::Kind::kKill:
        case Fault::Kind::kKillHost:
        case Fault::Kind::kKillRack:
          net.kill(f.ranks, at);
          for (int r : f.ranks) {
            if (dead_.insert(r).second) killedAt_[r] = at;
          }
          break;
        case Fault::Kind::kCut:
          net.cut(f.ranks[0], f.ranks[1], at);
          cutOff_ = true;
          break;
        case Fault::Kind::kPartition:
          net.partition(f.ranks, at);
          cutOff_ = true;
          break;
        case Fault::Kind::kStall:
          net.stall(f.ranks[0], at, f.millis < 0 ? TimePoint::max() : after(at, f.millis * 1000));
          if (f.millis < 0) frozen_.insert(f.ranks[0]);
          stalled_.insert(f.ranks[0]);
          break;
        case Fault::Kind::kSlowRank:
          net.slow(f.ranks[0], f.factor);
          break;
        case Fault::Kind::kSlowLink:
          net.slowLink(f.host, f.factor);
          break;
        case Fault::Kind::kDisagree:
          disagree_[f.ranks[0]] = f.how;
          pointToPointDisagreed_ |= pointToPoint;
          break;
      }
    }
  }

  // Whether a failure of rank r with `status` names a fault that struck by now. `clusterOf`
  // maps the group's ranks, which the status names, to the cluster's.
  bool names(int r, const Status& status, const std::vector<int>& clusterOf) const {
    const StatusKind k = status.kind;
    // Whether the ranks (or all but them) hold r or a rank the status names, by a map of the
    // cluster (a search of each named rank among a partition's side was O(P^2) a rank).
    auto meets = [&](const std::vector<int>& ranks, bool allBut = false) {
      std::vector<char> in(cluster_.size(), allBut);
      for (int x : ranks) in[x] = !allBut;
      auto held = [&](int q) { return q >= 0 && q < static_cast<int>(clusterOf.size()); };
      return in[r] || std::any_of(status.ranks.begin(), status.ranks.end(), [&](int q) {
               return held(q) && clusterOf[q] >= 0 && in[clusterOf[q]];
             });
    };
    for (const Fault& f : struck_) {
      switch (f.kind) {
        case Fault::Kind::kKill:
        case Fault::Kind::kKillHost:
        case Fault::Kind::kKillRack:
          if (k == StatusKind::kPeerLost && meets(f.ranks)) return true;
          break;
        case Fault::Kind::kCut:
        case Fault::Kind::kPartition:
        case Fault::Kind::kStall: {
          // Found by the heartbeats (a peer lost on the other side, or this rank counted gone
          // by the others) or by a timeout, whose waits may lead through ranks not at fault.
          if (k == StatusKind::kTimeout) return true;
          const bool otherSide = f.kind == Fault::Kind::kPartition && among(f.ranks, r);
          if ((k == StatusKind::kPeerLost || k == StatusKind::kPartitioned) &&
              meets(f.ranks, otherSide)) {
            return true;
          }
          // News from a witness this fault kept from the rank it counts gone (a rank cut off,
          // then heard again from the other side, passes on what it counted there).
          if (k == StatusKind::kPeerLost && keptFromWitness(f, status, clusterOf)) return true;
          break;
        }
        case Fault::Kind::kDisagree:
          if (k == StatusKind::kMismatch || k == StatusKind::kInvalidArgument) return true;
          // Sends and receives carry no call to compare: a collective called against them
          // waits out its timeout, naming the ranks that never started it.
          if (k == StatusKind::kTimeout && pointToPointDisagreed_) return true;
          break;
        case Fault::Kind::kSlowRank:
        case Fault::Kind::kSlowLink:
          break;
      }
    }
    // What a hostile peer sent fails an op naming it (among the ranks, or in the words), or the
    // next op on every rank where only some counted it a mismatch; a member left out of a shrink
    // (leftOut_) is named rightly.
    auto named = [&](int q) { return namesRank(status, q, clusterOf); };
    // A rank that counted a hostile peer's junk as a mismatch knew of one the others did not: the
    // next op of the group fails on every rank, as designed (the one after resyncs).
    const bool knew = status.detail.find("of different earlier mismatched") != std::string::npos ||
                      status.detail.find("windows must be mended first") != std::string::npos;
    if (hostileStruck_ && (r == s_.hostile || named(s_.hostile) || knew)) return true;
    return k == StatusKind::kPeerLost && std::any_of(leftOut_.begin(), leftOut_.end(), named);
  }

  // One op on `members` (by cluster rank); its checks under `what`.
  // `ranksOf`: the cluster rank of each rank of the group (default: of each member's, as it
  // reports; a shrunk group's may have ranks that never formed it).
  void runOp(const std::vector<Communicator*>& members, SimCall call, int index,
             const std::string& what, const std::vector<int>* ranksOf = nullptr,
             const std::vector<std::shared_ptr<Communicator>>* alongside = nullptr) {
    int size = 0;
    std::vector<int> clusterOf(members.size(), -1);
    for (int r = 0; r < static_cast<int>(members.size()); ++r) {
      if (members[r] == nullptr) continue;
      ++size;
      clusterOf[members[r]->rank()] = r;
    }
    if (ranksOf != nullptr && !ranksOf->empty()) {
      clusterOf = *ranksOf;
      size = static_cast<int>(ranksOf->size());
    }
    call.root %= size;  // a shrunk group's ranks
    // Kept for the whole scenario: an op that did not end may still write into them.
    buffers_.push_back(std::make_unique<SimCallBuffers>(call, size, s_.cluster.payload));
    SimCallBuffers& buffers = *buffers_.back();
    std::map<int, SimCall> others;
    for (const auto& [rank, how] : disagree_) {
      if (members[rank] != nullptr) others[rank] = disagreeingCall(call, how, size);
    }
    const auto limit = s_.cluster.timeout + kGrace;
    // The second group's op (two groups): the same call on other data, started before or after
    // this one as each rank's own order has it.
    SimCall secondCall = call;
    secondCall.seed = call.seed ^ 0x5bd1e995u;
    SimCallBuffers* secondBuffers = nullptr;
    std::vector<std::shared_ptr<Work>> secondWorks(members.size());
    if (alongside != nullptr) {
      buffers_.push_back(std::make_unique<SimCallBuffers>(secondCall, size, s_.cluster.payload));
      secondBuffers = buffers_.back().get();
    }
    SimCluster::Outcome outcome = cluster_.run(
        members,
        [&](int r, Communicator& comm, CallOptions options) {
          const bool second = alongside != nullptr && (*alongside)[r] != nullptr;
          const bool secondFirst = second && ((s_.seed >> ((r * 7 + index) % 61)) & 1) != 0;
          if (secondFirst) secondWorks[r] = secondBuffers->start(*(*alongside)[r], CallOptions{});
          auto other = others.find(r);
          std::shared_ptr<Work> work =
              buffers.start(comm, options, other == others.end() ? nullptr : &other->second);
          if (second && !secondFirst) {
            secondWorks[r] = secondBuffers->start(*(*alongside)[r], CallOptions{});
          }
          return work;
        },
        limit);
    if (alongside != nullptr) {
      auto live = [&](int r) { return !dead_.count(r) && !frozen_.count(r); };
      cluster_.runUntil(
          [&] {
            for (int r = 0; r < static_cast<int>(secondWorks.size()); ++r) {
              if (secondWorks[r] && live(r) && !secondWorks[r]->done()) return false;
            }
            return true;
          },
          limit);
      for (int r = 0; r < static_cast<int>(secondWorks.size()); ++r) {
        const std::shared_ptr<Work>& work = secondWorks[r];
        if (!work || !live(r)) continue;
        checkOp(r,
                what + " on the second group (" + secondCall.describe() + ") on rank " +
                    std::to_string(r),
                work->done(), work->status(), *secondBuffers, (*alongside)[r]->rank(), clusterOf);
      }
    }
    for (int r = 0; r < static_cast<int>(members.size()); ++r) {
      if (members[r] == nullptr || dead_.count(r) || frozen_.count(r)) continue;
      if (others.count(r) && outcome.ended[r] && outcome.statuses[r].ok())
        continue;  // (another call)
      checkOp(r, what + " (" + call.describe() + ") on rank " + std::to_string(r),
              outcome.ended[r].has_value(), outcome.statuses[r], buffers, members[r]->rank(),
              clusterOf);
    }
  }

  // How rank r's op (`who`) ended: it did, and returned the reference result (`buffers`' of its
  // rank in the group) or failed naming a fault that struck.
  void checkOp(int r, const std::string& who, bool ended, const Status& status,
               const SimCallBuffers& buffers, int groupRank, const std::vector<int>& clusterOf) {
    const auto limit = s_.cluster.timeout + kGrace;
    if (!ended) {
      broke(result_.hang, who + " did not end within " + std::to_string(limit.count()) + " ms");
    } else if (status.ok()) {
      const std::string wrong = buffers.check(groupRank);
      if (!wrong.empty()) broke(result_.wrong, who + " returned " + wrong);
    } else if (!names(r, status, clusterOf)) {
      broke(result_.unnamed, who + " failed without naming a fault that struck: " +
                                 std::string(statusKindName(status.kind)) + ": " + status.detail);
    }
  }

  // Every survivor knows every dead rank within the bound of the kill (where nothing cut it off).
  //
  // Where more than half the ranks die at once, a dead rank may have no live watcher (all its
  // predecessors at distances 2^k dead too) and the survivors hold no quorum: they cannot go on,
  // and the bound is that each knows the group failed (some rank gone) in time.
  void checkNews() {
    if (dead_.empty()) return;
    TimePoint last = TimePoint::min();
    for (const auto& [rank, at] : killedAt_) last = std::max(last, at);
    const TimePoint bound = last + SimRequest().newsBound;
    SimNetwork& net = cluster_.network();
    if (net.now() < bound) {
      cluster_.runUntil([] { return false; },
                        std::chrono::duration_cast<std::chrono::milliseconds>(bound - net.now()) +
                            std::chrono::milliseconds(1));
    }
    if (cutOff_ || !stalled_.empty()) return;  // a rank cut off or stalled cannot hear it
    const int n = cluster_.size();
    const int survivors = n - static_cast<int>(dead_.size());
    const bool quorum = 2 * survivors > n || (2 * survivors == n && !dead_.count(0));
    const std::string within =
        " within " + std::to_string(SimRequest().newsBound.count()) + " ms of its death";
    for (int r = 0; r < n; ++r) {
      if (dead_.count(r)) continue;
      bool knowsOne = false;
      for (int k : dead_) {
        std::optional<TimePoint> since = cluster_.comm(r).goneSince(k);
        const TimePoint died = killedAt_.at(k);
        const bool inTime = since && *since <= died + SimRequest().newsBound;
        knowsOne |= inTime;
        if (inTime) result_.newsMicros = std::max(result_.newsMicros, micros(died, *since));
        if (quorum && !inTime) {
          broke(result_.slowNews, "rank " + std::to_string(r) + " did not know rank " +
                                      std::to_string(k) + " was gone" + within);
          return;
        }
      }
      if (!knowsOne) {
        broke(result_.slowNews,
              "rank " + std::to_string(r) + " knew none of the dead ranks gone" + within);
        return;
      }
    }
  }

  // The survivors of a failed group shrink, as a job does: each excluding the ranks it knows
  // are gone, again a moment later while the views differ; without a quorum, or with nobody
  // known gone (a timeout names no one), a rank gives up. Then the ops after, on that group.
  void shrink() {
    const int n = cluster_.size();
    std::vector<bool> trying(n, false);
    bool anyFailed = false;
    for (int r = 0; r < n; ++r) {
      if (dead_.count(r) || frozen_.count(r)) continue;
      Communicator& comm = cluster_.comm(r);
      // A rank that knows peers gone shrinks, whatever failed first (a mismatch may have come
      // before the news); one whose group failed with nobody known gone gives up.
      const bool lost = !comm.goneRanks().empty();
      const Status& first = comm.firstFailure().status;
      if (!lost && (first.ok() || first.kind == StatusKind::kMismatch)) continue;
      anyFailed = true;
      trying[r] = lost;
    }
    if (!anyFailed) return;
    cluster_.waitFor = [this](int r) { return !frozen_.count(r); };
    SimCluster::Shrink shrink = cluster_.shrink(trying, s_.cluster.timeout + kGrace, s_.refuser);
    for (int r : shrink.unfinished) {
      if (!frozen_.count(r))
        broke(result_.hang, "rank " + std::to_string(r) + "'s shrink did not end");
    }
    // Exactly one group may go on; and where no one was cut off, every survivor is in it.
    const std::set<uint32_t> ids = shrink.ids();
    const std::vector<Communicator*> members = shrink.members();
    result_.shrinkRanks = shrink.size();
    result_.groups = static_cast<int>(ids.size());
    if (ids.size() > 1) {
      broke(result_.split, std::to_string(ids.size()) + " groups went on after the shrink");
      return;
    }
    int survivors = 0;
    for (int r = 0; r < n; ++r) survivors += !dead_.count(r) && !frozen_.count(r);
    // (With nobody dead the group failed by a timeout, which names no one: the job gives up.)
    const bool clean = !dead_.empty() && !cutOff_ && stalled_.empty();
    const bool quorum = 2 * survivors > n || (2 * survivors == n && !dead_.count(0));
    if (clean && quorum && (ids.empty() || result_.shrinkRanks != survivors)) {
      broke(result_.split,
            "the " + std::to_string(survivors) + " survivors, of one view, " +
                (ids.empty() ? "formed no group (" + shrink.lastError + ")"
                             : "formed a group of " + std::to_string(result_.shrinkRanks)));
      return;
    }
    if (ids.empty()) return;
    // Left out: members whose shrink failed as the others agreed (a stalled peer counted gone).
    for (int r : shrink.ranks) {
      if (!shrink.groups[r] && !dead_.count(r) && !frozen_.count(r)) leftOut_.insert(r);
    }
    disagree_.clear();
    for (size_t i = 0; i < s_.after.size(); ++i) {
      runOp(members, s_.after[i], -1, "after the shrink, op " + std::to_string(i), &shrink.ranks);
    }
    if (s_.lifecycle) lifecycle(shrink);
  }

  // The shrunk group's ranks split it; an op of that group fails on every rank (one calls
  // another collective) and the group is destroyed at once, what that op sent still in flight;
  // they split again, and the new group's op must be right (or fail naming a fault that
  // struck). Only where every rank of the shrunk group formed it and runs, and no link is cut.
  void lifecycle(const SimCluster::Shrink& shrink) {
    if (cutOff_) return;
    const std::vector<Communicator*> of = shrink.members();
    int formed = 0;
    for (int r = 0; r < static_cast<int>(of.size()); ++r) {
      if (of[r] == nullptr) continue;
      if (frozen_.count(r) || stalled_.count(r) || dead_.count(r)) return;
      ++formed;
    }
    if (formed != static_cast<int>(shrink.ranks.size()) || s_.after.empty()) return;
    const auto limit = s_.cluster.timeout + kGrace;
    auto splitOnce = [&](const char* which) {
      std::string error;
      std::vector<std::shared_ptr<Communicator>> groups = cluster_.split(of, limit, &error);
      for (int r = 0; r < static_cast<int>(of.size()); ++r) {
        if (of[r] != nullptr && groups[r] == nullptr) {
          broke(result_.split, std::string(which) + " split did not form on rank " +
                                   std::to_string(r) + ": " + error);
          return std::vector<std::shared_ptr<Communicator>>();
        }
      }
      return groups;
    };
    std::vector<std::shared_ptr<Communicator>> first = splitOnce("the first");
    if (first.empty()) return;
    const int odd = shrink.ranks.front();
    Fault disagree;
    disagree.kind = Fault::Kind::kDisagree;
    disagree.ranks = {odd};
    disagree.how = "collective";
    struck_.push_back(disagree);
    disagree_[odd] = disagree.how;
    SimCall failing = s_.after.front();  // a collective: its call is checked (sends are not)
    if (failing.collective == "sendrecv") failing.collective = "allreduce";
    runOp(rawMembers(first), failing, -1, "the first split's op", &shrink.ranks);
    disagree_.clear();
    std::set<uint32_t> destroyed;
    for (const auto& g : first) {
      if (g) destroyed.insert(g->id());
    }
    first.clear();  // destroyed, what its failed op sent still on its way
    std::vector<std::shared_ptr<Communicator>> second = splitOnce("the second");
    if (second.empty()) return;
    for (const auto& g : second) {
      if (g && destroyed.count(g->id())) {
        broke(result_.stale, "the second split took the id " + std::to_string(g->id()) +
                                 " of the group destroyed just before");
        break;
      }
    }
    runOp(rawMembers(second), s_.after.back(), -1, "the second split's op", &shrink.ranks);
  }

  // Two groups: a second group of every rank, split from the first, for the ops to run on too.
  void secondGroup() {
    const auto limit = s_.cluster.timeout + kGrace;
    std::string error;
    second_ = cluster_.split(cluster_.members(), limit, &error);
    for (int r = 0; r < cluster_.size(); ++r) {
      if (second_[r] == nullptr) {
        return broke(result_.split,
                     "the second group did not form on rank " + std::to_string(r) + ": " + error);
      }
    }
  }

  const Scenario& s_;
  std::vector<std::unique_ptr<SimCallBuffers>> buffers_;  // outlive the cluster's ops
  // The windows (their memory) and the hostile peer's requests: outlive them too.
  std::unique_ptr<WindowRounds> windows_;
  std::vector<std::unique_ptr<Request>> hostileRequests_;
  SimCluster cluster_;
  ScenarioResult result_;
  std::vector<Fault> struck_;
  std::set<int> dead_, frozen_, stalled_, leftOut_;
  bool cutOff_ = false;
  bool pointToPointDisagreed_ = false;   // a rank called a collective against sends and receives
  std::map<int, TimePoint> killedAt_;    // by dead rank
  std::map<int, std::string> disagree_;  // this op's, by rank
  std::vector<std::shared_ptr<Communicator>> second_;  // two groups: the second, by rank
  HostGroups hostGroups_;
  bool hostileStruck_ = false;
};

}  // namespace

ScenarioResult runScenario(const Scenario& scenario) {
  try {
    return Run(scenario).go();
  } catch (const std::exception& e) {
    ScenarioResult r;
    r.seed = scenario.seed;
    r.description = scenario.describe();
    r.unnamed = true;
    r.why = std::string("the run threw: ") + e.what();
    return r;
  }
}

CampaignReport runCampaign(uint64_t seed, int count, const ScenarioLimits& limits,
                           const std::function<void(int, const ScenarioResult&)>& progress) {
  const auto start = Wall::now();
  CampaignReport report;
  uint64_t draw = 0;
  for (int i = 0; i < count; ++i) {
    Scenario s = drawScenario(scenarioSeed(seed, draw++), limits.slowStore);
    while (s.cluster.hostSizes.size() > 0 && s.ranks() > limits.maxRanks) {
      s = drawScenario(scenarioSeed(seed, draw++), limits.slowStore);
    }
    const ScenarioResult r = runScenario(s);
    ++report.scenarios;
    report.hangs += r.hang;
    report.wrong += r.wrong;
    report.unnamed += r.unnamed;
    report.split += r.split;
    report.slowNews += r.slowNews;
    report.overBudget += r.overBudget;
    std::array<bool, kFaultKinds> kinds{};
    for (const Fault& f : s.faults) kinds[static_cast<int>(f.kind)] = true;
    if (s.firstOp != 0) {
      const int wrap = s.firstOp > (uint64_t{1} << 16) ? 1 : 0;
      report.nearWrap[wrap] += 1;
      report.failedNearWrap[wrap] += r.failed();
    }
    if (s.refuser >= 0) {
      report.refusedFirst += 1;
      report.failedRefusedFirst += r.failed();
    }
    if (s.lifecycle) {
      report.lifecycles += 1;
      report.failedLifecycles += r.failed();
    }
    report.stale += r.stale;
    report.earlySignals += r.earlySignals;
    auto count = [&](bool drawn, int& with, int& failed) {
      with += drawn;
      failed += drawn && r.failed();
    };
    count(s.windows > 0, report.windowed, report.failedWindowed);
    count(s.twoGroups, report.twoGroups, report.failedTwoGroups);
    count(s.slowReducer >= 0, report.slowReductions, report.failedSlowReductions);
    count(s.hostile >= 0, report.hostile, report.failedHostile);
    count(s.slowStoreMicros > 0, report.slowStore, report.failedSlowStore);
    count(s.alltoallBruck, report.alltoallBruck, report.failedAlltoallBruck);
    count(s.cluster.sharedMemory, report.sharedMemory, report.failedSharedMemory);
    count(!s.hostOps.empty(), report.hostOps, report.failedHostOps);
    report.quickOps += r.quickOps;
    report.handedOps += r.handedOps;
    for (int k = 0; k < kFaultKinds; ++k) {
      report.withKind[k] += kinds[k];
      report.failedWithKind[k] += kinds[k] && r.failed();
    }
    if (r.failed()) report.failures.push_back(r);
    report.digest = (report.digest ^ r.digest) * 0x100000001b3ull + static_cast<uint64_t>(i);
    if (progress) progress(i, r);
  }
  report.wallSeconds = std::chrono::duration<double>(Wall::now() - start).count();
  return report;
}

}  // namespace ddl
