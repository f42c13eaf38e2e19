// Allreduce through one host's shared memory: the shared-memory ring (its windows, turns and
// failures), the multidim plan's host level over shared slots, and the direct allreduce of
// tensors in shared buffers (offers, adoption, fallbacks).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>

#include "../../csrc/core/runtime/group_state.h"
#include "../../csrc/core/shm/shared_ring.h"
#include "adoption.h"
#include "collective_checks.h"
#include "harness.h"
#include "values.h"

namespace ddl::test {
namespace {

// Ranks over loopback transports the test can reach: rank r's transport is transports[r].
struct SharedRingWorld {
  // `settings(r)`, where given, holds the environment while rank r's engine takes its settings.
  explicit SharedRingWorld(int size,
                           const std::function<std::unique_ptr<ScopedEnv>(int)>& settings = {}) {
    for (int r = 0; r < size; ++r) {
      std::unique_ptr<ScopedEnv> env = settings ? settings(r) : nullptr;
      auto t = fabric.join();
      transports.push_back(t.get());
      engines.push_back(std::make_unique<Engine>(std::move(t)));
    }
  }
  void run(const RankBody& body, std::chrono::milliseconds timeout = std::chrono::seconds(60),
           const Topology* topology = nullptr) {
    runGroup(engines, body, timeout, topology);
  }
  size_t windowsInUse(int rank) {
    size_t n = 0;
    engines[rank]->call([&] { n = transports[rank]->windowsInUse(); });
    return n;
  }

  LoopbackFabric fabric;
  std::vector<LoopbackTransport*> transports;
  std::vector<std::unique_ptr<Engine>> engines;
};

void sumOfRanks(Communicator& comm, size_t count, float offset = 0) {
  std::vector<float> buf(count, comm.rank() + offset);
  check(comm.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum));
  float want = comm.size() * (comm.size() - 1) / 2.0f + comm.size() * offset;
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], want) << "element " << i;
}

TEST(SharedRing, WindowsLiveWithTheGroupAndAreReleasedAfterIt) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}});
  SharedRingWorld world(3);
  world.run([&](Communicator& comm) {
    sumOfRanks(comm, 100003);
    // Its own inbox and the next rank's, mapped.
    EXPECT_EQ(world.windowsInUse(comm.rank()), 2u);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(world.windowsInUse(r), 0u) << "rank " << r;
}

TEST(SharedRing, FallsBackToTheRingWhenOneRankCannotMapItsNeighbour) {
  ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  SharedRingWorld world(4);
  world.engines[2]->call([&] { world.transports[2]->refuseWindows(true); });
  world.run([&](Communicator& comm) {
    sumOfRanks(comm, 77777);
    sumOfRanks(comm, 100000, 1.5f);
    // Everyone agreed on the message ring and gave back what it had allocated.
    EXPECT_EQ(world.windowsInUse(comm.rank()), 0u);
  });
}

// The host level of a multi-dimensional allreduce over 2 hosts of 2 ranks: over shared-memory
// slots each rank holds, per half (reduce-scatter, allgather), its inbox and the next rank's.
Topology twoHostsOfTwo() {
  std::vector<Locality> ranks;
  for (int h : {0, 0, 1, 1}) {
    ranks.push_back(Locality{"h" + std::to_string(h), "m" + std::to_string(h)});
  }
  return buildTopology(ranks, {});
}

void multiDimSums(Communicator& comm, const Topology& t, bool hostSlots) {
  for (size_t count : {size_t{1}, size_t{1009}, size_t{100003}}) {
    CallOptions options;
    AllreducePlan plan = planMultiDim(t, count, 4, 2, 1);
    plan.hostSlots = hostSlots;
    options.plan = std::make_shared<const AllreducePlan>(std::move(plan));
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(comm.rank() + i % 7);
    check(comm.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum, options));
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(buf[i], 6.0f + 4.0f * static_cast<float>(i % 7)) << "element " << i;
    }
  }
}

TEST(MultiDimSlots, TheHostLevelMovesThroughSharedSlots) {
  ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  const Topology t = twoHostsOfTwo();
  for (bool hostSlots : {true, false}) {
    SharedRingWorld world(4);
    world.run(
        [&](Communicator& comm) {
          multiDimSums(comm, t, hostSlots);
          // Two colours, each with a host ring per half: inbox and mapped outbox each.
          EXPECT_EQ(world.windowsInUse(comm.rank()), hostSlots ? 8u : 0u) << "rank " << comm.rank();
        },
        std::chrono::seconds(60), &t);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(world.windowsInUse(r), 0u) << "rank " << r;
  }
}

