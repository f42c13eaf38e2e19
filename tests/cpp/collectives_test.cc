// Collectives over the loopback transport, one thread per rank: world sizes 1-12, counts 0, 1,
// primes and large, every dtype and op, each allreduce algorithm, and a tiny segment size that
// forces the many-segment pipeline path.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "adoption.h"
#include "harness.h"
#include "values.h"

namespace ddl::test {
namespace {

std::string describe(const char* what, int size, int rank, DataType t, ReduceOp op, size_t count,
                     size_t i, double got, double want) {
  std::ostringstream s;
  s << what << " size=" << size << " rank=" << rank << " dtype=" << dataTypeName(t)
    << " op=" << reduceOpName(op) << " count=" << count << " element " << i << ": got " << got
    << ", want " << want;
  return s.str();
}

// A buffer from the engine's shared buffers (what torch_ddl.empty_shared hands out).
class SharedBuffer {
 public:
  SharedBuffer(Engine& engine, size_t bytes)
      : buffers_(engine.sharedBuffers()), base_(static_cast<char*>(buffers_->allocate(bytes))) {}
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  ~SharedBuffer() { buffers_->release(base_); }
  char* data() const { return base_; }

 private:
  std::shared_ptr<SharedBuffers> buffers_;
  char* base_;
};

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

class WorldSize : public ::testing::TestWithParam<int> {};

TEST_P(WorldSize, AllreduceRecursiveDoubling) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "recursive_doubling"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true);
}

TEST_P(WorldSize, AllreduceRing) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true);
}

TEST_P(WorldSize, AllreduceRingTinySegments) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"},
                 {"TORCH_DDL_SEGMENT_BYTES", "8"},
                 {"TORCH_DDL_PIPELINE_DEPTH", "2"}});
  allreduceSweep(GetParam(), {1, 13, 257}, false);
}

TEST_P(WorldSize, AllreduceMultiRingLarge) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"},
                 {"TORCH_DDL_RINGS", "3"},
                 {"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  allreduceSweep(GetParam(), {65537, 300007}, false);
}

TEST_P(WorldSize, AllreduceAutoLarge) { allreduceSweep(GetParam(), {16411, 1 << 20}, false); }

TEST_P(WorldSize, AllreduceSharedRing) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true);
}

TEST_P(WorldSize, AllreduceSharedRingTinySlots) {
  // Two 8-byte slots per inbox: the fullest flow control and the many-segment path.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"},
                 {"TORCH_DDL_SEGMENT_BYTES", "8"},
                 {"TORCH_DDL_PIPELINE_DEPTH", "1"}});
  allreduceSweep(GetParam(), {1, 13, 257}, false);
}

TEST_P(WorldSize, AllreduceSharedRingLarge) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}, {"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  allreduceSweep(GetParam(), {65537, 300007}, false);
}

TEST_P(WorldSize, AllreduceDirect) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "direct"}});
  allreduceSweep(GetParam(), {0, 1, 2, 7, 131, 1021}, true, true);
}

TEST_P(WorldSize, AllreduceDirectLarge) {
  // Auto picks direct when every rank's tensor is in a shared buffer.
  allreduceSweep(GetParam(), {16411, 300007}, false, true);
}

TEST_P(WorldSize, Broadcast) {
  ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "64"}});
  const int size = GetParam();
  runRanks(size, [&](Communicator& comm) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1021}, size_t{100003}}) {
      for (int root = 0; root < size; ++root) {
        std::vector<int32_t> buf(count, -1);
        if (comm.rank() == root) {
          for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int32_t>(i * 31 + root);
        }
        check(comm.broadcast(buf.data(), count, DataType::kInt32, root));
        for (size_t i = 0; i < count; ++i) {
          if (buf[i] != static_cast<int32_t>(i * 31 + root)) {
            throw Error("broadcast mismatch size=" + std::to_string(size) +
                        " root=" + std::to_string(root) + " count=" + std::to_string(count));
          }
        }
      }
    }
  });
}

TEST_P(WorldSize, Allgather) {
  ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "16"}});
  const int size = GetParam();
  runRanks(size, [&](Communicator& comm) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{1021}}) {
      std::vector<int16_t> in(count), out(count * size, -7);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<int16_t>(comm.rank() * 1000 + i);
      check(comm.allgather(in.data(), out.data(), count, DataType::kInt16));
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i) {
          if (out[r * count + i] != static_cast<int16_t>(r * 1000 + i)) {
            throw Error("allgather mismatch size=" + std::to_string(size) + " block " +
                        std::to_string(r) + " count=" + std::to_string(count));
          }
        }
      }
    }
  });
}

