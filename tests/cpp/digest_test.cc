// The simulator's trace digests of a fixed set of runs (shapes, algorithms, collectives, a kill):
// every message delivered, its time, ends, tag and size. A change that is not meant to change
// what the engine does leaves them as recorded here; one that is says so in its commit and
// records the new ones (the failure prints them).
#include <gtest/gtest.h>

#include <bit>

#include "../../csrc/core/sim/simulate.h"
#include "../../csrc/core/topology/links.h"
#include "../../csrc/core/topology/plan_book.h"

namespace ddl::test {
namespace {

constexpr const char* kLinks = kSimulatedLinks;

struct Scenario {
  const char* name;
  std::vector<int> hostSizes;  // empty: `ranks` in hosts of `perHost`
  int ranks, perHost, hostsPerRack;
  const char* collective;
  AllreduceAlgorithm algorithm;
  size_t bytes;
  int killRank;
  bool shrink;
  uint64_t digest;  // of the fault-free run, or of the run with the kill
};

using A = AllreduceAlgorithm;

// One run a line: name, ranks of each host (or P in hosts of /host), racks of /rack hosts, the
// collective, the allreduce algorithm, bytes per rank, a rank killed halfway (-1: none), the
// shrink after it, and the digest.
// clang-format off
const Scenario kScenarios[] = {
  {"auto 1 MiB, 64 ranks in racks", {}, 64, 4, 4, "allreduce", A::kAuto, 1 << 20, -1, false, 0xfdc0a99c3f71b6fbull},
  {"ring, 96 ranks of 8", {}, 96, 8, 0, "allreduce", A::kRing, 4 * 10007, -1, false, 0x118c6ccc61562781ull},
  {"multidim, uneven hosts", {4, 3, 4, 1, 4, 4, 2, 4}, 0, 1, 2, "allreduce", A::kMultiDim, 4 * 10007, -1, false, 0xa0055888c0243b12ull},
  {"leaders", {}, 64, 4, 4, "allreduce", A::kLeaders, 4 * 1031, -1, false, 0x723550f8019db923ull},
  {"recursive doubling, 40 ranks", {}, 40, 4, 0, "allreduce", A::kRecursiveDoubling, 4 * 131, -1, false, 0x83f90756a36e0960ull},
  {"broadcast", {}, 40, 4, 4, "broadcast", A::kAuto, 4 * 4099, -1, false, 0x8ce2a044e9c3aaa9ull},
  {"allgather", {}, 40, 4, 4, "allgather", A::kAuto, 4 * 131, -1, false, 0xdab41015b0f9c72full},
  {"reduce_scatter", {}, 40, 4, 4, "reduce_scatter", A::kAuto, 4 * 131, -1, false, 0xc04dad13c24023e1ull},
  {"reduce", {}, 40, 4, 4, "reduce", A::kAuto, 4 * 131, -1, false, 0x7bc9cebb77a44c2aull},
  {"gather", {}, 40, 4, 4, "gather", A::kAuto, 4 * 131, -1, false, 0xbfe5647d08e5ea3aull},
  {"scatter", {}, 40, 4, 4, "scatter", A::kAuto, 4 * 131, -1, false, 0x7bd750c836dab392ull},
  {"alltoall", {}, 40, 4, 4, "alltoall", A::kAuto, 4 * 131, -1, false, 0x8dd9b489742cfbeaull},
  {"barrier", {}, 40, 4, 4, "barrier", A::kAuto, 0, -1, false, 0x89654d5e970a7e2dull},
  {"rank 17 killed halfway", {}, 64, 4, 4, "allreduce", A::kAuto, 1 << 20, 17, false, 0x16bfe52b37f6a8edull},
  {"rank 5 killed in an allgather", {}, 48, 4, 0, "allgather", A::kAuto, 4 * 1031, 5, false, 0x3076e9afdca08a5full},
  {"rank 5 killed, then the shrink", {}, 64, 4, 0, "allreduce", A::kAuto, 1 << 20, 5, true, 0x17774fb3d1b81d0eull},
};
// clang-format on

TEST(Digest, TheRecordedRunsDeliverTheSameMessagesAtTheSameTimes) {
  for (const Scenario& s : kScenarios) {
    SimRequest q;
    q.cluster.hostSizes = s.hostSizes;
    q.cluster.ranks = s.ranks;
    q.cluster.ranksPerHost = s.perHost;
    q.cluster.hostsPerRack = s.hostsPerRack;
    q.cluster.links = kLinks;
    q.cluster.plan = planRequest();
    q.cluster.plan->algorithm = s.algorithm;
    q.collective = s.collective;
    q.bytes = s.bytes;
    if (s.killRank >= 0) q.killRanks = {s.killRank};
    q.shrink = s.shrink;
    const SimReport r = simulate(q);
    const uint64_t digest = s.killRank >= 0 ? r.killDigest : r.digest;
    EXPECT_EQ(r.mismatch, "") << s.name;
    if (s.shrink) {
      EXPECT_EQ(r.shrinkOpsOk, SimRequest::kShrinkOps) << r.shrinkError;
    }
    EXPECT_EQ(digest, s.digest) << s.name << ": now 0x" << std::hex << digest;
  }
}

// The planner's candidates for a few machines and sizes, as recorded: every one's price (its bits)
// and, for the multidim plans, every ring of every lane. A change to how plans are made or priced
// that is not meant to change them leaves this as it is.
TEST(Digest, ThePlannersCandidatesArePricedAndBuiltAsRecorded) {
  struct Machine {
    int ranks, perHost, hostsPerRack, lastShort;  // the last host `lastShort` ranks short
  };
  uint64_t digest = 1469598103934665603ull;
  auto mix = [&digest](uint64_t v) { digest = (digest ^ v) * 1099511628211ull; };
  for (const Machine m : {Machine{16, 4, 0, 0}, Machine{64, 8, 4, 0}, Machine{60, 4, 5, 1},
                          Machine{256, 8, 4, 3}, Machine{96, 6, 4, 0}, Machine{130, 2, 8, 1}}) {
    std::vector<Locality> where;
    RackMap racks;
    for (int r = 0; r < m.ranks - m.lastShort; ++r) {
      const std::string host = "h" + std::to_string(r / m.perHost);
      where.push_back(Locality{host, "m" + host});
      if (m.hostsPerRack > 0) racks[host] = "r" + std::to_string(r / m.perHost / m.hostsPerRack);
    }
    PlanBook book(buildTopology(where, racks), parseLinks(kLinks), planRequest(), true);
    for (size_t bytes : {size_t{4}, size_t{4096}, size_t{1} << 20, size_t{100000000}}) {
      for (const AllreducePlan& plan : book.candidates(bytes / 4, 4)) {
        mix(static_cast<uint64_t>(plan.algorithm));
        mix(std::bit_cast<uint64_t>(plan.predicted));
        for (const Lane& lane : plan.lanes) {
          mix(lane.range.offset);
          mix(lane.range.length);
          for (const Stage& stage : lane.stages) {
            for (const StageRing& ring : stage.rings) {
              for (int r : ring.order) mix(static_cast<uint64_t>(r));
              for (const Range& c : ring.chunks) mix(c.offset ^ c.length << 32);
              mix(ring.firstStep);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(digest, 0x61fbe208fd953a75ull) << "now 0x" << std::hex << digest;
}

}  // namespace
}  // namespace ddl::test
