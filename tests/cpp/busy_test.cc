// A busy progress thread: an op that computes on it for long lets it turn, so that heartbeats
// leave and no peer counts the rank gone for good.
#include <gtest/gtest.h>

#include <chrono>

#include "harness.h"

namespace ddl::test {
namespace {

// Two ranks allreduce 1 GiB of shared memory each with the direct algorithm (each reduces and
// writes back 512 MiB on its progress thread: longer than the heartbeat timeout of 100 ms). Before,
// no heartbeat left meanwhile, and each rank counted the other gone.
TEST(Busy, ALongDirectReductionLetsHeartbeatsLeave) {
  ScopedEnv env({{"TORCH_DDL_HEARTBEAT_MS", "20"},
                 {"TORCH_DDL_HEARTBEAT_TIMEOUT_MS", "100"},
                 {"TORCH_DDL_ALLREDUCE_ALGO", "direct"}});
  runRanks(
      2,
      [](Communicator& comm) {
        const size_t n = size_t{256} << 20;
        auto buffers = comm.engine().sharedBuffers();
        auto* data = static_cast<float*>(buffers->allocate(n * sizeof(float)));
        for (int round = 0; round < 2; ++round) {
          std::fill(data, data + n, static_cast<float>(comm.rank() + 1));
          const auto start = std::chrono::steady_clock::now();
          check(comm.allreduce(data, n, DataType::kFloat32, ReduceOp::kSum));
          const auto took = std::chrono::steady_clock::now() - start;
          EXPECT_EQ(data[0], 3.0f);
          EXPECT_EQ(data[n - 1], 3.0f);
          if (comm.rank() == 0 && round == 0) {
            std::printf("a direct allreduce of 1 GiB took %lld ms\n",
                        static_cast<long long>(
                            std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
          }
        }
        check(comm.barrier());
        EXPECT_TRUE(comm.goneRanks().empty());
        buffers->release(data);
      },
      std::chrono::seconds(30));
}

}  // namespace
}  // namespace ddl::test