TEST(MultiDimSlots, AMismatchLeavesTheHostRingsUsable) {
  // Rank 3 allreduces another count: every rank fails that op, whichever host ring's setup or
  // slots it had reached, and each host's ranks agree again before the next op touches them.
  ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  const Topology t = twoHostsOfTwo();
  for (bool setUpFirst : {true, false}) {
    SharedRingWorld world(4);
    std::vector<std::string> errors(4);
    world.run(
        [&](Communicator& comm) {
          if (setUpFirst) multiDimSums(comm, t, true);
          const size_t count = comm.rank() == 3 ? 100003 : 100004;
          CallOptions options;
          options.plan = std::make_shared<const AllreducePlan>(planMultiDim(t, count, 4, 2, 1));
          std::vector<float> buf(count, 1.0f);
          auto w = comm.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum, options);
          w->wait();
          errors[comm.rank()] = w->error();
          multiDimSums(comm, t, true);
          EXPECT_EQ(world.windowsInUse(comm.rank()), 8u) << "rank " << comm.rank();
        },
        std::chrono::seconds(60), &t);
    for (int r = 0; r < 4; ++r) {
      EXPECT_NE(errors[r].find("100003"), std::string::npos) << "rank " << r << ": " << errors[r];
      EXPECT_EQ(world.windowsInUse(r), 0u) << "rank " << r;
    }
  }
}

TEST(MultiDimSlots, AHostWhoseRanksCannotMapEachOtherUsesMessages) {
  ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  const Topology t = twoHostsOfTwo();
  SharedRingWorld world(4);
  world.engines[3]->call([&] { world.transports[3]->refuseWindows(true); });
  world.run(
      [&](Communicator& comm) {
        multiDimSums(comm, t, true);
        // Host 0 over slots; host 1, where rank 3 refuses, over messages.
        EXPECT_EQ(world.windowsInUse(comm.rank()), comm.rank() < 2 ? 8u : 0u)
            << "rank " << comm.rank();
      },
      std::chrono::seconds(60), &t);
}

TEST(SharedRing, RequiredButUnavailableIsAnErrorOnEveryRank) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}});
  SharedRingWorld world(3);
  world.engines[1]->call([&] { world.transports[1]->refuseWindows(true); });
  std::vector<std::string> errors(3);
  world.run([&](Communicator& comm) {
    for (int k = 0; k < 2; ++k) {  // the second time without asking the peers again
      std::vector<float> buf(100000, 1.0f);
      auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
      w->wait();
      errors[comm.rank()] += w->error() + "\n";
    }
    check(comm.barrier());  // the group itself is fine
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("not every rank of the group can map its neighbour's shared memory"),
              std::string::npos)
        << e;
    EXPECT_EQ(e.find("unusable"), std::string::npos) << e;
  }
}

// Eight allreduces of 3 ranks posted before any is waited on, of different sizes, mixed with
// barriers: they take turns at the group's windows.
void opsInFlightTakeTurns() {
  SharedRingWorld world(3);
  world.run([&](Communicator& comm) {
    // Posted before any is waited on, of different sizes, mixed with other collectives.
    std::vector<std::vector<float>> bufs;
    std::vector<std::shared_ptr<Work>> works;
    for (size_t k = 0; k < 8; ++k) bufs.emplace_back(1000 + 7919 * k, comm.rank() + float(k));
    for (size_t k = 0; k < bufs.size(); ++k) {
      works.push_back(
          comm.allreduce(bufs[k].data(), bufs[k].size(), DataType::kFloat32, ReduceOp::kSum));
      if (k % 3 == 0) works.push_back(comm.barrier());
    }
    for (auto& w : works) check(w);
    for (size_t k = 0; k < bufs.size(); ++k) {
      float want = 3.0f + 3.0f * k;
      for (float v : bufs[k]) ASSERT_EQ(v, want) << "op " << k;
    }
  });
}

TEST(SharedRing, OpsInFlightTakeTurns) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}, {"TORCH_DDL_SEGMENT_BYTES", "1024"}});
  opsInFlightTakeTurns();
}

