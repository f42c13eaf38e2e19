#include "driver.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <vector>

#include "../base/types.h"

namespace ddl {

namespace {
// This thread may hold a Turn now (the progress thread always may): it never tries to take one,
// which a thread that holds it must not.
thread_local bool tTurns = false;
}  // namespace

Turn::Turn() {
  eventFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (eventFd_ < 0) throw Error("ddl: eventfd failed");
}

Turn::~Turn() { close(eventFd_); }

void Turn::wake() {
  if (sleeping_.load()) {
    uint64_t one = 1;
    (void)!write(eventFd_, &one, sizeof(one));
  }
}

bool Turn::holding(FunctionRef<void(Runtime&)> body, bool turns) {
  if (tTurns || !lent_.load(std::memory_order_relaxed)) return false;
  bool leftForThread = false;
  {
    std::unique_lock<std::mutex> hold(mutex_, std::try_to_lock);
    if (!hold.owns_lock() || driver_ == nullptr || !lent_.load()) return false;
    Runtime& runtime = driver_->runtime_;
    // Stopping, or stopped by the thread on its way out (before the driver forgets this turn):
    // nothing may be turned or posted any more.
    if (runtime.stopping()) return false;
    tTurns = true;
    runtime.setDriverThread(std::this_thread::get_id());  // a call() from here runs inline
    body(runtime);
    runtime.setDriverThread(driver_->thread_.get_id());
    leftForThread = turns && driver_->leftForThread();
    tTurns = false;
  }
  if (!turns) return true;
  // After the turn is free: a thread that went to sleep while this one turned, whose store of
  // sleeping_ comes before its own look at the turn, is seen asleep here (or took the turn).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (leftForThread) wake();
  return true;
}

bool Turn::help(const Work& work, std::chrono::microseconds spin) {
  holding([&work, spin](Runtime& runtime) {
    const Clock& clock = runtime.clock();
    TimePoint last = TimePoint::min();  // of the last busy turn; read only once one is idle
    while (!work.done() && !runtime.stopping()) {
      if (runtime.turn()) {
        last = TimePoint::min();
        continue;
      }
      if (last == TimePoint::min()) {
        last = clock.now();
        continue;
      }
      const TimePoint now = clock.now();
      if (now - last >= spin && now >= runtime.pollSpinsUntil()) break;
      sched_yield();
    }
  });
  return work.done();
}

namespace {

// Runtime::callOutside in a process: `call` on a thread of its own (joined before this returns:
// what it refers to stays alive), `meanwhile` on this one every `every` until it returns.
void runOutside(const std::function<void()>& call, const std::function<void()>& meanwhile,
                std::chrono::milliseconds every) {
  std::mutex mutex;
  std::condition_variable returned;
  bool done = false;
  std::exception_ptr error;
  std::thread outside([&] {
    try {
      call();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> hold(mutex);
    done = true;
    returned.notify_all();
  });
  {
    std::unique_lock<std::mutex> hold(mutex);
    while (!returned.wait_for(hold, every, [&] { return done; })) {
      hold.unlock();
      meanwhile();
      hold.lock();
    }
  }
  outside.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

ThreadDriver::ThreadDriver(Runtime& runtime) : runtime_(runtime) {
  turn_->driver_ = this;
  std::shared_ptr<Turn> turn = turn_;
  runtime_.setWakeHook([turn] { turn->wake(); });
  runtime_.setOutsideRunner(&runOutside);
  thread_ = std::thread([this] { run(); });
  runtime_.setDriverThread(thread_.get_id());
}

ThreadDriver::~ThreadDriver() {
  runtime_.requestStop();
  thread_.join();
  {
    std::lock_guard<std::mutex> hold(turn_->mutex_);
    turn_->driver_ = nullptr;
  }
  runtime_.setWakeHook(nullptr);
  runtime_.setDriverThread(std::thread::id());
}

bool ThreadDriver::holdingTurn(FunctionRef<void(Runtime&)> body) {
  return turn_->holding(body, false);
}

bool ThreadDriver::lendTurn(Op& op) {
  if (!op.work || !turn_->lent_.load()) return false;
  if (op.memory().kind() == MemoryKind::kHost) {
    op.work->lendTurn(turn_);
    return true;
  }
  std::lock_guard<std::mutex> hold(turn_->mutex_);  // a caller turning now ends its turn first
  turn_->lent_.store(false);
  return false;
}

void ThreadDriver::submit(std::unique_ptr<Op> op, bool waited) {
  const bool deferred = lendTurn(*op) && waited;
  if (deferred) op->work->deferWake();
  runtime_.submit(std::move(op), !deferred);
}

bool ThreadDriver::leftForThread() {
  // Not for a timer due less than kAwaitHandBack before the thread wakes by itself (the
  // housekeeping a period after the caller's activity): it runs that much late at most.
  return runtime_.activeOps() > 0 || runtime_.hasSubmissions() || runtime_.idle() ||
         runtime_.nextTimer() + kAwaitHandBack < turn_->sleepsUntil_.load();
}

bool ThreadDriver::nap(FunctionRef<bool()> stillAway) {
  Turn& turn = *turn_;
  turn.sleepsUntil_.store(runtime_.clock().now() + kAwaitHandBack);
  turn.sleeping_.store(true);
  if (stillAway()) {
    pollfd fd = {turn.eventFd_, POLLIN, 0};
    poll(&fd, 1, static_cast<int>(kAwaitHandBack.count()));
  }
  turn.sleeping_.store(false);
  uint64_t counter = 0;
  return read(turn.eventFd_, &counter, sizeof(counter)) == sizeof(counter) && counter > 0;
}

bool ThreadDriver::awaitHandBack() {
  Turn& turn = *turn_;
  return nap([&turn] {
    if (!turn.mutex_.try_lock()) return true;
    turn.mutex_.unlock();  // handed back meanwhile, maybe without a look at sleeping_
    return false;
  });
}

bool ThreadDriver::keepOff() {
  // A caller that leaves this thread something (Turn::help, or a wait that gives up its spin:
  // Work::wakeIfDeferred) sees it asleep and wakes it; one that stopped waiting before is seen.
  return nap([this] { return turn_->callersWaiting_.load() > 0; });
}

void ThreadDriver::sleep(std::unique_lock<std::mutex>& hold) {
  Turn& turn = *turn_;
  turn.sleeping_.store(true);
  Transport& transport = runtime_.transport();
  std::vector<pollfd> fds = {{turn.eventFd_, POLLIN, 0}};
  // A second at most: an op submitted for a caller that was to wait and did not (deferred
  // wake: Work::deferWake) starts within it.
  int timeoutMs = 1000;
  const bool sleeps = !runtime_.hasSubmissions() && transport.arm();
  if (sleeps) {
    const TimePoint now = runtime_.clock().now();
    const TimePoint next = runtime_.nextTimer();
    if (next != TimePoint::max()) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now);
      timeoutMs = static_cast<int>(std::clamp<long>(wait.count() + 1, 0, timeoutMs));
    }
    if (transport.wakeFd() >= 0) {
      fds.push_back({transport.wakeFd(), POLLIN, 0});
    } else {
      timeoutMs = std::min(timeoutMs, 1);
    }
    for (int fd : runtime_.watchedFds()) fds.push_back({fd, POLLIN, 0});  // a watched peer exits
    turn.sleepsUntil_.store(now + std::chrono::milliseconds(timeoutMs));
  }
  hold.unlock();  // a caller may turn while this thread sleeps
  if (sleeps) poll(fds.data(), fds.size(), timeoutMs);
  turn.sleeping_.store(false);
  uint64_t counter;
  (void)!read(turn.eventFd_, &counter, sizeof(counter));
}

void ThreadDriver::run() {
  tTurns = true;
  const Clock& clock = runtime_.clock();
  const auto spin = std::chrono::microseconds(runtime_.config().spinMicros);
  TimePoint lastActivity = clock.now();
  std::unique_lock<std::mutex> hold(turn_->mutex_, std::defer_lock);
  bool woken = false;  // by a caller that left something to this thread
  while (true) {
    if (!woken && turn_->callersWaiting_.load() > 0) {
      woken = keepOff();
      if (woken) lastActivity = clock.now();
      continue;
    }
    woken = false;
    if (!hold.try_lock()) {  // a caller turns
      // Handed back with work left: the caller's turns were activity, as this thread's are.
      if (awaitHandBack()) lastActivity = clock.now();
      continue;
    }
    // While it spins after its last activity, the thread leaves the ops whose callers are about
    // to wait for them to those callers: taken between a caller's submission and its wait, each
    // such turn was busy and renewed the spin, and the thread ran a loop's small blocking ops
    // one after the other (0.15 - 0.3 of a core beside such a loop, more by chance). Past the
    // spin it takes them, in case their callers never wait.
    const bool spinning = clock.now() - lastActivity < spin;
    const bool busy = runtime_.turn(/*takeWaited=*/!spinning);
    if (runtime_.stopping()) break;
    const TimePoint now = clock.now();
    if (busy) {
      lastActivity = now;
    } else if (now - lastActivity < spin || now < runtime_.pollSpinsUntil()) {
      hold.unlock();
      sched_yield();
      continue;
    } else if (!runtime_.idle()) {  // no notice is left untaken
      sleep(hold);
      lastActivity = clock.now();
      continue;
    }
    hold.unlock();
  }
  runtime_.stop();
}

}  // namespace ddl
