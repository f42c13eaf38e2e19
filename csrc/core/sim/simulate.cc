#include "simulate.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include "../base/tag.h"
#include "../base/types.h"
#include "calls.h"
#include "paths.h"

namespace ddl {
namespace {

double spanMicros(const SimCluster::Outcome& outcome) {
  double longest = 0;
  for (const auto& ended : outcome.ended) {
    if (ended) longest = std::max(longest, micros(outcome.began, *ended));
  }
  return longest;
}

SimCall requestedCall(const SimRequest& request) {
  SimCall call;
  call.collective = request.collective;
  call.count = request.bytes / sizeof(float);
  call.seed = request.seed;
  return call;
}

// The collectives after a shrink: every kind, roots that move, sizes from a few floats to the
// request's own (the all_to_all a send/recv ring in a group past kShrinkAlltoallMembers).
std::vector<SimCall> afterShrink(const SimRequest& request, int members) {
  const std::vector<std::string> kinds = {"allreduce", "broadcast",      "allgather", "barrier",
                                          "reduce",    "reduce_scatter", "gather",    "scatter",
                                          "alltoall",  "allreduce"};
  std::vector<SimCall> calls;
  for (int i = 0; i < SimRequest::kShrinkOps; ++i) {
    SimCall call;
    call.collective = kinds[i % kinds.size()];
    call.seed = request.seed + 1000 + i;
    call.root = (i * 7) % members;
    const bool blocks = call.collective == "allgather" || call.collective == "reduce_scatter" ||
                        call.collective == "gather" || call.collective == "scatter" ||
                        call.collective == "alltoall";
    call.count = blocks ? 31 : i == 9 ? request.bytes / sizeof(float) : 1031;
    if (call.collective == "alltoall" && members > SimRequest::kShrinkAlltoallMembers) {
      call.collective = "sendrecv";
    }
    calls.push_back(call);
  }
  return calls;
}

// The run's progress as it goes (SimRequest::progress).
class Progress {
 public:
  explicit Progress(const SimRequest& request)
      : request_(request), wallStart_(std::chrono::steady_clock::now()) {}
  double wallSeconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wallStart_).count();
  }
  void operator()(SimCluster& cluster, const std::string& what) const {
    if (!request_.progress) return;
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    char figures[128];
    std::snprintf(figures, sizeof(figures), ": virtual %.1f us, wall %.1f s, peak %.2f GB",
                  micros(TimePoint{}, cluster.network().now()), wallSeconds(),
                  static_cast<double>(usage.ru_maxrss) / (1 << 20));
    request_.progress(what + figures);
  }

 private:
  const SimRequest& request_;
  std::chrono::steady_clock::time_point wallStart_;
};

// The fault's reckoning, as --progress tells it.
std::string faultLine(const SimReport& r) {
  return "fault: " + std::to_string(r.named) + " of " + std::to_string(r.survivors) +
         " survivors name what they lost within " + std::to_string(std::llround(r.namedByMicros)) +
         " us of it, in " + std::to_string(r.failureMessages) + " failure messages";
}

// The shrink after the kill, as a job makes it (SimCluster::shrink), then the collectives on the
// group it formed.
void shrinkAndGoOn(const SimRequest& request, SimCluster& cluster, SimReport* report,
                   const Progress& progress) {
  const int n = cluster.size();
  const std::chrono::milliseconds limit = request.cluster.timeout * 2;
  std::vector<bool> trying(n, false);
  for (int r = 0; r < n; ++r) {
    trying[r] = !cluster.network().dead(r) && !(r == request.stallRank && request.stallMillis < 0);
  }
  const TimePoint began = cluster.network().now();
  const uint64_t sentBefore = cluster.network().messages();
  SimCluster::Shrink shrink = cluster.shrink(trying, limit);
  report->shrinkMessages = cluster.network().messages() - sentBefore;
  const std::string& lastError = shrink.lastError;
  report->shrinkAttempts = shrink.attempts;
  report->shrinkMicros = micros(began, cluster.network().now());
  const std::set<uint32_t> ids = shrink.ids();
  const std::vector<Communicator*> members = shrink.members();
  report->shrinkMembers = shrink.size();
  report->shrinkGroups = static_cast<int>(ids.size());
  auto fail = [report](const std::string& why) {
    if (report->shrinkError.empty()) report->shrinkError = why;
  };
  progress(cluster, "shrink: " + std::to_string(ids.size()) + " group(s), " +
                        std::to_string(report->shrinkMembers) + " members");
  if (ids.size() != 1) {
    fail(lastError);
    return;
  }
  int index = 0;
  for (const SimCall& call : afterShrink(request, report->shrinkMembers)) {
    const bool carried =
        request.cluster.payload && call.payloadBytes(report->shrinkMembers) <= request.payloadLimit;
    cluster.carryPayload(carried);
    SimCallBuffers buffers(call, report->shrinkMembers, carried);
    SimCluster::Outcome outcome = cluster.run(
        members,
        [&](int, Communicator& comm, CallOptions options) { return buffers.start(comm, options); },
        limit);
    bool right = outcome.finished;
    for (int r = 0; r < n && right; ++r) {
      if (members[r] == nullptr) continue;
      std::string wrong = outcome.errors[r];
      if (wrong.empty()) wrong = buffers.check(members[r]->rank());
      if (!wrong.empty()) {
        fail("rank " + std::to_string(r) + ": " + call.describe() + ": " + wrong);
        right = false;
      }
    }
    if (!outcome.finished) fail(call.describe() + " did not end");
    if (right) ++report->shrinkOpsOk;
    if (right && carried) ++report->shrinkOpsChecked;
    progress(cluster, "shrunk group's op " + std::to_string(++index) + " of " +
                          std::to_string(SimRequest::kShrinkOps) + ", " + call.describe() +
                          (right ? ": right" : ": not right"));
  }
  cluster.carryPayload(request.cluster.payload);
}

