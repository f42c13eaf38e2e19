// The one-step allreduce (algorithms/allreduce_staged.cc, plan.once) and the quick path that runs
// it on a waiting caller's thread (group/quick.cc): results, the two forms meeting in one op,
// a late peer, calls that differ, and a rank that never comes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "harness.h"
#include "values.h"

namespace ddl::test {
namespace {

// Ranks over the loopback, engines the test can look at, with the one-step allreduce on
// (TORCH_DDL_ONCE_BYTES, its default, set here whatever the environment says).
struct OnceWorld {
  explicit OnceWorld(int size) {
    for (int r = 0; r < size; ++r) engines.push_back(std::make_unique<Engine>(fabric.join()));
  }
  void run(const RankBody& body, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    runGroup(engines, body, timeout);
  }
  uint64_t quick(int rank) const { return engines[rank]->runtime().stats().quickOps(); }
  uint64_t handed(int rank) const { return engines[rank]->runtime().stats().handedOps(); }

  ScopedEnv env{{"TORCH_DDL_ONCE_BYTES", "65536"}};  // while the world lives
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Engine>> engines;
};

CallOptions waitedFor(bool waited = true) {
  CallOptions options;
  options.waited = waited;
  return options;
}

// An allreduce of every type and op at `count` (waited for where `waited`), checked exactly.
void allreduceCase(Communicator& comm, DataType t, ReduceOp op, size_t count, bool waited) {
  std::vector<char> buf(count * elementSize(t) + 1);
  for (size_t i = 0; i < count; ++i)
    storeValue(t, buf.data(), i, inputValue(t, op, comm.rank(), i));
  check(comm.allreduce(buf.data(), count, t, op, waitedFor(waited)));
  for (size_t i = 0; i < count; ++i) {
    const double want = expectedValue(t, op, comm.size(), i);
    const double got = loadValue(t, buf.data(), i);
    if (std::fabs(got - want) > tolerance(t, op, want)) {
      throw Error(
          describe("one-step allreduce", comm.size(), comm.rank(), t, op, count, i, got, want));
    }
  }
}

void sumOf(Communicator& comm, size_t count, float offset, bool waited) {
  std::vector<float> buf(count, comm.rank() + offset);
  check(comm.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum, waitedFor(waited)));
  const float want = comm.size() * (comm.size() - 1) / 2.0f + comm.size() * offset;
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], want) << "element " << i;
}

TEST(Once, EveryTypeAndOpSumsRightOnTheCallersThreadAndInAnOp) {
  for (int n : {2, 3, 4}) {
    OnceWorld world(n);
    world.run([&](Communicator& comm) {
      sumOf(comm, 1000, 0, true);  // sets the staging buffers up
      for (DataType t : kAllTypes) {
        for (ReduceOp op : kAllOps) {
          if (!checkReduceOp(t, op).empty()) continue;
          // Waited for by some ranks and not by others: both forms meet in one op.
          for (size_t count : {size_t{1}, size_t{7}, size_t{1031}}) {
            allreduceCase(comm, t, op, count, (count + comm.rank()) % 3 != 0);
          }
        }
      }
    });
    for (int r = 0; r < n; ++r) EXPECT_GT(world.quick(r), 0u) << n << " ranks, rank " << r;
  }
}

TEST(Once, EveryRankEndsWithTheSameBits) {
  for (int n : {2, 3, 4}) {
    OnceWorld world(n);
    std::vector<std::vector<float>> results(n);
    world.run([&](Communicator& comm) {
      sumOf(comm, 16, 0, true);
      reduceOrderSensitive(comm, 1031, results);
    });
    EXPECT_EQ(firstDifference(results), "") << n << " ranks";
  }
}