TEST(SharedRing, DisagreeingCountsFailFastAndTheRingIsMendedForTheNextOp) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}});
  SharedRingWorld world(2);
  std::vector<std::string> first(2), second(2);
  world.run(
      [&](Communicator& comm) {
        sumOfRanks(comm, 4096);  // sets the ring up
        std::vector<float> buf(comm.rank() == 0 ? 1000 : 2000, 1.0f);
        auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        w->wait();
        first[comm.rank()] = w->error();
        w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        w->wait();
        second[comm.rank()] = w->error();
        // However far each rank got into the ring before it learned, the ranks agree on the
        // windows again before the next op touches them.
        sumOfRanks(comm, 4096, 0.5f);
        sumOfRanks(comm, 100003, 1.5f);
        EXPECT_EQ(world.windowsInUse(comm.rank()), 2u);  // none set up twice
      },
      std::chrono::seconds(20));
  // The call check finds it first (the ring's own check of the counts is behind it).
  for (const std::string& e : first) {
    EXPECT_NE(e.find("all_reduce(SUM, 1000 x float32)"), std::string::npos) << e;
    EXPECT_NE(e.find("all_reduce(SUM, 2000 x float32)"), std::string::npos) << e;
  }
  for (const std::string& e : second) {
    EXPECT_NE(e.find("the ranks' calls differ"), std::string::npos) << e;
  }
}

TEST(SharedRing, EveryRankLearnsOfADisagreement) {
  // Only ranks 2 and 0 see a neighbour with another count; rank 1 learns it from a notice.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}});
  SharedRingWorld world(3);
  std::vector<std::string> errors(3);
  world.run(
      [&](Communicator& comm) {
        std::vector<float> buf(comm.rank() == 2 ? 3000 : 6000, 1.0f);
        auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        w->wait();
        errors[comm.rank()] = w->error();
      },
      std::chrono::seconds(20));
  // Ranks 0 and 2 find it in their neighbour's call check; rank 1 in its own or in a notice.
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("the ranks' calls differ"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("called all_reduce(SUM, 3000 x float32)"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("called all_reduce(SUM, 6000 x float32)"), std::string::npos)
        << errors[r];
  }
}

TEST(SharedRing, AResyncMendsEveryMismatchOfTheOpsBeforeIt) {
  // What a rank decides as an op starts: resync first while the latest mismatched op it knows of
  // is not before the last resync. News of an older one that arrives late asks for none (the
  // ranks that knew of it made the op after it fail, and so resync together at the next).
  SharedRing ring(nullptr);  // holds no windows
  EXPECT_FALSE(resyncDue(std::nullopt, ring));
  EXPECT_TRUE(resyncDue(7u, ring));
  ring.resyncedAt = 9;
  EXPECT_FALSE(resyncDue(std::nullopt, ring));
  EXPECT_FALSE(resyncDue(7u, ring));
  EXPECT_FALSE(resyncDue(8u, ring));
  EXPECT_TRUE(resyncDue(9u, ring));  // the op that resynced failed by a mismatch after it
  EXPECT_TRUE(resyncDue(12u, ring));
  ring.resyncedAt = 2;  // op numbers wrap
  EXPECT_FALSE(resyncDue(0xfffffffeu, ring));
  EXPECT_TRUE(resyncDue(3u, ring));
  // The latest is kept, whatever order the news comes in.
  GroupState state;
  EXPECT_FALSE(state.lastMismatch());
  state.countMismatch(0xfffffffeu);
  state.countMismatch(1);
  state.countMismatch(0xffffffffu);
  EXPECT_EQ(state.lastMismatch(), 1u);
}

