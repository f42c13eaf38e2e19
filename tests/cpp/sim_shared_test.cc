// The simulator's shared memory (ClusterSpec::sharedMemory): the ranks of a simulated host map
// each other's windows, so that one host's allreduces take the paths a real host's take (in one
// step, on the caller's thread, staged, through slots), with faults, every result checked.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "../../csrc/core/sim/calls.h"
#include "../../csrc/core/sim/cluster.h"
#include "../../csrc/core/sim/paths.h"
#include "harness.h"

namespace ddl::test {
namespace {

ClusterSpec oneHost(int ranks, bool shared) {
  ClusterSpec spec;
  spec.hostSizes = {ranks};
  spec.links = kSimulatedLinks;
  spec.timeout = std::chrono::milliseconds(5000);
  spec.sharedMemory = shared;
  return spec;
}

// Runs `call` on every live rank of the cluster's group (or `other` on rank `odd`) and returns
// how each ended.
SimCluster::Outcome runCall(SimCluster& cluster, SimCallBuffers& buffers, int odd = -1,
                            const SimCall* other = nullptr) {
  return cluster.run(
      [&](int r, Communicator& comm, CallOptions options) {
        return buffers.start(comm, options, r == odd ? other : nullptr);
      },
      std::chrono::milliseconds(8000));
}

// Seeds whose low bits make every rank's caller wait at once (SimCallBuffers::start), or none.
constexpr uint64_t kAllWait = 0xff, kNoneWaits = 0x100;

// Makes the cluster's group and sets its staging windows up: an allreduce of `count` floats
// that every caller waits for, returned to be called again.
SimCall warmUp(SimCluster& cluster, size_t count) {
  cluster.createGroup();
  SimCall call;
  call.count = count;
  call.seed = kAllWait;
  SimCallBuffers warm(call, cluster.size(), true);
  runCall(cluster, warm);
  return call;
}

TEST(SimSharedMemory, OneHostsAllreducesSumRightOnEveryPathTheyTake) {
  // Sizes for one step (on the caller's thread where it waits, else in an op), staged, and
  // through slots; callers that all wait, none, and half.
  for (bool shared : {false, true}) {
    SimCluster cluster(oneHost(4, shared));
    cluster.createGroup();
    for (size_t count : {size_t{1}, size_t{7}, size_t{1031}, size_t{70001}, size_t{200003}}) {
      for (uint64_t seed : {kAllWait, kNoneWaits, uint64_t{0x5a}}) {
        SimCall call;
        call.count = count;
        call.seed = seed;
        SimCallBuffers buffers(call, 4, true);
        const SimCluster::Outcome outcome = runCall(cluster, buffers);
        for (int r = 0; r < 4; ++r) {
          ASSERT_TRUE(outcome.statuses[r].ok()) << outcome.errors[r];
          EXPECT_EQ(buffers.check(r), "")
              << count << " floats, rank " << r << ", shared " << shared;
        }
      }
    }
    if (shared) {
      // Each op that all callers wait for: the last to call finds the others' data staged and
      // ends it on its own thread; the first ones find theirs missing and hand over.
      EXPECT_GT(cluster.quickOps(), 0u);
      EXPECT_GT(cluster.handedOps(), 0u);
    } else {
      EXPECT_EQ(cluster.quickOps() + cluster.handedOps(), 0u);
    }
  }
}

TEST(SimSharedMemory, ARankDeadBeforeTheCallFailsTheHandedOverOpsNamingIt) {
  SimCluster cluster(oneHost(4, true));
  SimCall call = warmUp(cluster, 7);
  cluster.network().kill(3, cluster.network().now());
  cluster.runUntil([] { return false; }, std::chrono::milliseconds(1));  // it dies
  ASSERT_TRUE(cluster.network().dead(3));
  call.seed = kAllWait + 0x200;
  SimCallBuffers buffers(call, 4, true);
  const SimCluster::Outcome outcome = runCall(cluster, buffers);
  const std::vector<int> clusterOf = {0, 1, 2, 3};
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(outcome.ended[r].has_value()) << "rank " << r;
    EXPECT_FALSE(outcome.statuses[r].ok()) << "rank " << r;
    EXPECT_TRUE(namesRank(outcome.statuses[r], 3, clusterOf)) << outcome.errors[r];
  }
}

TEST(SimSharedMemory, AnotherCountOnOneRankFailsEveryRankAsAMismatchAndTheNextOpSums) {
  SimCluster cluster(oneHost(4, true));
  SimCall call = warmUp(cluster, 31);
  SimCall other = call;
  other.count = 32;
  SimCallBuffers buffers(call, 4, true);
  const SimCluster::Outcome outcome = runCall(cluster, buffers, 2, &other);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(outcome.ended[r].has_value()) << "rank " << r;
    EXPECT_EQ(outcome.statuses[r].kind, StatusKind::kMismatch) << outcome.errors[r];
  }
  call.seed = kAllWait + 0x400;
  SimCallBuffers next(call, 4, true);
  const SimCluster::Outcome after = runCall(cluster, next);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(after.statuses[r].ok()) << after.errors[r];
    EXPECT_EQ(next.check(r), "") << "rank " << r;
  }
}

}  // namespace
}  // namespace ddl::test
