// Who turns the runtime (runtime/driver.h): a caller that waits for its own op turns it itself,
// and an op whose caller was to wait and did not still ends.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "../../csrc/core/transport/ucx/ucx_transport.h"
#include "harness.h"

namespace ddl::test {
namespace {

std::unique_ptr<Transport> makeUcx() { return std::make_unique<UcxTransport>(); }

// Two ranks over UCX with no heartbeats: an idle progress thread sleeps its longest.
void runQuietPair(const RankBody& body) {
  Config settings = config();
  settings.heartbeatMillis = 0;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < 2; ++r) {
    engines.push_back(std::make_unique<Engine>(makeUcx(), Engine::Drive::kThread, Clock::steady(),
                                               nullptr, &settings));
  }
  runGroup(engines, body, std::chrono::seconds(60));
}

// Polls `work` (never waits for it) for up to 5 s; how long it took to end.
std::chrono::milliseconds pollUntilDone(Work& work) {
  const auto start = std::chrono::steady_clock::now();
  while (!work.done() && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

// An allreduce of one float whose caller waits at once; true when it ended on the caller's
// thread (its Work's completion hook runs on the thread that turned the runtime).
bool endsOnCaller(Communicator& comm, float* value) {
  CallOptions options;
  options.waited = true;
  options.work = std::make_shared<Work>("allreduce");
  const std::thread::id caller = std::this_thread::get_id();
  auto onCaller = std::make_shared<std::atomic<bool>>(false);
  options.work->setCompletionHook(
      [caller, onCaller] { onCaller->store(std::this_thread::get_id() == caller); });
  check(comm.allreduce(value, 1, DataType::kFloat32, ReduceOp::kSum, options));
  return onCaller->load();
}

TEST(Turn, ACallerThatWaitsEndsItsOwnOps) {
  for (auto factory : {TransportFactory(nullptr), TransportFactory(makeUcx)}) {
    std::atomic<int> onCaller{0};
    constexpr int kOps = 200;
    runRanks(
        2,
        [&](Communicator& comm) {
          for (int i = 0; i < kOps; ++i) {
            float value = 1.0f;
            if (endsOnCaller(comm, &value)) onCaller.fetch_add(1);
            ASSERT_EQ(value, 2.0f);
          }
        },
        std::chrono::seconds(60), factory);
    // The progress thread sleeps (it is not woken for these ops) but may wake for a timer and
    // take an op up now and then.
    EXPECT_GE(onCaller.load(), kOps) << "of " << 2 * kOps << " ops";
  }
}

TEST(Turn, AnOpWhoseCallerWasToWaitAndDidNotStillEnds) {
  runQuietPair([&](Communicator& comm) {
    check(comm.barrier());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both threads asleep
    float value = 1.0f;
    CallOptions options;
    options.waited = true;
    std::shared_ptr<Work> work =
        comm.allreduce(&value, 1, DataType::kFloat32, ReduceOp::kSum, options);
    const auto took = pollUntilDone(*work);
    ASSERT_TRUE(work->done()) << "the op never started";
    ASSERT_FALSE(work->failed()) << work->error();
    EXPECT_LT(took.count(), 1500) << "a sleeping progress thread wakes once a second";
    EXPECT_EQ(value, 2.0f);
  });
}

TEST(Turn, AnUnwaitedOpStartsAtOnceWhenItsCallerSaysSo) {
  runQuietPair([&](Communicator& comm) {
    check(comm.barrier());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    float value = 1.0f;
    CallOptions options;
    options.waited = true;
    std::shared_ptr<Work> work =
        comm.allreduce(&value, 1, DataType::kFloat32, ReduceOp::kSum, options);
    work->wakeIfDeferred();  // what a torch Work that is polled, not waited for, does
    const auto took = pollUntilDone(*work);
    ASSERT_TRUE(work->done());
    EXPECT_LT(took.count(), 300) << "without the wake-up it starts within a second";
    EXPECT_EQ(value, 2.0f);
  });
}

}  // namespace
}  // namespace ddl::test