TEST(SharedRing, TimeoutNamesTheMissingRank) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}});
  SharedRingWorld world(3);
  std::string message;
  world.run(
      [&](Communicator& comm) {
        sumOfRanks(comm, 50000);
        if (comm.rank() == 2) return;  // leaves the second one
        std::vector<float> buf(50000, 1.0f);
        auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        w->wait();
        EXPECT_TRUE(w->failed());
        if (comm.rank() == 0) message = w->error();  // rank 0 waits on rank 2's notices
      },
      std::chrono::milliseconds(300));
  EXPECT_NE(message.find("Timed out after 300 ms"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 2"), std::string::npos) << message;
}

// Staged allreduce: medium tensors not in shared buffers, through staging buffers every rank maps.
TEST(Staged, BuffersLiveWithTheGroupAndAreReleasedAfterIt) {
  SharedRingWorld world(3);
  world.run([&](Communicator& comm) {
    sumOfRanks(comm, 100003);
    sumOfRanks(comm, 70001, 2.5f);
    // The ring's inbox and its neighbour's (set up first), its own staging buffer and its two
    // peers'.
    EXPECT_EQ(world.windowsInUse(comm.rank()), 5u);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(world.windowsInUse(r), 0u) << "rank " << r;
}

TEST(Staged, RanksThatCannotShareStagingBuffersTakeTheRingOrFail) {
  // Rank 1 can map no window once the ring's are set up (say /dev/shm is full): no rank stages,
  // every rank agrees. (Ranks whose TORCH_DDL_STAGED_BYTES differ, the other way to get here,
  // are no longer made a group: GroupState.RanksWhoseSettingsChooseDifferentPathsAreNotMadeAGroup.)
  auto mapsNoMore = [](SharedRingWorld& world, Communicator& comm) {
    std::vector<float> ring(300007, 1.0f);  // above TORCH_DDL_STAGED_BYTES: the ring's windows
    check(comm.allreduce(ring.data(), ring.size(), DataType::kFloat32, ReduceOp::kSum));
    if (comm.rank() == 1) world.engines[1]->call([&] { world.transports[1]->refuseWindows(true); });
    check(comm.barrier());
  };
  {
    ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "auto"}});
    SharedRingWorld world(3);
    world.run([&](Communicator& comm) {
      mapsNoMore(world, comm);
      sumOfRanks(comm, 100003);
      sumOfRanks(comm, 70001, 1.5f);
      EXPECT_EQ(world.windowsInUse(comm.rank()), 2u);  // the ring's alone
    });
  }
  // Forced, where rank 1 maps nothing at all: refused on every rank.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}});
  SharedRingWorld forced(3);
  forced.transports[1]->refuseWindows(true);
  std::vector<std::string> errors(3);
  forced.run([&](Communicator& comm) {
    std::vector<float> buf(1000, 1.0f);
    auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    w->wait();
    errors[comm.rank()] = w->error();
    check(comm.barrier());  // the group itself is fine
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("TORCH_DDL_ALLREDUCE_ALGO=staged, but not every rank"), std::string::npos)
        << e;
  }
}

TEST(Staged, HalvesSmallerThanAnElementAreRefusedOnEveryRank) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}, {"TORCH_DDL_STAGED_BYTES", "4"}});
  SharedRingWorld world(2);
  std::vector<std::string> errors(2);
  world.run([&](Communicator& comm) {
    sumOfRanks(comm, 9);  // float32: pieces of one element
    std::vector<double> buf(5, 1.0);
    auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat64, ReduceOp::kSum);
    w->wait();
    errors[comm.rank()] = w->error();
    sumOfRanks(comm, 9, 1.0f);  // the group and its buffers are fine
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("smaller than one element"), std::string::npos) << e;
  }
}

TEST(Staged, EveryRankEndsWithTheSameBitsWhereTheOrderOfReducingMatters) {
  // Each element is reduced once, by one rank, whose result every rank copies. One piece and
  // many, both halves.
  for (const char* half : {"64", "524288"}) {
    ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}, {"TORCH_DDL_STAGED_BYTES", half}});
    for (int n : {2, 3}) {
      SharedRingWorld world(n);
      std::vector<std::vector<float>> results(n);
      world.run([&](Communicator& comm) { reduceOrderSensitive(comm, 1031, results); });
      EXPECT_EQ(firstDifference(results), "") << n << " ranks, halves of " << half << " bytes";
    }
  }
}

TEST(Staged, OpsInFlightTakeTurns) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}, {"TORCH_DDL_STAGED_BYTES", "4096"}});
  opsInFlightTakeTurns();
}

