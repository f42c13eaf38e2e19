// The paths a fault scenario draws beside its collectives and faults (scenario.h): windows,
// run before the ops while the group is whole, and what a hostile peer sends as an op starts.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../group/window.h"
#include "cluster.h"
#include "scenario.h"

namespace ddl {

// How long past the group's timeout a step of a scenario may run before it counts as hung.
inline constexpr std::chrono::milliseconds kGrace{8000};
// Microseconds of virtual time from `from` to `to`; the time `us` microseconds after `t`.
double micros(TimePoint from, TimePoint to);
TimePoint after(TimePoint t, double us);
// Whether `r` is among `ranks`.
bool among(const std::vector<int>& ranks, int r);

// Windows on the whole group (Scenario::windows): made at once, rounds of a put, a signal and a
// wait, one signal late, deregistered and registered anew half way. What each wait covers is
// checked, a late signal is taken by a later wait, and deregistration lets no put land after it.
class WindowRounds {
 public:
  WindowRounds(SimCluster& cluster, const Scenario& s) : cluster_(cluster), s_(s) {}
  struct Broken {
    std::string hang, wrong, unnamed;  // the first invariant broken of each kind ("" if none)
    int earlySignals = 0;              // waits that returned before their put landed
  };
  Broken run();

 private:
  bool create();
  bool attach();
  bool detach(float stamp);
  bool exchange(int round);
  bool drain();
  void checkWait(int w, int r, int from);
  void broke(std::string& what, const std::string& why);
  bool failedOn(const char* what, int r, const std::string& why);  // false
  // Runs until every work is done (a null one: nothing to wait for); a hang where one is not.
  bool awaitAll(const std::vector<std::shared_ptr<Work>>& works, const std::string& what);

  SimCluster& cluster_;
  const Scenario& s_;
  Broken broken_;
  int n_ = 0, count_ = 0;
  size_t k_ = 0;
  std::vector<std::vector<std::shared_ptr<Window>>> windows_;  // by rank, then window
  std::vector<std::vector<std::vector<float>*>> mine_;         // what each registered
  // sent_[w][from * n + to]: the round each signal covers, in the order sent; taken_[w][to * n +
  // from]: how many `to` took.
  std::vector<std::vector<std::vector<int>>> sent_;
  std::vector<std::vector<int>> taken_;
  // The windows' memory and the puts' sources (they outlive the cluster's ops: the owner keeps
  // this object until the cluster is gone).
  std::vector<std::unique_ptr<std::vector<float>>> memory_;
};

// A hostile peer (Scenario::hostile): replays of what it sent before, then malformed, truncated
// and oversized control messages and data of the wrong size under the next op's tags, to its
// neighbours (what Scenario::hostileSends picks). `requests` keeps the sends' requests.
void sendHostile(SimCluster& cluster, const Scenario& s,
                 std::vector<std::unique_ptr<Request>>* requests);

// Whether `status` names cluster rank `rank`: among its ranks (group ranks, mapped by
// `clusterOf`), or in its words.
bool namesRank(const Status& status, int rank, const std::vector<int>& clusterOf);

// Whether cut, partition or stall `f` kept a rank `status` names gone from its witness in the
// words ("rank G is gone: rank W counts it gone", group/notices.cc; group ranks mapped by
// `clusterOf`).
bool keptFromWitness(const Fault& f, const Status& status, const std::vector<int>& clusterOf);

}  // namespace ddl
