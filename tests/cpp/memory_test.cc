// Memory kinds (memory/memory.h): an op on a device kind routes every copy, reduction and scratch
// buffer through that kind's Memory, never takes the shared-memory paths, and may be numbered
// now and started later (CallOptions::deferStart). The "device" here is host memory behind a
// Memory that counts what it is asked to do.
#include "../../csrc/core/memory/memory.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "harness.h"

namespace ddl::test {
namespace {

struct Counts {
  std::atomic<int> allocations{0}, copies{0}, reductions{0}, averages{0}, activations{0};
};
Counts gCounts;

class CountingMemory : public Memory {
 public:
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  void activate() override { ++gCounts.activations; }
  std::shared_ptr<char> allocate(size_t bytes) override {
    ++gCounts.allocations;
    return memoryFor(MemoryKind::kHost).allocate(bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    ++gCounts.copies;
    memoryFor(MemoryKind::kHost).copy(dst, src, bytes);
  }
  void reduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
              Operands order) override {
    ++gCounts.reductions;
    memoryFor(MemoryKind::kHost).reduce(type, op, dst, src, count, order);
  }
  void average(DataType type, void* buf, size_t count, size_t divisor) override {
    ++gCounts.averages;
    memoryFor(MemoryKind::kHost).average(type, buf, count, divisor);
  }
};

Memory* countingMemory(int) {
  static CountingMemory memory;
  return &memory;
}

void useCountingMemory() {
  if (!memoryAvailable(MemoryKind::kCuda)) {
    // Without a module for it, asking for the kind is an error that says so.
    try {
      memoryFor(MemoryKind::kCuda, 0);
      ADD_FAILURE() << "memoryFor(kCuda) did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("without CUDA"), std::string::npos) << e.what();
    }
  }
  registerMemory(MemoryKind::kCuda, &countingMemory);
}

CallOptions onDevice() {
  CallOptions options;
  options.memory = MemoryKind::kCuda;
  return options;
}

TEST(Memory, DeviceOpsRouteEveryCopyReductionAndScratchThroughTheirKind) {
  useCountingMemory();
  for (int size : {1, 2, 3, 5}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{300007}}) {
      const int before = gCounts.reductions.load();
      runRanks(size, [&](Communicator& comm) {
        const int r = comm.rank();
        std::vector<float> x(n, static_cast<float>(r + 1));
        check(comm.allreduce(x.data(), n, DataType::kFloat32, ReduceOp::kSum, onDevice()));
        const float total = static_cast<float>(size * (size + 1) / 2);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(x[i], total) << i;
        std::vector<double> avg(n, 2.0 * r);
        check(comm.allreduce(avg.data(), n, DataType::kFloat64, ReduceOp::kAvg, onDevice()));
        for (size_t i = 0; i < n; ++i) ASSERT_DOUBLE_EQ(avg[i], size - 1.0) << i;
        std::vector<int32_t> all(n * size, -1), mine(n, r);
        check(comm.allgather(mine.data(), all.data(), n, DataType::kInt32, onDevice()));
        for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<int>(i / n));
        std::vector<int64_t> blocks(n * size, r + 1);
        check(comm.reduceScatter(blocks.data(), n, DataType::kInt64, ReduceOp::kMax, onDevice()));
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(blocks[r * n + i], size);
        std::vector<float> out(n, 0.0f), in(n, 1.0f);
        check(comm.reduce(in.data(), out.data(), n, DataType::kFloat32, ReduceOp::kSum, 0,
                          onDevice()));
        if (r == 0) {
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<float>(size));
        }
      });
      if (size > 1 && n > 0) {
        EXPECT_GT(gCounts.reductions.load(), before);
      }
    }
  }
  EXPECT_GT(gCounts.allocations.load(), 0);
  EXPECT_GT(gCounts.copies.load(), 0);
  EXPECT_GT(gCounts.averages.load(), 0);
  EXPECT_GT(gCounts.activations.load(), 0);
}

TEST(Memory, ADeferredOpIsNumberedAtOnceAndStartsWhenReleased) {
  useCountingMemory();
  runRanks(3, [](Communicator& comm) {
    // Rank 1's first op starts only when released, after its second op was submitted: the
    // group still pairs them by number.
    std::function<void()> release;
    CallOptions deferred = onDevice();
    deferred.deferStart = [&](std::function<void()> start) { release = std::move(start); };
    std::vector<float> a(5000, 1.0f), b(7000, 2.0f);
    auto first =
        comm.rank() == 1
            ? comm.allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum, deferred)
            : comm.allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum, onDevice());
    auto second = comm.allreduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum);
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_FALSE(first->done());
      ASSERT_TRUE(release);
      release();
    }
    check(first);
    check(second);
    EXPECT_EQ(a[4999], 3.0f);
    EXPECT_EQ(b[6999], 6.0f);
  });
}

}  // namespace
}  // namespace ddl::test
