// Allreduce over the loopback transport, one thread per rank: world sizes 1-12, counts 0, 1,
// primes and large, every dtype and op, each algorithm (forced), a tiny segment size that forces
// the many-segment pipeline path, and tensors in shared buffers.
#include <gtest/gtest.h>

#include <cmath>

#include "collective_checks.h"
#include "harness.h"
#include "values.h"

namespace ddl::test {
namespace {

// `shared`: the data lies in a shared buffer, three elements past its start.
void allreduceCase(Communicator& comm, DataType t, ReduceOp op, size_t count, bool shared) {
  const size_t es = elementSize(t);
  std::vector<char> local;
  std::unique_ptr<SharedBuffer> sharedBuffer;
  char* buf = nullptr;
  if (shared) {
    sharedBuffer = std::make_unique<SharedBuffer>(comm.engine(), (count + 3) * es);
    buf = sharedBuffer->data() + 3 * es;
  } else {
    local.resize(count * es + 1);
    buf = local.data();
  }
  for (size_t i = 0; i < count; ++i) storeValue(t, buf, i, inputValue(t, op, comm.rank(), i));
  check(comm.allreduce(buf, count, t, op));
  for (size_t i = 0; i < count; ++i) {
    double want = expectedValue(t, op, comm.size(), i);
    double got = loadValue(t, buf, i);
    if (std::fabs(got - want) > tolerance(t, op, want)) {
      throw Error(describe("allreduce", comm.size(), comm.rank(), t, op, count, i, got, want));
    }
  }
}

void allreduceSweep(int size, const std::vector<size_t>& counts, bool everyType,
                    bool shared = false) {
  runRanks(size, [&](Communicator& comm) {
    for (DataType t : kAllTypes) {
      if (!everyType && t != DataType::kFloat32 && t != DataType::kInt64 &&
          t != DataType::kBFloat16) {
        continue;
      }
      for (ReduceOp op : kAllOps) {
        if (!checkReduceOp(t, op).empty()) continue;
        for (size_t count : counts) allreduceCase(comm, t, op, count, shared);
      }
    }
  });
}

class AllreduceSize : public ::testing::TestWithParam<int> {};

TEST_P(AllreduceSize, AllreduceRecursiveDoubling) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "recursive_doubling"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true);
}

TEST_P(AllreduceSize, AllreduceRing) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true);
}

TEST_P(AllreduceSize, AllreduceRingTinySegments) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"},
                 {"TORCH_DDL_SEGMENT_BYTES", "8"},
                 {"TORCH_DDL_PIPELINE_DEPTH", "2"}});
  allreduceSweep(GetParam(), {1, 13, 257}, false);
}

TEST_P(AllreduceSize, AllreduceMultiRingLarge) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"},
                 {"TORCH_DDL_RINGS", "3"},
                 {"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  allreduceSweep(GetParam(), {65537, 300007}, false);
}

TEST_P(AllreduceSize, AllreduceAutoLarge) { allreduceSweep(GetParam(), {16411, 1 << 20}, false); }

TEST_P(AllreduceSize, AllreduceSharedRing) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true);
}

TEST_P(AllreduceSize, AllreduceSharedRingTinySlots) {
  // Two 8-byte slots per inbox: the fullest flow control and the many-segment path.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"},
                 {"TORCH_DDL_SEGMENT_BYTES", "8"},
                 {"TORCH_DDL_PIPELINE_DEPTH", "1"}});
  allreduceSweep(GetParam(), {1, 13, 257}, false);
}

TEST_P(AllreduceSize, AllreduceSharedRingLarge) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}, {"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  allreduceSweep(GetParam(), {65537, 300007}, false);
}

TEST_P(AllreduceSize, AllreduceStaged) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true);
}

TEST_P(AllreduceSize, AllreduceStagedManyPieces) {
  // Halves of 64 bytes: many pieces, both halves in turn, chunks of an element or two, or none.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "staged"}, {"TORCH_DDL_STAGED_BYTES", "64"}});
  allreduceSweep(GetParam(), {1, 13, 257}, false);
}

TEST_P(AllreduceSize, AllreduceStagedLarge) {
  // Auto stages what it can: pieces of 64 KiB, the last one short.
  ScopedEnv env({{"TORCH_DDL_STAGED_BYTES", "65536"}, {"TORCH_DDL_SMALL_BYTES", "0"}});
  allreduceSweep(GetParam(), {16411, 300007}, false);
}

TEST_P(AllreduceSize, AllreduceDirect) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "direct"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true, true);
}

TEST_P(AllreduceSize, AllreduceDirectLarge) {
  // Auto picks direct when every rank's tensor is in a shared buffer.
  allreduceSweep(GetParam(), {16411, 300007}, false, true);
}

// Recursive doubling's partners once each put their own operand first, and so did two ranks whose
// data came with their call prints: their results differed in MAX and MIN of NaNs and zeros.
TEST(AllreduceBits, EveryRankEndsWithTheSameBitsWhereTheOrderOfOperandsMatters) {
  for (const char* algo : {"auto", "recursive_doubling", "ring", "shm_ring", "staged"}) {
    ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", algo}});
    for (int n = 2; n <= 5; ++n) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{1031}}) {
        std::vector<std::vector<float>> results(n);
        runRanks(n, [&](Communicator& comm) { reduceOrderSensitive(comm, count, results); });
        EXPECT_EQ(firstDifference(results), "") << algo << ", " << n << " ranks, " << count;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AllreduceSize, ::testing::Range(1, 13),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "P" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace ddl::test
