// A busy progress thread: an op that computes on it for long lets it turn, so that heartbeats
// leave and no peer counts the rank gone for good.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "../../csrc/core/runtime/heartbeat.h"
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

// A store that answers lookups of addresses late once `slow` is set: its one server queued
// behind thousands of requests, or the link to it stalled.
class SlowStore : public MemoryStore {
 public:
  std::atomic<bool> slow{false};
  std::atomic<int> lookups{0};
  std::string get(const std::string& key) override {
    holdIfAddress(key);
    return MemoryStore::get(key);
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    if (!keys.empty()) holdIfAddress(keys.front());
    std::vector<std::string> values;
    for (const std::string& key : keys) values.push_back(MemoryStore::get(key));
    return values;
  }

 private:
  void holdIfAddress(const std::string& key) {
    if (!slow.load() || key.find("/address/") == std::string::npos) return;
    lookups.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  }
};

// Rank 0 of 9 (on hosts of their own) sends to rank 3, whose address creation did not tell it (it
// knows the ranks at distances 1, 2 and 4 each way): it looks it up in the store, which takes 1 s,
// more than the heartbeat timeout of 300 ms. Its beats go on meanwhile: nobody counts it gone, and
// the send arrives. Before, the rank's turning thread waited for the store and sent no beat; its
// watchers counted it gone and the group failed.
TEST(Busy, ARankWaitingForTheStoreGoesOnBeating) {
  ScopedEnv env({{"TORCH_DDL_HEARTBEAT_MS", "20"}, {"TORCH_DDL_HEARTBEAT_TIMEOUT_MS", "300"}});
  auto store = std::make_shared<SlowStore>();
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<Locality> hosts;  // a rank a host: the ring's partners are its neighbours
  for (int r = 0; r < 9; ++r) {
    engines.push_back(std::make_unique<Engine>(fabric.join()));
    hosts.push_back(Locality{"h" + std::to_string(r), "m" + std::to_string(r)});
  }
  const Topology machine = buildTopology(hosts);
  runGroup(
      engines,
      [&](Communicator& comm) {
        check(comm.barrier());
        if (comm.rank() == 0) store->slow = true;
        check(comm.barrier());
        int value = comm.rank() == 0 ? 42 : 0;
        if (comm.rank() == 0) check(comm.send(&value, sizeof(value), 3, 7));
        if (comm.rank() == 3) {
          check(comm.recv(&value, sizeof(value), 0, 7));
          EXPECT_EQ(value, 42);
        }
        check(comm.barrier());
        EXPECT_TRUE(comm.goneRanks().empty()) << "rank " << comm.rank();
      },
      std::chrono::seconds(30), &machine, store);
  EXPECT_EQ(store->lookups.load(), 1);
}

// Two processes that beat each other every 250 ms, counted gone after 2 s of silence, ticked at
// the times given (as their progress threads would).
struct TwoBeating {
  LoopbackFabric fabric;
  std::unique_ptr<LoopbackTransport> transports[2];
  std::unique_ptr<Heartbeat> beats[2];
  std::string addresses[2];
  TimePoint start;

  TwoBeating() {
    for (int i = 0; i < 2; ++i) {
      transports[i] = fabric.join();
      addresses[i] = transports[i]->localAddress();
      beats[i] = std::make_unique<Heartbeat>(std::chrono::milliseconds(250),
                                             std::chrono::milliseconds(2000));
      beats[i]->setSelf(addresses[i]);
    }
    for (int i = 0; i < 2; ++i) {
      const int other = 1 - i;
      beats[i]->beat(addresses[other], transports[i]->connect(addresses[other]));
      beats[i]->watch(addresses[other], start);
    }
  }
  ~TwoBeating() {
    for (int i = 0; i < 2; ++i) beats[i]->stop(*transports[i]);
  }
  // Process i's tick at `ms`: the words of the peers it counts gone.
  std::vector<std::string> tick(int i, int ms) {
    transports[i]->progress();
    std::vector<std::string> gone;
    for (auto& [address, why] :
         beats[i]->tick(*transports[i], start + std::chrono::milliseconds(ms),
                        [](const std::string&) { return false; })) {
      gone.push_back(why);
    }
    return gone;
  }
};

