// Work: the completion handle of one operation, shared by the caller and the engine. The caller
// waits (spinning briefly, turning the runtime itself when the progress thread lends it the turn
// (driver.h), then sleeping); the engine finishes it exactly once from the thread that turns the
// runtime and then runs the completion hook the caller installed before submitting.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "../base/status.h"

namespace ddl {

class Turn;

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}

  bool done() const { return state_.load(std::memory_order_acquire) != kPending; }
  bool failed() const { return state_.load(std::memory_order_acquire) == kFailed; }
  // Valid once done(): how it ended, and its words ("" when it succeeded).
  const Status& status() const { return status_; }
  const std::string& error() const { return status_.detail; }
  const std::string& description() const { return description_; }
  // Receives: the rank the data came from (-1 otherwise). Valid once done().
  int source() const { return source_; }
  void setSource(int rank) { source_ = rank; }

  // Blocks until done or until `timeout` passes (negative: no limit). Returns done().
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

  // Runs on the thread that turns the runtime (the progress thread, or a caller lent the turn)
  // right after the work finishes. Install before submitting.
  void setCompletionHook(std::function<void()> hook) { hook_ = std::move(hook); }

  // Keeps what the operation reads and writes (the caller's buffers) alive as long as this Work:
  // the engine holds the Work of a failed op until the transport lets go of its requests.
  void retain(std::shared_ptr<const void> holder) { retained_ = std::move(holder); }

  // When the engine started the op and when it finished (steady clock; 0 until then).
  std::chrono::steady_clock::time_point startedAt() const {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(started_.load()));
  }
  std::chrono::steady_clock::time_point finishedAt() const {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(finished_.load()));
  }

  // Engine side.
  // While it spins, wait() may turn the runtime on its own thread (ThreadDriver::lendTurn).
  void lendTurn(std::weak_ptr<Turn> turn) { turn_ = std::move(turn); }
  // The op was submitted without waking the progress thread, its caller being about to wait:
  // wait() turns the runtime, and a caller that drops the work unwaited calls wakeIfDeferred().
  void deferWake() { wakeDeferred_.store(true); }
  // Submitted that way and still to be waited for (no wakeIfDeferred yet).
  bool wakeDeferred() const { return wakeDeferred_.load(); }
  // Wakes the progress thread if the op was submitted without waking it and no wait() came.
  void wakeIfDeferred();
  void markStarted() { markStarted(std::chrono::steady_clock::now()); }
  void markStarted(std::chrono::steady_clock::time_point at) {
    started_.store(at.time_since_epoch().count());
  }
  void finish(Status status) { finish(std::move(status), std::chrono::steady_clock::now()); }
  // As read by the runtime that ends the op (its clock: runtime/runtime.h).
  void finish(Status status, std::chrono::steady_clock::time_point at);
  void succeed() { finish(Status()); }

 private:
  enum : int { kPending = 0, kSucceeded = 1, kFailed = 2 };
  std::string description_;
  std::atomic<int> state_{kPending};
  std::atomic<int64_t> started_{0}, finished_{0};
  std::atomic<int> sleepers_{0};
  Status status_;
  int source_ = -1;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> hook_;
  std::shared_ptr<const void> retained_;
  std::weak_ptr<Turn> turn_;
  std::atomic<bool> wakeDeferred_{false};
};

}  // namespace ddl
