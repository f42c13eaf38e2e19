// Task: the coroutine type algorithms are written as. An algorithm reads like blocking code
// (post, co_await, reduce, ...) yet many run at once on the one progress thread, each suspended
// where it waits. A Task starts suspended; the engine resumes it, and a Task may co_await another
// Task (the inner one runs to completion, then the outer continues). Destroying a Task destroys
// its frame and, through its locals, every Task it is awaiting.
#pragma once

#include <coroutine>
#include <exception>
#include <utility>

namespace ddl {

class [[nodiscard]] Task {
 public:
  struct promise_type {
    std::coroutine_handle<> continuation;
    std::exception_ptr exception;

    Task get_return_object() {
      return Task(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        std::coroutine_handle<> next = h.promise().continuation;
        return next ? next : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    FinalAwaiter final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { exception = std::current_exception(); }
  };

  Task() = default;
  explicit Task(std::coroutine_handle<promise_type> handle) : handle_(handle) {}
  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { reset(); }

  bool valid() const { return static_cast<bool>(handle_); }
  bool done() const { return handle_.done(); }
  std::coroutine_handle<> handle() const { return handle_; }
  // Rethrows what the coroutine threw, once it is done.
  void rethrow() const {
    if (handle_.promise().exception) std::rethrow_exception(handle_.promise().exception);
  }

  // co_await task: run it now; continue here when it finishes.
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> caller) noexcept {
    handle_.promise().continuation = caller;
    return handle_;
  }
  void await_resume() const { rethrow(); }

 private:
  void reset() {
    if (handle_) handle_.destroy();
    handle_ = {};
  }
  std::coroutine_handle<promise_type> handle_;
};

}  // namespace ddl
