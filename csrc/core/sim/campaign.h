// The fault campaign: scenarios (scenario.h) run on the real engine in the simulator and checked
// against invariants rather than expected outputs. A scenario fails when one breaks, and says
// which:
//   hang      an op of a live rank did not end by its deadline;
//   wrong     an op that succeeded returned something other than the reference result;
//   unnamed   an op that failed does not name its cause (the kind and the ranks of a fault that
//             struck: the dead ranks, the mismatch, the side cut off), or failed with none;
//   split     the survivors that shrank did not form exactly one group, or both sides of a
//             partition went on;
//   slow_news a survivor did not know every dead rank within the bound (SimRequest::newsBound);
//   over_budget a fault cost more than 20 P log2 P failure messages, or a rank opened more
//             endpoints than its ops need: 5 log2 P + 2 sqrt P + 16 H + 8 a group (H the largest
//             host; campaign.cc says what each term is for), P where an all_to_all, gather or
//             scatter talks to every rank.
// Every scenario replays from its seed alone: python -m torch_ddl.sim --scenario SEED.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "scenario.h"
#include "simulate.h"

namespace ddl {

struct ScenarioResult {
  uint64_t seed = 0;
  std::string description;
  bool hang = false, wrong = false, unnamed = false, split = false, slowNews = false,
       overBudget = false;
  std::string why;  // the first invariant broken, in words ("" when none)
  uint64_t digest = 0;
  int ranks = 0;
  double newsMicros = 0;  // the last survivor to know every dead rank, from the kill
  uint64_t failureMessages = 0;
  int maxEndpoints = 0;
  int groups = 0;  // formed by the shrink
  // A group split anew after one was destroyed took the destroyed one's id on some rank, where
  // the old group's leftovers could be taken for the new one's messages.
  bool stale = false;
  int shrinkRanks = 0;  // the ranks that formed it
  // Windows: waits for a signal that returned before the put it covers had landed.
  int earlySignals = 0;
  // Allreduces callers ran on their own thread (group/quick.cc), and those handed to an op.
  uint64_t quickOps = 0, handedOps = 0;
  bool failed() const {
    return hang || wrong || unnamed || split || slowNews || overBudget || stale;
  }
};

ScenarioResult runScenario(const Scenario& scenario);

struct CampaignReport {
  int scenarios = 0;
  int hangs = 0, wrong = 0, unnamed = 0, split = 0, slowNews = 0, overBudget = 0, stale = 0;
  // By fault kind: scenarios with it, and of them the ones that failed.
  std::array<int, kFaultKinds> withKind{}, failedWithKind{};
  // Scenarios whose ops were numbered from just before 2^16 and 2^32, and those that failed.
  std::array<int, 2> nearWrap{}, failedNearWrap{};
  // Scenarios whose shrink began with one rank's call refused (then retried), and those failed.
  int refusedFirst = 0, failedRefusedFirst = 0;
  // Scenarios with a group lifecycle after the shrink, and those failed.
  int lifecycles = 0, failedLifecycles = 0;
  // Scenarios with windows, two groups, a slow reduction, a hostile peer, all_to_alls by Bruck's
  // rounds, a slow store; and of them those that failed.
  int windowed = 0, failedWindowed = 0, twoGroups = 0, failedTwoGroups = 0, slowReductions = 0,
      failedSlowReductions = 0, hostile = 0, failedHostile = 0, alltoallBruck = 0,
      failedAlltoallBruck = 0, slowStore = 0, failedSlowStore = 0;
  // Scenarios sharing memory within hosts, and with host groups; and of them those that failed.
  int sharedMemory = 0, failedSharedMemory = 0, hostOps = 0, failedHostOps = 0;
  int earlySignals = 0;
  uint64_t quickOps = 0, handedOps = 0;  // over every scenario
  std::vector<ScenarioResult> failures;
  double wallSeconds = 0;
  uint64_t digest = 0;  // of every scenario's digest, in order: one seed, one digest
  int failed() const { return static_cast<int>(failures.size()); }
};

// `count` scenarios drawn from `seed`; `progress(index, result)` after each (may be empty).
CampaignReport runCampaign(uint64_t seed, int count, const ScenarioLimits& limits,
                           const std::function<void(int, const ScenarioResult&)>& progress);

}  // namespace ddl