TEST(Staged, DisagreeingCountsFailEveryRankAndTheNextOpsGoOn) {
  // The counts differ past the first piece: the header's total finds it before any byte of a
  // peer is used. The ranks may have staged different numbers of pieces by then: they agree on
  // the count again before the next op stages.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}, {"TORCH_DDL_STAGED_BYTES", "4096"}});
  for (int n : {2, 3}) {
    SharedRingWorld world(n);
    std::vector<std::string> errors(n);
    world.run(
        [&](Communicator& comm) {
          sumOfRanks(comm, 5000);  // sets the buffers up
          const size_t windows = world.windowsInUse(comm.rank());
          std::vector<float> buf(comm.rank() == n - 1 ? 3000 : 6000, 1.0f);
          auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
          w->wait();
          errors[comm.rank()] = w->error();
          sumOfRanks(comm, 5000, 0.5f);
          sumOfRanks(comm, 1, 1.5f);
          EXPECT_EQ(world.windowsInUse(comm.rank()), windows);  // set up once
          if (n == 3) EXPECT_EQ(windows, 5u);                   // the ring's 2 and the staging 3
        },
        std::chrono::seconds(20));
    // Every rank sees every header; the call check may name the calls first.
    for (int r = 0; r < n; ++r) {
      const std::string& e = errors[r];
      EXPECT_TRUE(e.find("SUM of 3000 x float32") != std::string::npos ||
                  e.find("all_reduce(SUM, 3000 x float32)") != std::string::npos)
          << n << " ranks, rank " << r << ": " << e;
    }
  }
}

TEST(Staged, AMismatchThatCutsTheSetUpShortLeavesNothingHalfSetUp) {
  // The group's first staged op is the mismatched one: every rank's setup is cut short before
  // any verdict (the first rank sends it only once every call print agreed), so what each
  // allocated or mapped goes, and the next op sets the buffers up again, on every rank.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}});
  for (int odd = 0; odd < 4; ++odd) {
    SharedRingWorld world(4);
    std::vector<std::string> errors(4);
    world.run(
        [&](Communicator& comm) {
          std::vector<float> buf(comm.rank() == odd ? 4099 : 4100, 1.0f);
          auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
          w->wait();
          errors[comm.rank()] = w->error();
          sumOfRanks(comm, 1031);
          sumOfRanks(comm, 4099, 0.5f);
          // The ring's 2 and the staging 4, as one clean op leaves them.
          EXPECT_EQ(world.windowsInUse(comm.rank()), 6u) << "rank " << comm.rank();
        },
        std::chrono::seconds(20));
    for (int r = 0; r < 4; ++r) {
      EXPECT_NE(errors[r].find("4099 x float32"), std::string::npos)
          << "odd rank " << odd << ": " << errors[r];
    }
    for (int r = 0; r < 4; ++r) EXPECT_EQ(world.windowsInUse(r), 0u) << "rank " << r;
  }
}

TEST(Staged, TimeoutNamesTheMissingRank) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}});
  for (int n : {2, 3}) {
    const int gone = n - 1;
    SharedRingWorld world(n);
    std::vector<std::string> messages(n);
    world.run(
        [&](Communicator& comm) {
          sumOfRanks(comm, 50000);
          if (comm.rank() == gone) return;  // leaves the second one
          std::vector<float> buf(50000, 1.0f);
          auto w = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
          w->wait();
          EXPECT_TRUE(w->failed());
          messages[comm.rank()] = w->error();
        },
        std::chrono::milliseconds(300));
    for (int r = 0; r < gone; ++r) {
      // Rank 0 misses the last rank's call print as well: the runtime's words name it there.
      const size_t at = messages[r].find("Timed out after 300 ms");
      ASSERT_NE(at, std::string::npos) << messages[r];
      const std::string why = messages[r].substr(at);
      // The last rank alone is named late; rank 0 may be named as the one that saw no call.
      const std::string rank = "rank " + std::to_string(gone);
      EXPECT_NE(why.find(rank + " has not started this op"), std::string::npos) << why;
      for (int other = 0; other < gone; ++other) {
        for (const char* late : {"rank %d has", "to rank %d"}) {
          char words[32];
          std::snprintf(words, sizeof(words), late, other);
          EXPECT_EQ(why.find(words), std::string::npos) << why;
        }
      }
    }
  }
}

// Direct allreduce: tensors in shared buffers on every rank.
void fillAndSum(Communicator& comm, float* data, size_t count, float offset) {
  std::fill(data, data + count, comm.rank() + offset);
  check(comm.allreduce(data, count, DataType::kFloat32, ReduceOp::kSum));
  float want = comm.size() * (comm.size() - 1) / 2.0f + comm.size() * offset;
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], want) << "element " << i;
}

float* floats(SharedBuffer& b) { return reinterpret_cast<float*>(b.data()); }