// A process away for longer than the timeout (stopped, its host paused, its progress thread busy)
// finds its peers' beats of that stretch not yet taken when it comes back: it does not count them
// gone for its own absence. Before, both processes of a paused machine counted each other gone on
// their first tick after it.
TEST(Heartbeat, AProcessAwayDoesNotCountItsPeersGoneForItsOwnAbsence) {
  TwoBeating two;
  for (int ms = 0; ms <= 1000; ms += 250) {
    for (int i : {1, 0}) EXPECT_TRUE(two.tick(i, ms).empty()) << i << " at " << ms;
  }
  // Both away from 1 s to 4 s (a machine paused). Process 0 took every beat of process 1's at
  // 1 s, and ticks at 4 s before process 1 beats again: nothing from it for 3 s.
  for (int i : {0, 1}) EXPECT_TRUE(two.tick(i, 4000).empty()) << i;
  for (int ms = 4250; ms <= 8000; ms += 250) {
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(two.tick(i, ms).empty()) << i << " at " << ms;
  }
}

// A process away from the moment it began to watch a peer (its turning thread waiting for the
// store right after the group's creation) does not count the peer gone for that absence, and
// does count it gone once it has listened for the timeout. Before, its last tick had found
// nothing to watch and left no due time, so the absence was taken for the peer's silence.
TEST(Heartbeat, AProcessAwayFromItsFirstWatchDoesNotCountThePeerGoneForIt) {
  LoopbackFabric fabric;
  std::unique_ptr<LoopbackTransport> transport = fabric.join();
  std::unique_ptr<LoopbackTransport> silent = fabric.join();
  Heartbeat beats(std::chrono::milliseconds(250), std::chrono::milliseconds(2000));
  beats.setSelf(transport->localAddress());
  const TimePoint start{};
  auto tick = [&](int ms) {
    transport->progress();
    return beats.tick(*transport, start + std::chrono::milliseconds(ms),
                      [](const std::string&) { return false; });
  };
  EXPECT_TRUE(tick(0).empty());  // nothing watched yet
  beats.watch(silent->localAddress(), start + std::chrono::milliseconds(10));
  EXPECT_TRUE(tick(2510).empty());  // away 2.5 s since the watch began
  int at = 2510;
  std::vector<std::pair<std::string, std::string>> gone;
  while (gone.empty() && at < 10000) gone = tick(at += 250);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(at, 4510);  // listened from 2.51 s: 2 s of silence at 4.51 s
  beats.stop(*transport);
}

// ... while a peer that falls silent while this process listens is still counted gone after the
// timeout, an absence of this process's before it notwithstanding.
TEST(Heartbeat, APeerSilentWhileThisProcessListensIsCountedGoneInTime) {
  TwoBeating two;
  for (int ms = 0; ms <= 1000; ms += 250) {
    for (int i : {1, 0}) EXPECT_TRUE(two.tick(i, ms).empty());
  }
  EXPECT_TRUE(two.tick(0, 4000).empty());  // process 0 away for 3 s; process 1 stopped at 1 s
  std::vector<std::string> gone;
  int at = 4000;
  while (gone.empty() && at < 10000) gone = two.tick(0, at += 250);
  ASSERT_EQ(gone.size(), 1u);
  // Process 0 listened from its tick at 1 s to when the next was due (1.25 s), then from 4 s:
  // 2 s of silence at 5.75 s.
  EXPECT_EQ(at, 5750);
  EXPECT_NE(gone[0].find("no heartbeat for 2000 ms"), std::string::npos) << gone[0];
}

}  // namespace
}  // namespace ddl::test