// The slow rank and link of the request (they are part of the machine, in every run).
void slowDown(const SimRequest& request, SimCluster& cluster) {
  if (request.slowRank >= 0) {
    if (request.slowRank >= cluster.size()) {
      throw Error("ddl: cannot slow rank " + std::to_string(request.slowRank) + " of " +
                      std::to_string(cluster.size()),
                  StatusKind::kInvalidArgument);
    }
    cluster.network().slow(request.slowRank, request.slowFactor);
  }
  if (request.slowLinkHost >= 0) {
    const int hosts = static_cast<int>(cluster.layout().rackOf.size());
    if (request.slowLinkHost >= hosts) {
      throw Error("ddl: cannot slow the link of host " + std::to_string(request.slowLinkHost) +
                      ": there are " + std::to_string(hosts),
                  StatusKind::kInvalidArgument);
    }
    cluster.network().slowLink(request.slowLinkHost, request.slowLinkFactor);
  }
}

// What the group runs for the collective (the allreduce's plan, the allgather's or
// reduce_scatter's schedule, else its name) and what the cost model prices it at.
void describePlan(Communicator& comm, const std::string& collective, size_t count,
                  SimReport& report) {
  if (collective == "allreduce") {
    auto plan = comm.allreducePlan(count, DataType::kFloat32);
    report.algorithm = plan->describe();
    report.modelMicros = plan->predicted * 1e6;
  } else if (collective == "allgather" || collective == "reduce_scatter") {
    const bool reduceScatter = collective == "reduce_scatter";
    PlanBook& book = comm.planBook();
    const size_t bytes = count * sizeof(float);
    const AllgatherSchedule schedule = book.allgatherSchedule(bytes, reduceScatter);
    report.algorithm = collective + ":" + allgatherScheduleName(schedule);
    report.modelMicros = book.allgatherPredicted(schedule, bytes, reduceScatter) * 1e6;
  } else if (collective == "alltoall" &&
             comm.planBook().alltoallSchedule() == AlltoallSchedule::kBruck) {
    report.algorithm = "alltoall:bruck";
    report.modelMicros = comm.planBook().alltoallBruckPredicted(count * sizeof(float)) * 1e6;
  } else if (collective == "gather" &&
             comm.planBook().gatherSchedule(count * sizeof(float)) == GatherSchedule::kTree) {
    report.algorithm = "gather:tree";
  } else {
    report.algorithm = collective;
  }
}

// With statusAtMicros: every rank's status row, at that time after `began` (SimReport::status).
void lookAtStatus(SimCluster& cluster, const SimRequest& request, SimReport& report,
                  TimePoint began) {
  cluster.lookAt(
      began + std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::duration<double, std::micro>(request.statusAtMicros)),
      [&cluster, &report, began] {
        report.status = cluster.statusRows();
        report.statusTakenMicros =
            std::chrono::duration<double, std::micro>(cluster.network().now() - began).count();
      });
}

}  // namespace