TEST(Direct, PeersLetGoOfBuffersTheirOwnerReleased) {
  SharedRingWorld world(3);
  world.run([&](Communicator& comm) {
    {
      SharedBuffer a(comm.engine(), 100000 * sizeof(float));
      fillAndSum(comm, floats(a), 100000, 0);
      // The ring's two windows, its own buffer and the two peers' buffers, mapped.
      EXPECT_EQ(world.windowsInUse(comm.rank()), 5u);
    }
    SharedBuffer b(comm.engine(), 50000 * sizeof(float));
    fillAndSum(comm, floats(b), 50000, 2);
    fillAndSum(comm, floats(b), 50000, 1);
    // The peers said they released `a`: its mappings are gone, `b`'s took their place.
    EXPECT_EQ(world.windowsInUse(comm.rank()), 5u);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(world.windowsInUse(r), 0u) << "rank " << r;
}

TEST(Direct, OneRankWithoutASharedBufferMeansTheRingOrAnError) {
  SharedRingWorld world(3);
  std::vector<std::string> errors(3);
  auto body = [&](Communicator& comm, bool required) {
    SharedBuffer shared(comm.engine(), 70001 * sizeof(float));
    std::vector<float> local(70001);
    float* data = comm.rank() == 1 ? local.data() : floats(shared);
    if (required) {
      auto w = comm.allreduce(data, 70001, DataType::kFloat32, ReduceOp::kSum);
      w->wait();
      errors[comm.rank()] = w->error();
    }
    fillAndSum(comm, data, 70001, 0.5f);  // auto: the shared ring; direct: the error again
  };
  world.run([&](Communicator& comm) { body(comm, false); });
  // An engine takes its settings when it is made: the forced algorithm needs engines of its own.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "direct"}});
  SharedRingWorld forced(3);
  EXPECT_THROW(forced.run([&](Communicator& comm) { body(comm, true); }), Error);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("TORCH_DDL_ALLREDUCE_ALGO=direct, but the tensor of rank(s) 1 is not in a "
                     "shared buffer"),
              std::string::npos)
        << e;
  }
}

TEST(Direct, DisagreeingCountsFailEveryRankAndBreakNothing) {
  SharedRingWorld world(3);
  std::vector<std::string> errors(3);
  world.run(
      [&](Communicator& comm) {
        SharedBuffer b(comm.engine(), 40000 * sizeof(float));
        fillAndSum(comm, floats(b), 40000, 3);  // sets up the windows
        size_t count = comm.rank() == 2 ? 30000 : 40000;
        auto w = comm.allreduce(floats(b), count, DataType::kFloat32, ReduceOp::kSum);
        w->wait();
        errors[comm.rank()] = w->error();
        fillAndSum(comm, floats(b), 40000, 3);
      },
      std::chrono::seconds(20));
  // Every rank sees every rank's call check before its offer: all fail before any byte moves.
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("all_reduce(SUM, 30000 x float32)"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("all_reduce(SUM, 40000 x float32)"), std::string::npos) << errors[r];
  }
}

TEST(Direct, OpsInFlightOnSeveralBuffersAndTwiceOnOne) {
  SharedRingWorld world(3);
  world.run([&](Communicator& comm) {
    std::vector<std::unique_ptr<SharedBuffer>> bufs;
    std::vector<size_t> counts;
    std::vector<std::shared_ptr<Work>> works;
    for (size_t k = 0; k < 5; ++k) {
      counts.push_back(20000 + 7919 * k);
      bufs.push_back(std::make_unique<SharedBuffer>(comm.engine(), counts[k] * sizeof(float)));
      std::fill(floats(*bufs[k]), floats(*bufs[k]) + counts[k], comm.rank() + float(k));
    }
    for (size_t k = 0; k < bufs.size(); ++k) {
      works.push_back(
          comm.allreduce(floats(*bufs[k]), counts[k], DataType::kFloat32, ReduceOp::kSum));
      if (k == 2) works.push_back(comm.barrier());
    }
    // The first again: it must see the first result, summed over the ranks once more.
    works.push_back(
        comm.allreduce(floats(*bufs[0]), counts[0], DataType::kFloat32, ReduceOp::kSum));
    for (auto& w : works) check(w);
    for (size_t k = 0; k < bufs.size(); ++k) {
      float want = (3.0f + 3.0f * k) * (k == 0 ? 3.0f : 1.0f);
      for (size_t i = 0; i < counts[k]; ++i) ASSERT_EQ(floats(*bufs[k])[i], want) << "op " << k;
    }
  });
}