TEST(Once, AQuickCallerWhosePeerIsLateHandsTheOpOverAndItEndsRight) {
  // Rank 0 waits in every call; the others come 20 ms late to every other one: rank 0's caller
  // stages, spins, and an op takes over and ends once they come.
  OnceWorld world(3);
  world.run([&](Communicator& comm) {
    sumOf(comm, 64, 0, true);
    for (int i = 0; i < 6; ++i) {
      if (comm.rank() != 0 && i % 2 == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      sumOf(comm, 1 + 97 * i, static_cast<float>(i), comm.rank() == 0 || i % 3 == 0);
    }
  });
  EXPECT_GT(world.handed(0), 0u);
}

// Rank `odd` calls `theirs`, the others a waited one-step allreduce of 4 floats: every rank fails
// as a mismatch, well within the timeout, and the group goes on.
void oneDiffers(int n, int odd, const std::function<std::shared_ptr<Work>(Communicator&)>& theirs,
                const std::string& named) {
  OnceWorld world(n);
  std::vector<std::string> errors(n);
  world.run(
      [&](Communicator& comm) {
        sumOf(comm, 64, 0, true);
        std::vector<float> buf(4, 1.0f);
        const auto start = std::chrono::steady_clock::now();
        auto work = comm.rank() == odd ? theirs(comm)
                                       : comm.allreduce(buf.data(), buf.size(), DataType::kFloat32,
                                                        ReduceOp::kSum, waitedFor());
        work->wait();
        errors[comm.rank()] = work->error();
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
        sumOf(comm, 4, 1.0f, true);  // and after it, the quick path again
        sumOf(comm, 4, 2.0f, false);
      },
      std::chrono::seconds(20));
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r].find("differ"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find(named), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

TEST(Once, AnotherCollectiveIsAMismatchOnEveryRankNotATimeout) {
  for (int n : {2, 3}) {
    for (int odd = 0; odd < n; ++odd) {
      std::vector<float> data(4, 1.0f);
      oneDiffers(
          n, odd,
          [&](Communicator& comm) {
            return comm.broadcast(data.data(), data.size(), DataType::kFloat32, 0);
          },
          "broadcast");
    }
  }
}

TEST(Once, AnotherCountIsAMismatchOnEveryRank) {
  for (int n : {2, 3}) {
    std::vector<float> data(5, 1.0f);
    oneDiffers(
        n, n - 1,
        [&](Communicator& comm) {
          return comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum,
                                waitedFor());
        },
        "5 x float32");
  }
}

TEST(Once, AStagedAllreduceDoesNotPairWithAOneStepOne) {
  // Rank 1 calls an allreduce above TORCH_DDL_ONCE_BYTES (staged, with a call print).
  std::vector<float> data(32768, 1.0f);
  oneDiffers(
      2, 1,
      [&](Communicator& comm) {
        return comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum,
                              waitedFor());
      },
      "32768 x float32");
}

TEST(Once, TimeoutNamesTheRankThatNeverCame) {
  for (int n : {2, 3}) {
    const int gone = n - 1;
    OnceWorld world(n);
    std::vector<std::string> errors(n);
    world.run(
        [&](Communicator& comm) {
          sumOf(comm, 64, 0, true);
          if (comm.rank() == gone) return;
          std::vector<float> buf(4, 1.0f);
          auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum,
                                     waitedFor());
          work->wait();
          errors[comm.rank()] = work->error();
        },
        std::chrono::milliseconds(300));
    for (int r = 0; r < gone; ++r) {
      EXPECT_NE(errors[r].find("Timed out after 300 ms"), std::string::npos) << errors[r];
      EXPECT_NE(errors[r].find("rank " + std::to_string(gone) + " has not started this op"),
                std::string::npos)
          << errors[r];
    }
  }
}

TEST(Once, OpsInFlightKeepTheCallerOffItsOwnThreadAndEveryOneEndsRight) {
  // Ops not waited for are in flight when a waited one comes: it runs as an op, in its turn.
  OnceWorld world(3);
  world.run([&](Communicator& comm) {
    sumOf(comm, 64, 0, true);
    std::vector<std::vector<float>> bufs(8, std::vector<float>(33));
    std::vector<std::shared_ptr<Work>> works;
    for (size_t k = 0; k < bufs.size(); ++k) {
      std::fill(bufs[k].begin(), bufs[k].end(), static_cast<float>(comm.rank() + k));
      works.push_back(comm.allreduce(bufs[k].data(), bufs[k].size(), DataType::kFloat32,
                                     ReduceOp::kSum, waitedFor(k % 2 == 1)));
    }
    for (size_t k = 0; k < bufs.size(); ++k) {
      check(works[k]);
      EXPECT_EQ(bufs[k][32], 3.0f + 3 * k) << "op " << k;
    }
  });
}

}  // namespace
}  // namespace ddl::test
