// The other collectives over the loopback transport, one thread per rank: world sizes 1-12,
// counts 0, 1, primes and large (broadcast, allgather, reduce-scatter, reduce, gather, scatter,
// all_to_all, point-to-point, barrier), and what a failed or refused call does.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "../../csrc/core/base/tag.h"
#include "collective_checks.h"
#include "harness.h"
#include "values.h"

namespace ddl::test {
namespace {

class WorldSize : public ::testing::TestWithParam<int> {};

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

// The ring and Bruck's rounds (TORCH_DDL_ALLGATHER_ALGO: reduce_scatter takes Bruck where the
// allgather of its block size would) against the expected values, at every world size.
TEST_P(WorldSize, ReduceScatter) {
  for (const char* schedule : {"ring", "bruck"}) {
    SCOPED_TRACE(schedule);
    ScopedEnv env({{"TORCH_DDL_SEGMENT_BYTES", "24"},
                   {"TORCH_DDL_PIPELINE_DEPTH", "2"},
                   {"TORCH_DDL_ALLGATHER_ALGO", schedule}});
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
                throw Error(describe(std::string("reduce_scatter ") + schedule, size, comm.rank(),
                                     t, op, count, i, got, want));
              }
            }
          }
        }
      }
    });
  }
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

// Both schedules (TORCH_DDL_GATHER_ALGO) from every root: the tree's subtrees that run past rank
// P - 1 at the root, its scratch at the others, the root's block given in place, no bytes at all.
TEST_P(WorldSize, GatherLinearAndTreeFromEveryRoot) {
  const int size = GetParam();
  for (const char* schedule : {"linear", "tree"}) {
    SCOPED_TRACE(schedule);
    ScopedEnv env({{"TORCH_DDL_GATHER_ALGO", schedule}});
    runRanks(size, [&](Communicator& comm) {
      const int me = comm.rank();
      for (size_t count : {size_t{0}, size_t{1}, size_t{257}}) {
        for (int root = 0; root < size; ++root) {
          for (bool inPlace : {false, true}) {
            std::vector<int16_t> in(count), out(count * size + 1, -7);
            for (size_t i = 0; i < count; ++i) in[i] = static_cast<int16_t>(me * 1000 + i);
            const std::vector<int16_t> keep = in;
            const int16_t* from = in.data();
            if (inPlace && me == root) {
              std::copy(in.begin(), in.end(), out.begin() + me * count);
              from = out.data() + me * count;
            }
            check(comm.gather(from, out.data(), count, DataType::kInt16, root));
            ASSERT_EQ(in, keep) << "gather modified its input";
            if (me != root) {
              ASSERT_EQ(out, std::vector<int16_t>(count * size + 1, -7)) << "written off the root";
              continue;
            }
            for (int r = 0; r < size; ++r) {
              for (size_t i = 0; i < count; ++i) {
                ASSERT_EQ(out[r * count + i], static_cast<int16_t>(r * 1000 + i))
                    << "root " << root << ", block of rank " << r << ", element " << i;
              }
            }
            ASSERT_EQ(out[count * size], -7) << "written past the output";
          }
        }
      }
    });
  }
}

// Both schedules (TORCH_DDL_ALLTOALL_ALGO) on layouts that Bruck's forwarding must carry: blocks
// of sizes only their sender and receiver know (some empty, some of a few KiB), blocks all of one
// size, and no bytes at all.
TEST_P(WorldSize, AlltoallPairwiseAndBruckCarryEveryLayout) {
  const int size = GetParam();
  for (const char* schedule : {"pairwise", "bruck"}) {
    SCOPED_TRACE(schedule);
    ScopedEnv env({{"TORCH_DDL_ALLTOALL_ALGO", schedule}});
    runRanks(size, [&](Communicator& comm) {
      const int me = comm.rank();
      const std::vector<std::function<size_t(int, int)>> layouts = {
          [](int from, int to) { return static_cast<size_t>((from * 7 + to * 3) % 5) * 997; },
          [](int, int) { return size_t{1031}; },
          [](int, int) { return size_t{0}; },
      };
      for (const auto& bytesOf : layouts) {
        AlltoallLayout layout;
        size_t sendTotal = 0, recvTotal = 0;
        for (int p = 0; p < size; ++p) {
          layout.sendOffsets.push_back(sendTotal);
          layout.sendBytes.push_back(bytesOf(me, p));
          sendTotal += bytesOf(me, p);
          layout.recvOffsets.push_back(recvTotal);
          layout.recvBytes.push_back(bytesOf(p, me));
          recvTotal += bytesOf(p, me);
        }
        std::vector<uint8_t> in(sendTotal + 1), out(recvTotal + 1, 0xEE);
        for (int p = 0; p < size; ++p) {
          for (size_t b = 0; b < layout.sendBytes[p]; ++b) {
            in[layout.sendOffsets[p] + b] = static_cast<uint8_t>(me * 31 + p * 5 + b);
          }
        }
        check(comm.alltoall(in.data(), out.data(), layout));
        for (int p = 0; p < size; ++p) {
          for (size_t b = 0; b < layout.recvBytes[p]; ++b) {
            ASSERT_EQ(out[layout.recvOffsets[p] + b], static_cast<uint8_t>(p * 31 + me * 5 + b))
                << "block from rank " << p << ", byte " << b;
          }
        }
        ASSERT_EQ(out[recvTotal], 0xEE) << "written past the output";
      }
    });
  }
}