namespace {

// The op run once with no fault: the report's figures of it; its span, in microseconds.
double runFaultFree(const SimRequest& request, const SimCall& call, std::chrono::milliseconds limit,
                    const Progress& progress, SimReport& report) {
  SimCluster cluster(request.cluster);
  slowDown(request, cluster);
  report.ranks = cluster.size();
  const TimePoint created = cluster.network().now();
  cluster.createGroup();
  report.creationMicros = micros(created, cluster.network().now());
  report.storeRequests = cluster.storeRequests();
  report.creationMessages = cluster.network().messages();
  describePlan(cluster.comm(0), request.collective, call.count, report);
  SimCallBuffers buffers(call, cluster.size(), request.cluster.payload);
  const auto opSequence = static_cast<uint32_t>(cluster.comm(0).sequenceNumber());
  double before[3];
  for (int level = 0; level < 3; ++level) before[level] = cluster.network().busiestLink(level);
  SimCluster::Outcome outcome = cluster.run(
      [&](int, Communicator& comm, CallOptions options) { return buffers.start(comm, options); },
      limit);
  if (!outcome.finished) throw Error("ddl: the simulated " + request.collective + " did not end");
  for (int r = 0; r < cluster.size(); ++r) {
    if (!outcome.errors[r].empty()) throw Error(outcome.errors[r]);
  }
  const double faultFree = spanMicros(outcome);
  progress(cluster, "the fault-free " + call.describe() + " ended");
  report.simMicros = faultFree;
  for (int level = 0; level < 3; ++level) {
    const double busy = cluster.network().busiestLink(level) - before[level];
    report.busiest[level] = faultFree > 0 ? busy * 1e6 / faultFree : 0;
  }
  report.maxEndpoints = cluster.maxEndpoints();
  report.messages = cluster.network().messages();
  report.opMessages = cluster.network().messagesOfOp(cluster.comm(0).id(), opSequence,
                                                     tag::wideBits(cluster.comm(0).size()));
  report.events = cluster.network().events();
  report.digest = cluster.network().digest();
  if (request.cluster.payload) {
    report.checked = true;
    for (int r = 0; r < cluster.size() && report.mismatch.empty(); ++r) {
      report.mismatch = buffers.check(r);
    }
  }
  return faultFree;
}

// The faults `request` asks for, booked on `cluster`'s network from `began` at their fractions of
// the fault-free span; the first one's time after `began`.
std::chrono::nanoseconds bookFaults(const SimRequest& request, SimCluster& cluster,
                                    const std::set<int>& killed, const std::set<int>& side,
                                    bool stalledForGood, TimePoint began, double faultFree) {
  auto atFraction = [&](double fraction) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double, std::micro>(faultFree * fraction));
  };
  std::chrono::nanoseconds at = std::chrono::nanoseconds::max();
  if (!killed.empty()) {
    at = atFraction(request.killFraction);
    cluster.network().kill(std::vector<int>(killed.begin(), killed.end()), began + at);
  }
  if (!side.empty()) {
    at = std::min(at, atFraction(request.partitionFraction));
    cluster.network().partition(request.partitionRanks,
                                began + atFraction(request.partitionFraction));
  }
  if (request.stallRank >= 0) {
    const TimePoint from = began + atFraction(request.stallFraction);
    at = std::min(at, atFraction(request.stallFraction));
    cluster.network().stall(
        request.stallRank, from,
        stalledForGood
            ? TimePoint::max()
            : from + std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::duration<double, std::milli>(request.stallMillis)));
  }
  return at;
}

// A survivor whose part was done before the failure reached it (its result is right: the dead
// ranks' data was in) raises at its next call: the group has failed. Each makes one, a barrier,
// whose end stands in `outcome` for its op's; its result is checked first.
void settleFinished(SimCluster& cluster, SimCallBuffers& buffers, const std::set<int>& killed,
                    std::chrono::milliseconds limit, SimCluster::Outcome& outcome,
                    SimReport& report) {
  std::vector<int> finished;
  for (int r = 0; r < cluster.size(); ++r) {
    if (!killed.count(r) && outcome.ended[r] && outcome.errors[r].empty()) {  // (not a stalled one)
      finished.push_back(r);
      const std::string wrong = buffers.check(r);
      if (!wrong.empty() && report.mismatch.empty()) report.mismatch = wrong;
    }
  }
  report.completed = static_cast<int>(finished.size());
  if (!finished.empty()) {
    SimCluster::Outcome next = cluster.run(
        [&](int r, Communicator& comm, CallOptions options) -> std::shared_ptr<Work> {
          if (std::find(finished.begin(), finished.end(), r) == finished.end()) return nullptr;
          return comm.barrier(options);
        },
        limit);
    for (int r : finished) {
      outcome.errors[r] = next.errors[r];
      outcome.ended[r] = next.ended[r];
    }
  }
}