TEST_P(WorldSize, AllgatherVaryingSizes) {
  ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "16"}});
  const int size = GetParam();
  // Rank r contributes (r * stride + base) % 1031 bytes: zero-length blocks included.
  auto bytesOf = [](int r, size_t stride, size_t base) { return (r * stride + base) % 1031; };
  runRanks(size, [&](Communicator& comm) {
    for (auto [stride, base] : {std::pair<size_t, size_t>{0, 0}, {1, 0}, {7, 1}, {389, 1000}}) {
      std::vector<char> in(bytesOf(comm.rank(), stride, base));
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(comm.rank() * 13 + i);
      auto out = std::make_shared<VaryingBlocks>();
      check(comm.allgatherVarying(in.data(), in.size(), out));
      ASSERT_EQ(out->offsets.size(), static_cast<size_t>(size) + 1);
      for (int r = 0; r < size; ++r) {
        const size_t length = out->offsets[r + 1] - out->offsets[r];
        ASSERT_EQ(length, bytesOf(r, stride, base)) << "size=" << size << " block " << r;
        for (size_t i = 0; i < length; ++i) {
          ASSERT_EQ(out->data[out->offsets[r] + i], static_cast<char>(r * 13 + i))
              << "size=" << size << " block " << r << " byte " << i;
        }
      }
    }
  });
}

TEST_P(WorldSize, BarrierAndManyOpsInFlight) {
  const int size = GetParam();
  runRanks(size, [&](Communicator& comm) {
    check(comm.barrier());
    // Ten allreduces posted before any is waited on: sequence numbers keep them apart.
    std::vector<std::vector<int64_t>> bufs(10, std::vector<int64_t>(3001));
    std::vector<std::shared_ptr<Work>> works;
    for (size_t k = 0; k < bufs.size(); ++k) {
      for (auto& v : bufs[k]) v = comm.rank() + static_cast<int64_t>(k);
      works.push_back(
          comm.allreduce(bufs[k].data(), bufs[k].size(), DataType::kInt64, ReduceOp::kSum));
    }
    for (size_t k = 0; k < bufs.size(); ++k) {
      check(works[k]);
      int64_t want = static_cast<int64_t>(size) * (size - 1) / 2 + size * static_cast<int64_t>(k);
      for (auto v : bufs[k]) ASSERT_EQ(v, want);
    }
    check(comm.barrier());
  });
}

TEST_P(WorldSize, ReduceScatter) {
  ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "24"}, {"TORCH_DDL_PIPELINE_DEPTH", "2"}});
  const int size = GetParam();
  runRanks(size, [&](Communicator& comm) {
    for (DataType t : {DataType::kFloat32, DataType::kInt64, DataType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{1021}}) {
          std::vector<char> buf(size * count * elementSize(t) + 1);
          for (int b = 0; b < size; ++b) {
            for (size_t i = 0; i < count; ++i) {
              storeValue(t, buf.data(), b * count + i,
                         inputValue(t, op, comm.rank(), b * count + i));
            }
          }
          check(comm.reduceScatter(buf.data(), count, t, op));
          for (size_t i = 0; i < count; ++i) {
            size_t at = comm.rank() * count + i;
            double want = expectedValue(t, op, size, at);
            double got = loadValue(t, buf.data(), at);
            if (std::fabs(got - want) > tolerance(t, op, want)) {
              throw Error(
                  describe("reduce_scatter", size, comm.rank(), t, op, count, i, got, want));
            }
          }
        }
      }
    }
  });
}

TEST_P(WorldSize, ReduceGatherScatter) {
  const int size = GetParam();
  runRanks(size, [&](Communicator& comm) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{257}}) {
      for (int root = 0; root < size; ++root) {
        std::vector<int32_t> in(count), out(count, -9);
        for (size_t i = 0; i < count; ++i) in[i] = comm.rank() + static_cast<int32_t>(i);
        std::vector<int32_t> keep = in;
        check(comm.reduce(in.data(), out.data(), count, DataType::kInt32, ReduceOp::kSum, root));
        ASSERT_EQ(in, keep) << "reduce modified its input";
        if (comm.rank() == root) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out[i], size * (size - 1) / 2 + size * static_cast<int32_t>(i));
          }
        }
        std::vector<int32_t> all(count * size, -1);
        check(comm.gather(in.data(), all.data(), count, DataType::kInt32, root));
        if (comm.rank() == root) {
          for (int r = 0; r < size; ++r) {
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[r * count + i], r + int32_t(i));
          }
        }
        std::vector<int32_t> blocks(count * size), mine(count, -1);
        for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i) * 3 + root;
        check(comm.scatter(blocks.data(), mine.data(), count, DataType::kInt32, root));
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(mine[i], static_cast<int32_t>(comm.rank() * count + i) * 3 + root);
        }
      }
    }
  });
}

