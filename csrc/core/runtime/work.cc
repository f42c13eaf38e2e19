#include "work.h"

#include <sched.h>

#include <optional>

#include "../base/config.h"
#include "driver.h"

namespace ddl {

bool Work::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  if (done()) return true;
  const auto spin = std::chrono::microseconds(config().spinMicros);
  std::shared_ptr<Turn> turn = turn_.lock();
  auto start = Clock::time_point();
  {
    std::optional<Turn::CallerWaits> waits;  // the progress thread keeps off the turn meanwhile
    if (turn) waits.emplace(*turn);
    // A small op lent its turn most often ends here, before any look at the clock (each costs
    // tens of nanoseconds, a share of such an op's own cost).
    if (turn && turn->help(*this, spin)) return true;
    start = Clock::now();
    while (Clock::now() - start < spin) {
      if (done()) return true;
      if (turn && turn->help(*this, spin)) return true;
      sched_yield();
    }
  }
  wakeIfDeferred();  // the thread turns it from here on
  sleepers_.fetch_add(1);
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() < 0) {
    cv_.wait(lock, [&] { return done(); });
  } else {
    cv_.wait_until(lock, start + timeout, [&] { return done(); });
  }
  sleepers_.fetch_sub(1);
  return done();
}

void Work::wakeIfDeferred() {
  if (!wakeDeferred_.exchange(false) || done()) return;
  if (std::shared_ptr<Turn> turn = turn_.lock()) turn->wake();
}

void Work::finish(Status status, std::chrono::steady_clock::time_point at) {
  const bool failed = !status.ok();
  finished_.store(at.time_since_epoch().count());
  if (started_.load() == 0) started_.store(finished_.load());  // refused before it started
  status_ = std::move(status);
  state_.store(failed ? kFailed : kSucceeded);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    cv_.notify_all();
  }
  if (hook_) {
    std::function<void()> hook = std::move(hook_);
    hook_ = nullptr;  // runs once, and drops what it captured (often the caller's own handle)
    hook();
  }
}

}  // namespace ddl
