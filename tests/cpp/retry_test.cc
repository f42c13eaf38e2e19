// Retries after a refusal: a shrink, split or reconfigure that failed on some rank (its own
// arguments, no quorum, a member that came late) is called again, and the retry must meet.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "harness.h"

namespace ddl::test {
namespace {

// Rank 0 of 3 names a rank twice: its shrink throws before its agreement begins, and tells the
// others, whose shrink fails at once naming the refusal (before, it waited for rank 0's card
// until its timeout). Both call again, rightly: before, rank 0 counted only calls that passed
// its checks, so the two retries took different agreement numbers and never met.
TEST(Retry, AShrinkRefusedOnOneRankIsRetriedByEveryRank) {
  runRanks(
      3,
      [&](Communicator& comm) {
        comm.setTimeout(std::chrono::seconds(10));
        if (comm.rank() == 2) return;  // the rank to exclude: it calls nothing
        if (comm.rank() == 0) {
          EXPECT_THROW((void)comm.shrink({2, 2}), Error);
        } else {
          const auto start = std::chrono::steady_clock::now();
          try {
            (void)comm.shrink({2});
            ADD_FAILURE() << "a shrink rank 0 refused went on";
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("rank 0 refused its call to shrink_group"),
                      std::string::npos)
                << e.what();
            EXPECT_EQ(e.kind(), StatusKind::kInvalidArgument);
          }
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
        }
        comm.setTimeout(std::chrono::seconds(20));
        auto shrunk = comm.shrink({2});
        ASSERT_EQ(shrunk->size(), 2);
        EXPECT_EQ(allreduceOnes(*shrunk), 2.0);
      },
      std::chrono::seconds(20));
}

// The same with a refusal a rank makes of itself: no quorum (it sees more ranks gone than the
// others do).
TEST(Retry, AShrinkWithoutQuorumOnOneRankIsRetriedByEveryRank) {
  runRanks(
      5,
      [&](Communicator& comm) {
        comm.setTimeout(std::chrono::milliseconds(1500));
        if (comm.rank() >= 3) return;
        if (comm.rank() == 0) {
          EXPECT_THROW((void)comm.shrink({1, 2, 3, 4}), Error);  // no quorum: nothing sent
        } else {
          EXPECT_THROW((void)comm.shrink({3, 4}), Error);  // rank 0 never answers
        }
        comm.setTimeout(std::chrono::seconds(20));
        auto shrunk = comm.shrink({3, 4});
        ASSERT_EQ(shrunk->size(), 3);
        EXPECT_EQ(allreduceOnes(*shrunk), 3.0);
      },
      std::chrono::seconds(20));
}

TEST(Retry, ASplitRefusedOnOneRankIsRetriedByEveryRank) {
  runRanks(
      3,
      [&](Communicator& comm) {
        comm.setTimeout(std::chrono::milliseconds(1500));
        if (comm.rank() == 0) {
          EXPECT_THROW((void)comm.split({0, 1, 7}), Error);
        } else {
          try {
            (void)comm.split({0, 1});
          } catch (const Error&) {  // rank 1 times out; rank 2 is left out and succeeds
          }
        }
        comm.setTimeout(std::chrono::seconds(20));
        auto part = comm.split({0, 1});
        if (comm.rank() == 2) {
          EXPECT_EQ(part, nullptr);
          return;
        }
        ASSERT_NE(part, nullptr);
        EXPECT_EQ(allreduceOnes(*part), 2.0);
      },
      std::chrono::seconds(20));
}

// torch's documented retry of reconfigure: the same handles, a new uuid. A member that called
// after the others gave up (its card reached them late) must not poison it, nor the one after.
TEST(Retry, AReconfigureRetriedAfterALateMemberMeets) {
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::string> handles;
  for (int r = 0; r < 3; ++r) {
    engines.push_back(std::make_unique<Engine>(fabric.join()));
    handles.push_back(Derivation::handle(*engines.back()));
  }
  const std::vector<std::string> listed = Derivation::orderHandles(handles);
  auto engineOf = [&](int i) -> Engine& {
    for (int r = 0; r < 3; ++r) {
      if (handles[r] == listed[i]) return *engines[r];
    }
    throw Error("no engine");
  };
  // Attempt 1: members 0 and 1 give up after 500 ms; member 2 calls only after that.
  together(3, [&](int i) {
    if (i == 2) std::this_thread::sleep_for(std::chrono::milliseconds(900));
    EXPECT_THROW((void)Communicator::reconfigure(engineOf(i), listed, 1,
                                                 std::chrono::milliseconds(i == 2 ? 2000 : 500)),
                 Error);
  });
  // Attempts 2 and 3, as documented: the same handles, a new uuid each.
  for (int64_t uuid : {2, 3}) {
    together(3, [&](int i) {
      auto comm = Communicator::reconfigure(engineOf(i), listed, uuid, std::chrono::seconds(10));
      ASSERT_EQ(comm->size(), 3);
      EXPECT_EQ(allreduceOnes(*comm), 3.0);
    });
  }
}

}  // namespace
}  // namespace ddl::test
