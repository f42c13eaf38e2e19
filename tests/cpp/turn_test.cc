// Who turns the runtime (runtime/driver.h): a caller that waits for its own op turns it itself,
// an op whose caller was to wait and did not still ends, and a spinning progress thread leaves
// such ops to their callers.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "../../csrc/core/transport/loopback/loopback.h"
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

Task endsAtOnce() { co_return; }

// An op of a group of one that ends in its first turn, submitted as a blocking call's is
// (Work::deferWake, what ThreadDriver::submit does for it) when `waited`.
std::shared_ptr<Work> submitOp(Runtime& runtime, bool waited) {
  auto group = std::make_shared<Group>();
  group->runtime = &runtime;
  group->name = "a group of one";
  auto work = std::make_shared<Work>("allreduce");
  auto op = std::make_unique<Op>(group, 0, "allreduce", std::chrono::seconds(5), work);
  op->task = endsAtOnce();
  if (waited) work->deferWake();
  runtime.submit(std::move(op), /*wakeDriver=*/false);
  return work;
}

// The progress thread, spinning after its last activity, turns without taking the ops whose
// callers are about to wait for them. Before, it took them between a caller's submission and
// its wait: each such turn was busy and renewed the spin, and the thread ran a loop of small
// blocking ops itself (tests/python/test_timing.py).
TEST(Turn, ASpinningTurnLeavesAWaitedOpToItsCaller) {
  LoopbackFabric fabric;
  Engine engine(fabric.join(), Engine::Drive::kExternal);
  Runtime& runtime = engine.runtime();
  std::shared_ptr<Work> waited = submitOp(runtime, true);
  runtime.turn(/*takeWaited=*/false);
  EXPECT_FALSE(waited->done()) << "taken from the caller about to wait for it";
  waited->wakeIfDeferred();  // the caller did not wait (it polls, or dropped the work)
  runtime.turn(/*takeWaited=*/false);
  EXPECT_TRUE(waited->done()) << "an op no caller waits for was left";

  // Beside an op no caller waits for, both are taken; a turn past the spin takes any.
  waited = submitOp(runtime, true);
  std::shared_ptr<Work> async = submitOp(runtime, false);
  runtime.turn(/*takeWaited=*/false);
  EXPECT_TRUE(waited->done() && async->done());
  waited = submitOp(runtime, true);
  runtime.turn(/*takeWaited=*/true);
  EXPECT_TRUE(waited->done());
}

}  // namespace
}  // namespace ddl::test
