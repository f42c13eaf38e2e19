// A group that has run for long: its sequence numbers past 2^16 (the tag's field) and 2^32 (an
// op's number), as after 50 days at 1 000 ops/s.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "harness.h"

namespace ddl::test {
namespace {

// Rank 0 refuses op `at` at once; the others start it late, so the refusal's notice arrives
// before their op started (an early notice). They fail at once naming the refusal, and the group
// goes on.
void refusalArrivingEarly(uint64_t at) {
  std::vector<std::string> errors(3);
  runRanks(
      3,
      [&](Communicator& comm) {
        comm.startSequenceAt(at - 3);
        std::vector<float> buf(1024, 1.0f);
        for (int i = 0; i < 3; ++i) {
          check(comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum));
        }
        if (comm.rank() == 0) {
          EXPECT_THROW(
              (void)comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kBand),
              Error);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          const auto start = std::chrono::steady_clock::now();
          CallOptions options;
          options.timeout = std::chrono::milliseconds(4000);
          auto work =
              comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, options);
          ASSERT_TRUE(work->wait(std::chrono::milliseconds(8000)));
          errors[comm.rank()] = work->error();
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
        }
        for (int i = 0; i < 3; ++i) {
          std::fill(buf.begin(), buf.end(), 1.0f);
          check(comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum));
          EXPECT_EQ(buf.back(), 3.0f);
        }
      },
      std::chrono::seconds(30));
  for (int r = 1; r < 3; ++r) {
    EXPECT_NE(errors[r].find("rank 0 refused its call to all_reduce"), std::string::npos)
        << "op " << at << ", rank " << r << ": " << errors[r];
  }
}

TEST(LongRun, ARefusalArrivingEarlyIsHeardPastTheTagsSequenceWrap) {
  refusalArrivingEarly(1 << 16);
}

// Before the fix, the latest op started here stuck at 2^32 - 1 once the numbers wrapped: an
// early notice of op 0 or later was dropped, and the refusal became a timeout that failed the
// group.
TEST(LongRun, ARefusalArrivingEarlyIsHeardPastTheOpNumbersWrap) {
  refusalArrivingEarly(uint64_t{1} << 32);
  refusalArrivingEarly((uint64_t{1} << 32) + 1);
}

// A failed op's leftovers are discarded for a while, and only while no later op can take them:
// across the wrap too. Op 2^32 + 1 fails on rank 1 (rank 0 refused it after sending nothing);
// the ops after it, whose numbers wrapped, still pair up and sum right.
TEST(LongRun, OpsAfterTheWrapPairUpAndSumRight) {
  runRanks(
      2,
      [&](Communicator& comm) {
        comm.startSequenceAt((uint64_t{1} << 32) - 5);
        std::vector<double> buf(4099);
        for (int i = 0; i < 12; ++i) {
          std::fill(buf.begin(), buf.end(), comm.rank() + i);
          check(comm.allreduce(buf.data(), buf.size(), DataType::kFloat64, ReduceOp::kSum));
          EXPECT_EQ(buf[0], 1.0 + 2 * i);
          EXPECT_EQ(buf.back(), 1.0 + 2 * i);
        }
        EXPECT_EQ(comm.sequenceNumber(), (uint64_t{1} << 32) + 7);
      },
      std::chrono::seconds(30));
}

}  // namespace
}  // namespace ddl::test