TEST_P(WorldSize, AlltoallUnevenAndPointToPoint) {
  const int size = GetParam();
  runRanks(size, [&](Communicator& comm) {
    // Rank r sends (r + p) % 3 bytes to rank p (some blocks empty).
    const int me = comm.rank();
    AlltoallLayout layout;
    size_t sendTotal = 0, recvTotal = 0;
    for (int p = 0; p < size; ++p) {
      layout.sendOffsets.push_back(sendTotal);
      layout.sendBytes.push_back((me + p) % 3);
      sendTotal += (me + p) % 3;
      layout.recvOffsets.push_back(recvTotal);
      layout.recvBytes.push_back((p + me) % 3);
      recvTotal += (p + me) % 3;
    }
    std::vector<uint8_t> in(sendTotal + 1), out(recvTotal + 1, 0xFF);
    for (int p = 0; p < size; ++p) {
      for (size_t b = 0; b < layout.sendBytes[p]; ++b) {
        in[layout.sendOffsets[p] + b] = static_cast<uint8_t>(me * 16 + p + b);
      }
    }
    check(comm.alltoall(in.data(), out.data(), layout));
    for (int p = 0; p < size; ++p) {
      for (size_t b = 0; b < layout.recvBytes[p]; ++b) {
        ASSERT_EQ(out[layout.recvOffsets[p] + b], static_cast<uint8_t>(p * 16 + me + b));
      }
    }
    if (size < 2) return;
    // A ring of sends with two tags, received in the opposite tag order; then from any source.
    int next = (me + 1) % size, prev = (me + size - 1) % size;
    int64_t a = me * 10 + 1, b = me * 10 + 2, ra = -1, rb = -1;
    auto s1 = comm.send(&a, sizeof(a), next, 7);
    auto s2 = comm.send(&b, sizeof(b), next, 0x70000);
    check(comm.recv(&rb, sizeof(rb), prev, 0x70000));
    check(comm.recv(&ra, sizeof(ra), prev, 7));
    check(s1);
    check(s2);
    ASSERT_EQ(ra, prev * 10 + 1);
    ASSERT_EQ(rb, prev * 10 + 2);
    if (me == 0) {
      for (int k = 1; k < size; ++k) {
        int64_t v = -1;
        auto w = comm.recv(&v, sizeof(v), -1, 99);
        check(w);
        ASSERT_EQ(v, w->source() * 100);
      }
    } else {
      int64_t v = me * 100;
      check(comm.send(&v, sizeof(v), 0, 99));
    }
    EXPECT_THROW((void)comm.send(&a, sizeof(a), me, 1), Error);
    // A batch (one op): sends to both neighbours under two tags, matched by lone receives on
    // one side and by a batch of receives on the other; each message as the lone one would be.
    int64_t x = me * 10 + 3, y = me * 10 + 4, rx = -1, fromPrev = -1, fromNext = -1;
    using T = Communicator::Transfer;
    auto batch =
        comm.pointToPoint({T{true, &x, sizeof(x), next, 0x50001}, T{true, &y, sizeof(y), prev, 5},
                           T{false, &fromPrev, sizeof(fromPrev), prev, 0x50001},
                           T{false, &fromNext, sizeof(fromNext), next, 5}});
    check(batch);
    ASSERT_EQ(fromPrev, prev * 10 + 3);
    ASSERT_EQ(fromNext, next * 10 + 4);
    auto lone = comm.send(&x, sizeof(x), next, 0x50001);
    check(comm.pointToPoint({T{false, &rx, sizeof(rx), prev, 0x50001}}));
    check(lone);
    ASSERT_EQ(rx, prev * 10 + 3);
    EXPECT_THROW((void)comm.pointToPoint({T{false, &rx, sizeof(rx), -1, 1}}), Error);
    EXPECT_THROW((void)comm.pointToPoint({T{true, &x, sizeof(x), me, 1}}), Error);
    check(comm.pointToPoint({}));
    check(comm.barrier());
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, WorldSize, ::testing::Range(1, 13),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "P" + std::to_string(info.param);
                         });

TEST(Collectives, TimeoutNamesTheMissingRank) {
  std::string message;
  runRanks(
      3,
      [&](Communicator& comm) {
        if (comm.rank() == 2) return;  // never joins
        std::vector<float> buf(10, 1.0f);
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        work->wait();
        EXPECT_TRUE(work->failed());
        // Rank 1 waits on rank 2 directly (rank 0 waits on rank 1, which waits on rank 2).
        if (comm.rank() == 1) message = work->error();
      },
      std::chrono::milliseconds(300));
  EXPECT_NE(message.find("Timed out after 300 ms"), std::string::npos) << message;
  EXPECT_NE(message.find("allreduce on group"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 2"), std::string::npos) << message;
}

TEST(Collectives, RanksThatDisagreeOnSizesAllFailSayingSo) {
  // Rank 0 reduces 100 elements, rank 1 200 (or doubles): neither returns a partial result.
  for (DataType second : {DataType::kFloat32, DataType::kFloat64}) {
    std::vector<std::string> errors(2);
    runRanks(2, [&](Communicator& comm) {
      const bool first = comm.rank() == 0;
      const DataType type = first ? DataType::kFloat32 : second;
      const size_t n = first || second != DataType::kFloat32 ? 100 : 200;
      std::vector<double> buf(n, 1.0);
      auto work = comm.allreduce(buf.data(), n, type, ReduceOp::kSum);
      work->wait();
      ASSERT_TRUE(work->failed()) << "rank " << comm.rank() << " returned";
      errors[comm.rank()] = work->error();
      // The group still works.
      std::vector<float> ok(10, 1.0f);
      check(comm.allreduce(ok.data(), ok.size(), DataType::kFloat32, ReduceOp::kSum));
      EXPECT_EQ(ok[9], 2.0f);
    });
    // Each rank names both calls.
    const std::string other = second == DataType::kFloat32 ? "200 x float32" : "100 x float64";
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find("the ranks' calls differ"), std::string::npos) << errors[r];
      EXPECT_NE(errors[r].find("allreduce(SUM, 100 x float32)"), std::string::npos) << errors[r];
      EXPECT_NE(errors[r].find("allreduce(SUM, " + other + ")"), std::string::npos) << errors[r];
    }
  }
}

// A loopback transport that, like UCX with a receive it has already matched, cannot cancel at
// once: cancelled requests stay posted until the test lets go.
class HoldingTransport : public Transport {
 public:
  explicit HoldingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  std::string localAddress() override { return inner_->localAddress(); }
  PeerId connect(const std::string& address) override { return inner_->connect(address); }
  std::string addressOf(PeerId peer) const override { return inner_->addressOf(peer); }
  void send(PeerId peer, uint64_t tag, const void* data, size_t bytes, Request* req) override {
    inner_->send(peer, tag, data, bytes, req);
  }
  void recv(uint64_t tag, uint64_t mask, void* data, size_t bytes, Request* req) override {
    inner_->recv(tag, mask, data, bytes, req);
  }
  bool receiveArrived(uint64_t tag, uint64_t mask, void* data, size_t bytes,
                      Request* req) override {
    return inner_->receiveArrived(tag, mask, data, bytes, req);
  }
  void cancel(Request* req) override {
    held_.push_back(req);
    heldCount_.store(held_.size());
  }
  bool progress() override {
    if (letGo_.load() && !held_.empty()) {
      for (Request* req : held_) inner_->cancel(req);
      held_.clear();
      heldCount_.store(0);
    }
    return inner_->progress();
  }
  bool arm() override { return !letGo_.load() && inner_->arm(); }
  int wakeFd() override { return inner_->wakeFd(); }
  std::string name() const override { return "holding loopback"; }
  size_t endpoints() const override { return inner_->endpoints(); }

  std::atomic<bool> letGo_{false};
  std::atomic<size_t> heldCount_{0};

 private:
  std::unique_ptr<Transport> inner_;
  std::vector<Request*> held_;
};

TEST(Collectives, FailedOpKeepsItsBuffersUntilTheTransportLetsGo) {
  LoopbackFabric fabric;
  auto holding = std::make_unique<HoldingTransport>(fabric.join());
  HoldingTransport* transport = holding.get();
  Engine lonely(std::move(holding));
  Engine absent(fabric.join());
  MemoryStore store;
  std::shared_ptr<Communicator> other;
  std::thread joiner(
      [&] { other = Communicator::create(absent, store, 1, 2, std::chrono::milliseconds(300)); });
  auto comm = Communicator::create(lonely, store, 0, 2, std::chrono::milliseconds(300));
  joiner.join();
  // A ring allreduce (with scratch) whose peer never takes part: it times out with its
  // receives still posted, and the transport does not let go of them yet.
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"}});
  std::vector<float> buf(1 << 20, 1.0f);
  auto work = comm->allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
  work->wait();
  ASSERT_TRUE(work->failed());
  EXPECT_NE(work->error().find("Timed out after 300 ms"), std::string::npos) << work->error();
  EXPECT_GT(transport->heldCount_.load(), 0u);
  EXPECT_EQ(lonely.orphanedOps(), 1u);  // the frame and its scratch are still alive
  transport->letGo_.store(true);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (lonely.orphanedOps() != 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(lonely.orphanedOps(), 0u);
  EXPECT_EQ(transport->heldCount_.load(), 0u);
}

TEST(Collectives, MonitoredBarrierNamesEveryMissingRank) {
  std::string message, first, other;
  runRanks(
      4,
      [&](Communicator& comm) {
        check(comm.monitoredBarrier());  // everyone arrives
        if (comm.rank() == 1 || comm.rank() == 3) return;
        auto work = comm.monitoredBarrier();
        work->wait();
        EXPECT_TRUE(work->failed());
        if (comm.rank() == 0) message = work->error();
        if (comm.rank() == 2) other = work->error();
        auto lowest = comm.monitoredBarrier(/*waitAll=*/false);
        lowest->wait();
        if (comm.rank() == 0) first = lowest->error();
      },
      std::chrono::milliseconds(300));
  EXPECT_NE(first.find("Rank 1 failed to pass monitoredBarrier in 300 ms (ranks 1, 3 did not"),
            std::string::npos)
      << first;
  EXPECT_NE(other.find("Rank 2 successfully reached monitoredBarrier, but received errors while "
                       "waiting for send/recv from rank 0"),
            std::string::npos)
      << other;
  EXPECT_NE(message.find("monitored_barrier"), std::string::npos) << message;
  EXPECT_NE(message.find("Ranks 1, 3 failed to pass monitoredBarrier in 300 ms"), std::string::npos)
      << message;
}

TEST(Collectives, BadInputIsRejectedBeforeSending) {
  runRanks(2, [&](Communicator& comm) {
    std::vector<float> buf(4);
    try {
      (void)comm.allreduce(buf.data(), 4, DataType::kFloat32, ReduceOp::kBand);
      FAIL() << "BAND on float32 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("BAND"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)comm.broadcast(buf.data(), 4, DataType::kFloat32, 5), Error);
    EXPECT_EQ(comm.sequenceNumber(), 2u);  // each refusal takes its place in the sequence
    check(comm.barrier());
  });
}

TEST(Collectives, GroupsDoNotMixMessages) {
  // Two communicators over the same engines, with ops interleaved in opposite orders.
  const int size = 3;
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < size; ++r) engines.push_back(std::make_unique<Engine>(fabric.join()));
  auto counter = std::make_shared<std::atomic<uint64_t>>(0);
  MemoryStore storeA(counter), storeB(counter);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto a = Communicator::create(*engines[r], storeA, r, size, std::chrono::seconds(20));
        auto b = Communicator::create(*engines[r], storeB, r, size, std::chrono::seconds(20));
        EXPECT_NE(a->id(), b->id());
        std::vector<int32_t> x(1000, r), y(1000, 10 * r);
        std::shared_ptr<Work> wa, wb;
        if (r % 2 == 0) {
          wa = a->allreduce(x.data(), x.size(), DataType::kInt32, ReduceOp::kSum);
          wb = b->allreduce(y.data(), y.size(), DataType::kInt32, ReduceOp::kSum);
        } else {
          wb = b->allreduce(y.data(), y.size(), DataType::kInt32, ReduceOp::kSum);
          wa = a->allreduce(x.data(), x.size(), DataType::kInt32, ReduceOp::kSum);
        }
        check(wa);
        check(wb);
        for (int v : x) EXPECT_EQ(v, 3);
        for (int v : y) EXPECT_EQ(v, 30);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace ddl::test

namespace ddl::test {
namespace {

// Ranks over loopback transports the test can reach: rank r's transport is transports[r].
struct SharedRingWorld {
  explicit SharedRingWorld(int size) {
    for (int r = 0; r < size; ++r) {
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

TEST(SharedRing, OpsInFlightTakeTurns) {
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "shm_ring"}, {"TORCH_DDL_SEGMENT_BYTES", "1024"}});
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

TEST(SharedRing, DisagreeingCountsFailFastAndBreakTheRing) {
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
      },
      std::chrono::seconds(20));
  // The call check finds it first (the ring's own check of the counts is behind it). Whether
  // the ring stays usable depends on how far each rank got before it learned (a rank that wrote
  // into its neighbour's inbox breaks it); either way the second op fails on both, in time.
  for (const std::string& e : first) {
    EXPECT_NE(e.find("allreduce(SUM, 1000 x float32)"), std::string::npos) << e;
    EXPECT_NE(e.find("allreduce(SUM, 2000 x float32)"), std::string::npos) << e;
  }
  for (const std::string& e : second) {
    EXPECT_TRUE(e.find("shared-memory ring of this group is unusable: allreduce op #1") !=
                    std::string::npos ||
                e.find("the ranks' calls differ") != std::string::npos)
        << e;
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
    EXPECT_NE(errors[r].find("called allreduce(SUM, 3000 x float32)"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("called allreduce(SUM, 6000 x float32)"), std::string::npos)
        << errors[r];
  }
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
    EXPECT_NE(errors[r].find("allreduce(SUM, 30000 x float32)"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("allreduce(SUM, 40000 x float32)"), std::string::npos) << errors[r];
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
    fillAndSum(comm, local.data(), 100000, 0);       // asks: not all shared
    EXPECT_EQ(world.windowsInUse(comm.rank()), 4u);  // the ring's two, its own two buffers
    fillAndSum(comm, floats(small), 100000, 1);      // below the threshold: does not ask
    EXPECT_EQ(world.windowsInUse(comm.rank()), 4u);
    fillAndSum(comm, floats(large), 300000, 2);  // asks: direct, maps the peer's `large`
    EXPECT_EQ(world.windowsInUse(comm.rank()), 5u);
    fillAndSum(comm, floats(small), 100000, 3);  // the last answer was yes: direct
    EXPECT_EQ(world.windowsInUse(comm.rank()), 6u);
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

namespace ddl::test {
namespace {

// abort() and shutdown() close a group: its ops in flight fail at once, and so do later ones.
TEST(GroupState, ClosingFailsOpsInFlightAndLaterOnes) {
  runRanks(2, [](Communicator& comm) {
    EXPECT_TRUE(comm.firstFailure().status.ok());
    if (comm.rank() == 1) return;  // never joins: rank 0's allreduce waits
    std::vector<float> buf(1000, 1.0f);
    auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(work->done());
    auto start = std::chrono::steady_clock::now();
    comm.close("aborted: the test closed it");
    ASSERT_TRUE(work->wait(std::chrono::milliseconds(1000)));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
    EXPECT_TRUE(work->failed());
    EXPECT_NE(work->error().find("aborted: the test closed it"), std::string::npos)
        << work->error();
    EXPECT_EQ(comm.firstFailure().status.kind, StatusKind::kClosed);
    EXPECT_EQ(work->status().kind, StatusKind::kClosed);
    auto later = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(later->wait(std::chrono::milliseconds(500)));
    EXPECT_NE(later->error().find("aborted: the test closed it"), std::string::npos)
        << later->error();
  });
}

TEST(GroupState, AnOpClosedWithReceivesStillHeldIsFreedWhenTheyComplete) {
  // A transport that completes a cancelled receive only later (as UCX may): the failed op waits
  // as an orphan for its receives, then goes, its ring's links before the requests they point
  // at (a sanitizer build sees any access to a freed request).
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"}, {"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  LoopbackFabric fabric;
  runRanks(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 1) return;  // never joins: rank 0's ring waits on its receives
        std::vector<float> buf(100000, 1.0f);
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_FALSE(work->done());
        comm.close("aborted: the test closed it");
        ASSERT_TRUE(work->wait(std::chrono::milliseconds(1000)));
        EXPECT_TRUE(work->failed());
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (comm.engine().orphanedOps() > 0 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        EXPECT_EQ(comm.engine().orphanedOps(), 0u);
      },
      std::chrono::seconds(60),
      [&] {
        auto transport = fabric.join();
        transport->refuseWindows(true);
        transport->deferCancels(true);
        return transport;
      });
}

TEST(GroupState, ATimeoutIsRecordedAsTheGroupsFirstFailure) {
  runRanks(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 1) return;
        std::vector<float> buf(10, 1.0f);
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
        EXPECT_TRUE(work->failed());
        const Status first = comm.firstFailure().status;
        EXPECT_EQ(first.kind, StatusKind::kTimeout);
        EXPECT_EQ(first.ranks, std::vector<int>{1});  // whom it waited for
        EXPECT_NE(first.detail.find("Timed out"), std::string::npos) << first.detail;
      },
      std::chrono::milliseconds(300));
}

TEST(GroupState, ATimeoutFailsTheGroupOnEveryRank) {
  // Rank 2 comes late: ranks 0 and 1 time out; when rank 2 calls, it fails at once with their
  // words, and so does every later op, on every rank.
  runRanks(
      3,
      [](Communicator& comm) {
        std::vector<float> buf(10, 1.0f);
        if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(800));
        auto start = std::chrono::steady_clock::now();
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
        EXPECT_TRUE(work->failed());
        if (comm.rank() == 2) {
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
          EXPECT_NE(work->error().find("reports: Timed out after 300 ms"), std::string::npos)
              << work->error();
        }
        EXPECT_EQ(comm.firstFailure().status.kind, StatusKind::kTimeout);
        auto later = comm.barrier();
        ASSERT_TRUE(later->wait(std::chrono::milliseconds(100)));
        EXPECT_NE(later->error().find("the group failed earlier"), std::string::npos)
            << later->error();
      },
      std::chrono::milliseconds(300));
}

TEST(GroupState, ATimeoutNamesTheRankAtTheEndOfTheWait) {
  // Rank 3 of 5 never comes in time. In a ring only rank 4 waits on it directly; the others wait
  // on ranks that wait in turn. Halfway to the deadline each says whom it waits for, and every
  // rank's timeout follows those reports to rank 3.
  std::vector<std::string> errors(5);
  runRanks(
      5,
      [&](Communicator& comm) {
        std::vector<float> buf(1 << 16, 1.0f);
        if (comm.rank() == 3) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return;
        }
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
        errors[comm.rank()] = work->error();
      },
      std::chrono::milliseconds(600));
  for (int r : {0, 1, 2, 4}) {
    const std::string& e = errors[r];
    EXPECT_NE(e.find("Timed out after 600 ms"), std::string::npos) << e;
    const bool direct = e.find("rank 3 has not started this op") != std::string::npos;
    const bool followed = e.find("to rank 3, which has not started this op") != std::string::npos;
    EXPECT_TRUE(direct || followed) << "rank " << r << ": " << e;
  }
}

TEST(CallCheck, EveryRankNamingItselfTheRootFails) {
  // Nobody receives anything: only the call check can see it.
  std::vector<std::string> errors(3);
  runRanks(3, [&](Communicator& comm) {
    std::vector<float> buf(100, 1.0f);
    auto work = comm.broadcast(buf.data(), buf.size(), DataType::kFloat32, comm.rank());
    work->wait();
    errors[comm.rank()] = work->error();
    check(comm.barrier());  // the group goes on
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("broadcast(100 x float32 from rank"), std::string::npos) << e;
  }
}

TEST(CallCheck, ARefusalOnOneRankEndsTheOpEverywhereAndTheGroupGoesOn) {
  // Rank 0 refuses its arguments; ranks 1 and 2, in a large allreduce, fail at once naming it.
  std::vector<std::string> errors(3);
  runRanks(
      3,
      [&](Communicator& comm) {
        std::vector<float> buf(1 << 18, 1.0f);
        auto start = std::chrono::steady_clock::now();
        if (comm.rank() == 0) {
          try {
            (void)comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kBand);
            ADD_FAILURE() << "a BAND of floats was not refused";
          } catch (const Error& e) {
            EXPECT_EQ(e.kind(), StatusKind::kInvalidArgument) << e.what();
          }
        } else {
          auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
          ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
          errors[comm.rank()] = work->error();
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
        }
        for (int i = 0; i < 2; ++i) {
          std::fill(buf.begin(), buf.end(), 1.0f);
          check(comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum));
          EXPECT_EQ(buf.back(), 3.0f);
        }
      },
      std::chrono::seconds(30));
  for (int r = 1; r < 3; ++r) {
    EXPECT_NE(
        errors[r].find("rank 0 reports: rank 0 refused its call to allreduce: reduce op BAND"),
        std::string::npos)
        << errors[r];
  }
}

TEST(CallCheck, AFailedOpsLeftoversNeverTakeAPointToPointMessage) {
  // Op #0 fails on rank 1 (rank 0 refused it): for a while rank 1 discards what arrives for it.
  // A point-to-point message whose user tag has the same low bits must not be taken for that.
  runRanks(
      2,
      [&](Communicator& comm) {
        std::vector<float> buf(1 << 10, 1.0f);
        if (comm.rank() == 0) {
          EXPECT_THROW(
              (void)comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kBand),
              Error);
          const float value = 42.0f;
          check(comm.send(&value, sizeof(value), 1, /*userTag=*/0));
        } else {
          auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
          ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
          EXPECT_TRUE(work->failed());
          // The message arrives with no receive posted; housekeeping runs meanwhile.
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          float got = 0;
          CallOptions options;
          options.timeout = std::chrono::milliseconds(2000);
          check(comm.recv(&got, sizeof(got), 0, /*userTag=*/0, options));
          EXPECT_EQ(got, 42.0f);
        }
      },
      std::chrono::seconds(30));
}

TEST(CallCheck, PrintsAndNoticesSurviveTheirEncoding) {
  CallPrint p = callPrint(Collective::kReduce, 7, DataType::kInt64, ReduceOp::kMax, 2);
  EXPECT_EQ(p.describe(), "reduce(MAX, 7 x int64 to rank 2)");
  EXPECT_EQ(callPrint(Collective::kBarrier).describe(), "barrier()");
  Notice n;
  n.sequence = 41;
  n.scope = Notice::Scope::kGroupTimeout;
  n.from = 3;
  n.text = std::string(5000, 'x');
  std::string bytes = n.encode();
  EXPECT_LE(bytes.size(), Notice::kMaxBytes);
  std::optional<Notice> back = Notice::decode(bytes.data(), bytes.size());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->sequence, 41u);
  EXPECT_EQ(back->from, 3);
  EXPECT_EQ(back->scope, Notice::Scope::kGroupTimeout);
  EXPECT_FALSE(Notice::decode(bytes.data(), 3).has_value());
}