TEST(Direct, TimeoutNamesTheMissingRank) {
  SharedRingWorld world(3);
  std::vector<std::string> errors(3);
  world.run(
      [&](Communicator& comm) {
        SharedBuffer b(comm.engine(), 50000 * sizeof(float));
        fillAndSum(comm, floats(b), 50000, 0);
        if (comm.rank() == 2) return;  // leaves the second one
        auto w = comm.allreduce(floats(b), 50000, DataType::kFloat32, ReduceOp::kSum);
        w->wait();
        errors[comm.rank()] = w->error();
      },
      std::chrono::milliseconds(300));
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("Timed out after 300 ms"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 2"), std::string::npos) << errors[r];
  }
}

TEST(Direct, AGroupOfPrivateTensorsAsksAgainOnlyForLargeOnes) {
  // Mapped peer buffers show whether the direct allreduce ran.
  ScopedEnv env({{"TORCH_DDL_DIRECT_MIN_BYTES", "1000000"}});
  SharedRingWorld world(2);
  world.run([&](Communicator& comm) {
    std::vector<float> local(100000);
    SharedBuffer small(comm.engine(), 100000 * sizeof(float));
    SharedBuffer large(comm.engine(), 300000 * sizeof(float));
    fillAndSum(comm, local.data(), 100000, 0);  // asks: not all shared (then: staged)
    // The ring's two, the staging buffers (its own and its peer's), its own two buffers.
    EXPECT_EQ(world.windowsInUse(comm.rank()), 6u);
    fillAndSum(comm, floats(small), 100000, 1);  // below the threshold: does not ask
    EXPECT_EQ(world.windowsInUse(comm.rank()), 6u);
    fillAndSum(comm, floats(large), 300000, 2);  // asks: direct, maps the peer's `large`
    EXPECT_EQ(world.windowsInUse(comm.rank()), 7u);
    fillAndSum(comm, floats(small), 100000, 3);  // the last answer was yes: direct
    EXPECT_EQ(world.windowsInUse(comm.rank()), 8u);
  });
}

TEST(Direct, AdoptableTensorsAreAdoptedAndReduceDirectly) {
  // What the glue passes for a tensor it has seen allreduced before: the block holding it.
  constexpr size_t kCount = 700001;
  SharedRingWorld world(3);
  const size_t before = memfdMappings();
  std::vector<size_t> during(3);
  world.run([&](Communicator& comm) {
    char* block = glibcBlock(kCount * sizeof(float));
    float* data = reinterpret_cast<float*>(block);
    for (float offset : {0.0f, 1.5f, 4.0f}) {
      std::fill(data, data + kCount, comm.rank() + offset);
      CallOptions options;
      options.adoptable = Adoptable{block, kCount * sizeof(float)};
      check(comm.allreduce(data + 5, kCount - 5, DataType::kFloat32, ReduceOp::kSum, options));
      const float want = 3.0f + 3.0f * offset;
      for (size_t i = 5; i < kCount; ++i) ASSERT_EQ(data[i], want) << "element " << i;
      for (size_t i = 0; i < 5; ++i) ASSERT_EQ(data[i], comm.rank() + offset);
    }
    EXPECT_EQ(comm.engine().sharedBuffers()->adopted(), 1u);
    check(comm.barrier());
    during[comm.rank()] = memfdMappings();
    check(comm.barrier());
    std::free(block);
  });
  // Each rank's block, and each rank's mappings of its two peers' blocks.
  for (int r = 0; r < 3; ++r) EXPECT_EQ(during[r], before + 9) << "rank " << r;
}

TEST(Direct, AdoptionWhereSomeRankCannotMeansTheRing) {
  // Rank 1's tensor is not a block of its own: no direct path, the right sums all the same.
  constexpr size_t kCount = 300007;
  SharedRingWorld world(2);
  world.run([&](Communicator& comm) {
    char* block = glibcBlock((kCount + 16) * sizeof(float));
    float* data = reinterpret_cast<float*>(block) + (comm.rank() == 1 ? 16 : 0);
    for (float offset : {0.0f, 2.0f}) {
      std::fill(data, data + kCount, comm.rank() + offset);
      CallOptions options;
      options.adoptable = Adoptable{data, kCount * sizeof(float)};
      check(comm.allreduce(data, kCount, DataType::kFloat32, ReduceOp::kSum, options));
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(data[i], 1.0f + 2 * offset);
    }
    EXPECT_EQ(comm.engine().sharedBuffers()->adopted(), comm.rank() == 0 ? 1u : 0u);
    std::free(block);
  });
}

}  // namespace
}  // namespace ddl::test