// A rank that expects a block of another size than its sender sends: both schedules fail its op
// as a mismatch naming the sender, and the group goes on.
TEST_P(WorldSize, AlltoallOfSplitsThatDisagreeFailsNamingTheSender) {
  const int size = GetParam();
  if (size < 2) return;
  for (const char* schedule : {"pairwise", "bruck"}) {
    SCOPED_TRACE(schedule);
    ScopedEnv env({{"TORCH_DDL_ALLTOALL_ALGO", schedule}});
    runRanks(size, [&](Communicator& comm) {
      const int me = comm.rank(), last = size - 1;
      AlltoallLayout layout;
      for (int p = 0; p < size; ++p) {
        layout.sendOffsets.push_back(p * 16);
        layout.sendBytes.push_back(8);
        layout.recvOffsets.push_back(p * 16);
        layout.recvBytes.push_back(me == 0 && p == last ? 12 : 8);  // rank 0 expects 12 of the last
      }
      std::vector<uint8_t> in(size * 16, 1), out(size * 16, 0);
      std::shared_ptr<Work> work = comm.alltoall(in.data(), out.data(), layout);
      work->wait();
      if (me == 0) {  // the others may have received all they expect before it failed
        EXPECT_TRUE(work->failed());
        EXPECT_NE(work->error().find("rank " + std::to_string(last) + " sent"), std::string::npos)
            << work->error();
      }
      // The group goes on. An allreduce right after may fail on every rank where the news of
      // the mismatch had not reached every rank as it started (a mismatch too, the latest on
      // every rank, whatever news is still on its way): the next resyncs the ranks'
      // shared-memory windows at the same op (shm/shared_ring.h) and sums.
      bool summed = false;
      for (int attempt = 0; attempt < 2 && !summed; ++attempt) {
        std::vector<double> v(257, 1.0);
        auto w = comm.allreduce(v.data(), v.size(), DataType::kFloat64, ReduceOp::kSum);
        w->wait();
        summed = !w->failed();
        if (summed) {
          EXPECT_EQ(v.back(), size);
        } else {
          EXPECT_TRUE(w->error().find("knowing of different earlier mismatched ops") !=
                          std::string::npos ||
                      w->error().find("decided differently") != std::string::npos)
              << w->error();
        }
      }
      EXPECT_TRUE(summed);
    });
  }
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
  EXPECT_NE(message.find("all_reduce on group"), std::string::npos) << message;
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
      EXPECT_NE(errors[r].find("all_reduce(SUM, 100 x float32)"), std::string::npos) << errors[r];
      EXPECT_NE(errors[r].find("all_reduce(SUM, " + other + ")"), std::string::npos) << errors[r];
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

TEST(Collectives, AGroupLargerThanTheSourceFieldIsRefusedBeforeTheStoreIsAsked) {
  LoopbackFabric fabric;
  Engine engine(fabric.join());
  auto store = std::make_shared<MemoryStore>();
  const int size = static_cast<int>(tag::kMaxRanks) + 1;
  try {
    Communicator::create(engine, store, 0, size, std::chrono::milliseconds(300));
    FAIL() << "a group of " << size << " ranks was created";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups are limited to 1048576 ranks"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(store->add("ddl/joined", 0), 0);  // nobody counted itself in
}

TEST(Collectives, FailedOpKeepsItsBuffersUntilTheTransportLetsGo) {
  LoopbackFabric fabric;
  auto holding = std::make_unique<HoldingTransport>(fabric.join());
  HoldingTransport* transport = holding.get();
  Engine lonely(std::move(holding));
  Engine absent(fabric.join());
  auto store = std::make_shared<MemoryStore>();
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
  auto storeA = std::make_shared<MemoryStore>(counter),
       storeB = std::make_shared<MemoryStore>(counter);
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