// torch 2.14's reconfigure: processes form a group from each other's handles, no store; a
// process left out (rank 2 here) is not waited for; ranks follow the list's order.
TEST(Reconfigure, ProcessesListedByHandleFormAGroupWithoutAStore) {
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::string> handles;
  for (int r = 0; r < 4; ++r) {
    engines.push_back(std::make_unique<Engine>(fabric.join()));
    handles.push_back(Communicator::handle(*engines.back()));
  }
  const std::vector<int> order = {3, 0, 1};
  const std::vector<std::string> listed = {handles[3], handles[0], handles[1]};
  together(static_cast<int>(order.size()), [&](int i) {
    auto comm = Communicator::reconfigure(*engines[order[i]], listed, 7, std::chrono::seconds(30));
    ASSERT_EQ(comm->rank(), i);
    ASSERT_EQ(comm->size(), 3);
    std::vector<double> v(1001, order[i] + 1.0);
    check(comm->allreduce(v.data(), v.size(), DataType::kFloat64, ReduceOp::kSum));
    for (double x : v) ASSERT_EQ(x, 7.0);  // 4 + 1 + 2
  });
  // Given the same handles but different uuids: every process gets an error naming both.
  std::vector<std::string> errors(order.size());
  together(static_cast<int>(order.size()), [&](int i) {
    try {
      (void)Communicator::reconfigure(*engines[order[i]], listed, i == 1 ? 9 : 8,
                                      std::chrono::seconds(30));
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("uuid 9"), std::string::npos) << e;
    EXPECT_NE(e.find("uuid 8"), std::string::npos) << e;
  }
  // Bad handles fail at once, before any message.
  const auto now = std::chrono::seconds(1);
  EXPECT_THROW((void)Communicator::reconfigure(*engines[0], {"ddl1:zz"}, 1, now), Error);
  EXPECT_THROW((void)Communicator::reconfigure(*engines[0], {handles[1]}, 1, now), Error);
  EXPECT_THROW((void)Communicator::reconfigure(*engines[0], {handles[0], handles[0]}, 1, now),
               Error);
  EXPECT_THROW((void)Communicator::reconfigure(*engines[0], {}, 1, now), Error);
  // A listed process that never calls: rank 0 (a short timeout) gives up waiting for it and
  // tells rank 1, whose own timeout is long: rank 1 fails at once with rank 0's words.
  {
    std::string error0, error1;
    double took1 = 0;
    std::thread first([&] {
      try {
        (void)Communicator::reconfigure(*engines[0], {handles[0], handles[1], handles[2]}, 3,
                                        std::chrono::milliseconds(300));
      } catch (const Error& e) {
        error0 = e.what();
      }
    });
    std::thread second([&] {
      const auto start = std::chrono::steady_clock::now();
      try {
        (void)Communicator::reconfigure(*engines[1], {handles[0], handles[1], handles[2]}, 3,
                                        std::chrono::seconds(60));
      } catch (const Error& e) {
        error1 = e.what();
      }
      took1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
    first.join();
    second.join();
    EXPECT_NE(error0.find("rank 2"), std::string::npos) << error0;
    EXPECT_NE(error1.find("rank 0 reports"), std::string::npos) << error1;
    EXPECT_NE(error1.find("rank 2"), std::string::npos) << error1;
    EXPECT_LT(took1, 10.0);
  }
  // A set's order: by host, then handle, the same whatever order it came in.
  std::vector<std::string> shuffled = {handles[2], handles[0], handles[3], handles[1]};
  EXPECT_EQ(Communicator::orderHandles(shuffled), Communicator::orderHandles(handles));
}

}  // namespace
}  // namespace ddl::test