// Which survivors know every rank they should know gone (the killed ranks; across a partition,
// the other side; the stalled rank), and by when after the first fault struck (the op began at
// `began`).
void countNamed(const SimRequest& request, SimCluster& cluster, const SimCluster::Outcome& outcome,
                const std::set<int>& killed, const std::set<int>& side, TimePoint began,
                TimePoint struck, SimReport& report) {
  auto toKnow = [&](int r) {
    std::set<int> gone = killed;
    if (!side.empty()) {
      for (int q = 0; q < cluster.size(); ++q) {
        if (side.count(q) != side.count(r)) gone.insert(q);
      }
    }
    if (request.stallRank >= 0 && r != request.stallRank) gone.insert(request.stallRank);
    return gone;
  };
  for (int r = 0; r < cluster.size(); ++r) {
    if (killed.count(r)) continue;
    ++report.survivors;
    const Communicator& comm = cluster.comm(r);
    const std::string& error = outcome.errors[r];
    TimePoint knewAll = began;
    int known = 0;
    const std::set<int> gone = toKnow(r);
    for (int k : gone) {
      std::optional<TimePoint> since = comm.goneSince(k);
      if (!since) continue;
      ++known;
      knewAll = std::max(knewAll, *since);
    }
    if (known < static_cast<int>(gone.size())) {
      if (report.unnamedError.empty()) {
        report.unnamedError = "rank " + std::to_string(r) + " knows " + std::to_string(known) +
                              " of the " + std::to_string(gone.size()) +
                              " ranks: " + (error.empty() ? "no error" : error);
      }
      continue;
    }
    ++report.named;
    if (report.firstError.empty()) report.firstError = error;
    report.namedByMicros = std::max(report.namedByMicros, micros(struck, knewAll));
  }
}

// The op run again with the faults of `request`, then the survivors' news and (if asked) their
// shrink: the report's figures of it.
void runFaulted(const SimRequest& request, const SimCall& call, std::chrono::milliseconds limit,
                double faultFree, const Progress& progress, SimReport& report) {
  SimCluster cluster(request.cluster);
  slowDown(request, cluster);
  std::set<int> killed(request.killRanks.begin(), request.killRanks.end());
  const std::set<int> side(request.partitionRanks.begin(), request.partitionRanks.end());
  auto valid = [&](int r, const char* what) {
    if (r < 0 || r >= cluster.size()) {
      throw Error("ddl: cannot " + std::string(what) + " rank " + std::to_string(r) + " of " +
                      std::to_string(cluster.size()),
                  StatusKind::kInvalidArgument);
    }
  };
  for (int r : killed) valid(r, "kill");
  for (int r : side) valid(r, "cut off");
  if (request.stallRank >= 0) valid(request.stallRank, "stall");
  const bool stalledForGood = request.stallRank >= 0 && request.stallMillis < 0;
  if (stalledForGood) cluster.waitFor = [&request](int r) { return r != request.stallRank; };
  cluster.createGroup();
  progress(cluster, "the group to fault formed");
  SimCallBuffers buffers(call, cluster.size(), request.cluster.payload);
  const uint64_t noticeSlot = tag::slot(tag::kControlPhase, tag::kNoticeStep);
  const uint64_t noticesBefore = cluster.network().messagesOfSlot(noticeSlot);
  const TimePoint began = cluster.network().now();
  // The first fault's time, from which the news is counted.
  const std::chrono::nanoseconds at =
      bookFaults(request, cluster, killed, side, stalledForGood, began, faultFree);
  report.killedAtMicros = std::chrono::duration<double, std::micro>(at).count();
  if (request.statusAtMicros >= 0) lookAtStatus(cluster, request, report, began);
  SimCluster::Outcome outcome = cluster.run(
      [&](int, Communicator& comm, CallOptions options) { return buffers.start(comm, options); },
      limit);
  settleFinished(cluster, buffers, killed, limit, outcome, report);
  // A survivor names the set when its group knows every rank of it is gone: counted once the
  // bound has passed since the kill (the news may still travel after the ops ended).
  const TimePoint bound = began + at + request.newsBound;
  if (cluster.network().now() < bound) {
    cluster.runUntil([] { return false; }, std::chrono::duration_cast<std::chrono::milliseconds>(
                                               bound - cluster.network().now()));
  }
  countNamed(request, cluster, outcome, killed, side, began, began + at, report);
  report.failureMessages = cluster.network().messagesOfSlot(noticeSlot) - noticesBefore;
  progress(cluster, faultLine(report));
  if (request.shrink) shrinkAndGoOn(request, cluster, &report, progress);
  report.killDigest = cluster.network().digest();
}

}  // namespace

SimReport simulate(const SimRequest& request) {
  const Progress progress(request);
  SimReport report;
  report.bytes = request.bytes;
  const std::chrono::milliseconds limit = request.cluster.timeout * 2;
  const SimCall call = requestedCall(request);
  const double faultFree = runFaultFree(request, call, limit, progress, report);
  if (request.faulted()) runFaulted(request, call, limit, faultFree, progress, report);
  report.wallSeconds = progress.wallSeconds();
  return report;
}

}  // namespace ddl
