// The simulator's functions in torch_ddl._C, for python -m torch_ddl.sim: one run, one scenario,
// a campaign.
#include "sim_bindings.hpp"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <memory>

#include "../core/base/status.h"
#include "../core/group/communicator.h"
#include "../core/sim/campaign.h"
#include "../core/sim/simulate.h"

namespace py = pybind11;

namespace ddl {
namespace {

template <typename Fn>
auto valueErrors(Fn fn) {
  try {
    return fn();
  } catch (const Error& e) {
    throw py::value_error(e.what());
  }
}

py::dict resultDict(const ScenarioResult& r) {
  py::dict out;
  out["seed"] = r.seed;
  out["description"] = r.description;
  out["failed"] = r.failed();
  out["hang"] = r.hang;
  out["wrong"] = r.wrong;
  out["unnamed"] = r.unnamed;
  out["split"] = r.split;
  out["slow_news"] = r.slowNews;
  out["over_budget"] = r.overBudget;
  out["stale"] = r.stale;
  out["why"] = r.why;
  out["digest"] = r.digest;
  out["ranks"] = r.ranks;
  out["news_us"] = r.newsMicros;
  out["failure_messages"] = r.failureMessages;
  out["max_endpoints"] = r.maxEndpoints;
  out["groups"] = r.groups;
  out["shrink_ranks"] = r.shrinkRanks;
  return out;
}

// A run's request, from the keyword arguments torch_ddl.sim passes.
SimRequest simRequestOf(const py::dict& a) {
  SimRequest q;
  q.cluster.hostSizes = a["host_sizes"].cast<std::vector<int>>();
  q.cluster.ranks = a["ranks"].cast<int>();
  q.cluster.ranksPerHost = a["ranks_per_host"].cast<int>();
  q.cluster.hostsPerRack = a["hosts_per_rack"].cast<int>();
  q.cluster.links = a["links"].cast<std::string>();
  q.cluster.reduceBandwidth = a["reduce_bw"].cast<double>();
  q.cluster.copyBandwidth = a["copy_bw"].cast<double>();
  if (a.contains("store_us")) q.cluster.storeMicros = a["store_us"].cast<double>();
  if (a.contains("store_set_us")) q.cluster.storeSetMicros = a["store_set_us"].cast<double>();
  if (a.contains("store_key_us")) q.cluster.storeKeyMicros = a["store_key_us"].cast<double>();
  q.cluster.payload = a["payload"].cast<bool>();
  q.cluster.timeout = std::chrono::milliseconds(a["timeout_ms"].cast<int64_t>());
  q.collective = a["collective"].cast<std::string>();
  q.bytes = a["bytes"].cast<size_t>();
  q.seed = a["seed"].cast<uint64_t>();
  q.killRanks = a["kill_ranks"].cast<std::vector<int>>();
  q.shrink = a.contains("shrink") && a["shrink"].cast<bool>();
  if (a.contains("progress") && !a["progress"].is_none()) {
    // Held by a shared_ptr so that copies of the function, made without the GIL, touch no
    // Python reference count; the call takes the GIL.
    auto callback = std::make_shared<py::object>(a["progress"]);
    q.progress = [callback](const std::string& line) {
      py::gil_scoped_acquire held;
      (*callback)(line);
    };
  }
  if (a.contains("payload_limit")) q.payloadLimit = a["payload_limit"].cast<uint64_t>();
  q.killFraction = a["kill_fraction"].cast<double>();
  if (a.contains("partition_ranks")) {
    q.partitionRanks = a["partition_ranks"].cast<std::vector<int>>();
    q.partitionFraction = a["partition_fraction"].cast<double>();
  }
  if (a.contains("stall_rank")) {
    q.stallRank = a["stall_rank"].cast<int>();
    q.stallFraction = a["stall_fraction"].cast<double>();
    q.stallMillis = a["stall_ms"].cast<double>();
  }
  if (a.contains("status_at_us")) q.statusAtMicros = a["status_at_us"].cast<double>();
  if (a.contains("slow_rank")) {
    q.slowRank = a["slow_rank"].cast<int>();
    q.slowFactor = a["slow_factor"].cast<double>();
  }
  if (a.contains("slow_host")) {
    q.slowLinkHost = a["slow_host"].cast<int>();
    q.slowLinkFactor = a["slow_host_factor"].cast<double>();
  }
  PlanRequest plan = planRequest();
  const std::string algo = a["algo"].cast<std::string>();
  const std::optional<AllreduceAlgorithm> named = algorithmNamed(algo);
  if (!named || *named == AllreduceAlgorithm::kTrivial) {
    throw py::value_error("unknown algorithm '" + algo + "'");
  }
  plan.algorithm = *named;
  plan.colors = a["colors"].cast<int>();
  plan.waves = a["waves"].cast<int>();
  if (a.contains("rings")) plan.rings = a["rings"].cast<int>();
  q.cluster.plan = plan;
  return q;
}

// A run's figures, as a dict.
py::dict simReportDict(const SimReport& r) {
  py::dict out;
  out["ranks"] = r.ranks;
  out["algo"] = r.algorithm;
  out["bytes"] = r.bytes;
  out["sim_us"] = r.simMicros;
  out["model_us"] = r.modelMicros;
  out["store_requests"] = r.storeRequests;
  out["max_endpoints"] = r.maxEndpoints;
  out["messages"] = r.messages;
  out["op_messages"] = r.opMessages;
  out["creation_messages"] = r.creationMessages;
  out["creation_us"] = r.creationMicros;
  out["events"] = r.events;
  out["digest"] = r.digest;
  out["busiest"] = py::make_tuple(r.busiest[0], r.busiest[1], r.busiest[2]);
  out["checked"] = r.checked;
  out["mismatch"] = r.mismatch;
  out["survivors"] = r.survivors;
  out["named"] = r.named;
  out["named_by_us"] = r.namedByMicros;
  out["failure_messages"] = r.failureMessages;
  out["killed_at_us"] = r.killedAtMicros;
  out["completed"] = r.completed;
  out["kill_digest"] = r.killDigest;
  out["shrink_groups"] = r.shrinkGroups;
  out["shrink_members"] = r.shrinkMembers;
  out["shrink_us"] = r.shrinkMicros;
  out["shrink_messages"] = r.shrinkMessages;
  out["shrink_ops_ok"] = r.shrinkOpsOk;
  out["shrink_ops_checked"] = r.shrinkOpsChecked;
  out["shrink_ops"] = SimRequest::kShrinkOps;
  out["shrink_error"] = r.shrinkError;
  out["shrink_attempts"] = r.shrinkAttempts;
  out["first_error"] = r.firstError;
  out["unnamed_error"] = r.unnamedError;
  out["wall_s"] = r.wallSeconds;
  out["status"] = r.status;
  out["status_taken_us"] = r.statusTakenMicros;
  return out;
}

// A campaign's counts, kinds and failures, as a dict.
py::dict campaignDict(const CampaignReport& report) {
  py::dict out;
  out["scenarios"] = report.scenarios;
  out["hangs"] = report.hangs;
  out["wrong"] = report.wrong;
  out["unnamed"] = report.unnamed;
  out["split"] = report.split;
  out["slow_news"] = report.slowNews;
  out["over_budget"] = report.overBudget;
  out["wall_s"] = report.wallSeconds;
  out["digest"] = report.digest;
  py::list kinds;
  for (int k = 0; k < kFaultKinds; ++k) {
    kinds.append(py::make_tuple(faultKindName(static_cast<Fault::Kind>(k)), report.withKind[k],
                                report.failedWithKind[k]));
  }
  kinds.append(py::make_tuple("wrap_2^16", report.nearWrap[0], report.failedNearWrap[0]));
  kinds.append(py::make_tuple("wrap_2^32", report.nearWrap[1], report.failedNearWrap[1]));
  kinds.append(py::make_tuple("retry", report.refusedFirst, report.failedRefusedFirst));
  kinds.append(py::make_tuple("lifecycle", report.lifecycles, report.failedLifecycles));
  kinds.append(py::make_tuple("windows", report.windowed, report.failedWindowed));
  kinds.append(py::make_tuple("two_groups", report.twoGroups, report.failedTwoGroups));
  kinds.append(py::make_tuple("slow_reduce", report.slowReductions, report.failedSlowReductions));
  kinds.append(py::make_tuple("hostile", report.hostile, report.failedHostile));
  kinds.append(py::make_tuple("alltoall_bruck", report.alltoallBruck, report.failedAlltoallBruck));
  kinds.append(py::make_tuple("slow_store", report.slowStore, report.failedSlowStore));
  kinds.append(py::make_tuple("shared_memory", report.sharedMemory, report.failedSharedMemory));
  kinds.append(py::make_tuple("host_groups", report.hostOps, report.failedHostOps));
  out["quick_ops"] = report.quickOps;
  out["handed_ops"] = report.handedOps;
  out["stale_used"] = report.stale;
  out["early_signal"] = report.earlySignals;
  out["kinds"] = kinds;
  py::list failures;
  for (const ScenarioResult& r : report.failures) failures.append(resultDict(r));
  out["failures"] = failures;
  return out;
}

}  // namespace

void defineSimulator(py::module_& m) {
  m.attr("SIMULATED_LINKS") = kSimulatedLinks;
  // One run, as a dict of its figures.
  m.def("simulate", [](const py::dict& a) {
    SimRequest q = simRequestOf(a);
    SimReport r;
    {
      py::gil_scoped_release released;
      r = valueErrors([&] { return simulate(q); });
    }
    return simReportDict(r);
  });

  // One scenario of a campaign, drawn from its seed.
  m.def("scenario", [](uint64_t seed, bool slowStore) {
    const Scenario s = drawScenario(seed, slowStore);
    ScenarioResult r;
    {
      py::gil_scoped_release released;
      r = runScenario(s);
    }
    return resultDict(r);
  });
  m.def("scenario_seed", &scenarioSeed, "the seed of a campaign's index-th draw");
  // `count` scenarios drawn from `seed`; progress(index, result dict) after each.
  m.def("campaign",
        [](uint64_t seed, int count, int maxRanks, const py::object& progress, bool slowStore) {
          ScenarioLimits limits;
          limits.maxRanks = maxRanks;
          limits.slowStore = slowStore;
          CampaignReport report;
          {
            py::gil_scoped_release released;
            report = runCampaign(seed, count, limits, [&](int i, const ScenarioResult& r) {
              if (progress.is_none()) return;
              py::gil_scoped_acquire held;
              progress(i, resultDict(r));
            });
          }
          return campaignDict(report);
        });
}

}  // namespace ddl
