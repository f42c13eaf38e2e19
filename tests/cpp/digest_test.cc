// The simulator's trace digests of a fixed set of runs (shapes, algorithms, collectives, a kill):
// every message delivered, its time, ends, tag and size. A change that is not meant to change
// what the engine does leaves them as recorded here; one that is says so in its commit and
// records the new ones (the failure prints them).
#include <gtest/gtest.h>

#include "../../csrc/core/sim/simulate.h"

namespace ddl::test {
namespace {

constexpr const char* kLinks = "0:2us:20GB,1:5us:12.5GB,2:8us:6GB";

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
  {"auto 1 MiB, 64 ranks in racks", {}, 64, 4, 4, "allreduce", A::kAuto, 1 << 20, -1, false, 0x787c40b7d2782120ull},
  {"ring, 96 ranks of 8", {}, 96, 8, 0, "allreduce", A::kRing, 4 * 10007, -1, false, 0xf3731338f0e137e4ull},
  {"multidim, uneven hosts", {4, 3, 4, 1, 4, 4, 2, 4}, 0, 1, 2, "allreduce", A::kMultiDim, 4 * 10007, -1, false, 0x75c72295ffa47558ull},
  {"leaders", {}, 64, 4, 4, "allreduce", A::kLeaders, 4 * 1031, -1, false, 0xd13a5b9a5cc365afull},
  {"recursive doubling, 40 ranks", {}, 40, 4, 0, "allreduce", A::kRecursiveDoubling, 4 * 131, -1, false, 0xaecedc66dd767e8aull},
  {"broadcast", {}, 40, 4, 4, "broadcast", A::kAuto, 4 * 4099, -1, false, 0x9d2dbd658de42f50ull},
  {"allgather", {}, 40, 4, 4, "allgather", A::kAuto, 4 * 131, -1, false, 0x06fd50f784d43452ull},
  {"reduce_scatter", {}, 40, 4, 4, "reduce_scatter", A::kAuto, 4 * 131, -1, false, 0xc6b9840c258d873aull},
  {"reduce", {}, 40, 4, 4, "reduce", A::kAuto, 4 * 131, -1, false, 0x6d772615583f6912ull},
  {"gather", {}, 40, 4, 4, "gather", A::kAuto, 4 * 131, -1, false, 0xfa451b193a30cf62ull},
  {"scatter", {}, 40, 4, 4, "scatter", A::kAuto, 4 * 131, -1, false, 0xbc0c2cc1a4d930e2ull},
  {"alltoall", {}, 40, 4, 4, "alltoall", A::kAuto, 4 * 131, -1, false, 0xa3f5712af9f07d72ull},
  {"barrier", {}, 40, 4, 4, "barrier", A::kAuto, 0, -1, false, 0x78d789b70cead0e2ull},
  {"rank 17 killed halfway", {}, 64, 4, 4, "allreduce", A::kAuto, 1 << 20, 17, false, 0x8e2a68779e1f88d8ull},
  {"rank 5 killed in an allgather", {}, 48, 4, 0, "allgather", A::kAuto, 4 * 1031, 5, false, 0x73df7c698d5b4bc0ull},
  {"rank 5 killed, then the shrink", {}, 64, 4, 0, "allreduce", A::kAuto, 1 << 20, 5, true, 0xc859540215cfbd8aull},
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

}  // namespace
}  // namespace ddl::test
