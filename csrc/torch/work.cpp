#include "work.hpp"

#include <c10/util/Exception.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "compat.hpp"
#include "errors.hpp"

namespace ddl {
namespace {

// Finalizes works whose Future someone holds, off the progress thread: Future callbacks (DDP's
// comm hooks among them) run here, never on the thread that drives the network. A callback may
// start a collective and wait for its future (PowerSGD does), whose completion is posted here
// too: so that it never waits behind the callback that waits for it, a worker is added whenever
// more completions are queued than workers are idle (up to kMaxWorkers; idle ones stay).
class CompletionThreads {
 public:
  static CompletionThreads& instance() {
    static auto* threads = new CompletionThreads();  // never destroyed: may outlive exit
    return *threads;
  }
  void post(std::function<void()> fn) {
    bool spawn = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(fn));
      spawn = queue_.size() > idle_ && workers_ < kMaxWorkers;
      if (spawn) ++workers_;
    }
    if (spawn) {
      std::thread([this] { work(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  static constexpr size_t kMaxWorkers = 64;

  void work() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ++idle_;
        cv_.wait(lock, [&] { return !queue_.empty(); });
        --idle_;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t idle_ = 0;
  size_t workers_ = 0;
};

// Calls each hook of `hooks` (a map by id, guarded by `mutex`) in id order, outside the lock; a
// hook's own failure is not the op's, and the others still run.
template <typename Hook, typename... Args>
void callEach(std::mutex& mutex, const std::map<int64_t, Hook>& hooks, const Args&... args) {
  std::vector<Hook> copies;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [id, hook] : hooks) copies.push_back(hook);
  }
  for (const auto& hook : copies) {
    try {
      hook(args...);
    } catch (...) {
    }
  }
}

float millisecondsOf(const ddl::Work& core) {
  return std::chrono::duration<float, std::milli>(core.finishedAt() - core.startedAt()).count();
}

}  // namespace

void WorkObservers::runAbortHooks() {
  if (!abortHooked.load() || abortHooksRan.exchange(true)) return;
  callEach(mutex, abortHooks);
}

#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
void WorkObservers::runCompletionHooks(const c10d::CompletionHookArgs& args) {
  callEach(mutex, completionHooks, args);
}
#endif

void WorkObservers::afterFailedOp() {
  std::function<bool()> failed;
  {
    std::lock_guard<std::mutex> lock(mutex);
    failed = groupFailed;
  }
  if (failed && failed()) runAbortHooks();
}

namespace {
std::atomic<uint64_t> gCompletionKeys{1};
}  // namespace

WorkDDL::WorkDDL(const char* name, int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      completionKey_(gCompletionKeys.fetch_add(1)),
      name_(name),
      future_(torch_compat::tensorListFuture()) {}

WorkDDL::~WorkDDL() = default;

float WorkDDL::getDuration() const {
  TORCH_CHECK(observers_ && observers_->timing.load(),
              "ddl: get_duration needs the group's collective timing: call "
              "ProcessGroup._enable_collectives_timing() before the call");
  TORCH_CHECK(core_ && core_->done(), "ddl: get_duration of ", name_, " before it finished");
  return millisecondsOf(*core_);
}

std::shared_ptr<ddl::Work> WorkDDL::coreWork() {
  core_ = std::make_shared<ddl::Work>(name_);
  auto self = c10::intrusive_ptr<WorkDDL>::reclaim_copy(this);
  // The hook holds `self` until it runs (once, on the progress thread). A device op is always
  // finalized at once: the caller's streams may be waiting for it.
  core_->setCompletionHook([self] {
    if (self->futureRequested_.load() || self->device_) {
      CompletionThreads::instance().post([self] { self->finalize(); });
    }
#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
    if (!self->core_->failed() && self->observers_ && self->observers_->completionHooked.load()) {
      c10d::CompletionHookArgs args;
      args.completionKey = self->completionKey_;
      if (self->observers_->timing.load()) args.duration_ms = millisecondsOf(*self->core_);
      auto observers = self->observers_;
      CompletionThreads::instance().post(
          [observers, args] { observers->runCompletionHooks(args); });
    }
#endif
    if (self->core_->failed() && self->observers_ && self->observers_->abortHooked.load()) {
      auto observers = self->observers_;
      CompletionThreads::instance().post([observers] { observers->afterFailedOp(); });
    }
    std::function<void(std::shared_ptr<c10d::WorkInfo>)> hook;
    if (self->observers_ && self->observers_->hooked.load()) {
      std::lock_guard<std::mutex> lock(self->observers_->mutex);
      hook = self->observers_->hook;
    }
    if (hook) {  // c10d's fields; run where Future callbacks run, never on the progress thread
      const ddl::Work& core = *self->core_;
      auto info = std::make_shared<c10d::WorkInfo>(
          self->retrieveOpType(), self->sequence_, core.startedAt(), core.finishedAt(),
          std::chrono::duration<float>(core.finishedAt() - core.startedAt()));
      auto observers = self->observers_;
      if (!self->hookCounted_) observers->hooksRunning.fetch_add(1);
      CompletionThreads::instance().post([hook, info, observers] {
        try {
          hook(info);
        } catch (...) {  // the hook's own failure: not the op's
        }
        observers->hooksRunning.fetch_sub(1);
      });
    }
  });
  return core_;
}

std::shared_ptr<const void> WorkDDL::tensorsInUse() const {
  auto held = std::make_shared<std::vector<at::Tensor>>(outputs_);
  held->insert(held->end(), keep_.begin(), keep_.end());
  for (const auto& [destination, source] : copies_) {
    held->push_back(destination);
    held->push_back(source);
  }
  return held;
}

void WorkDDL::finalize() {
  int expected = 0;
  if (!finalizeState_.compare_exchange_strong(expected, 1)) {
    while (finalizeState_.load() != 2) finalizeState_.wait(1);
    return;
  }
  std::exception_ptr error;
  auto finish = [&] {
    if (core_->failed()) {
      error = torch_errors::exceptionFor(core_->status());
      return;
    }
    at::NoGradGuard noGrad;
    for (auto& [destination, source] : copies_) destination.copy_(source);
    for (auto& fn : after_) fn();
  };
  try {
    if (device_) {
      device_->finishOnHost(finish);
    } else {
      finish();
    }
  } catch (...) {
    error = std::current_exception();
  }
  copies_.clear();
  keep_.clear();
  after_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
  }
  cv_.notify_all();
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finalizeState_.store(2);
  finalizeState_.notify_all();
}

bool WorkDDL::isCompleted() {
  if (!core_->done()) {
    core_->wakeIfDeferred();  // polled, not waited for
    return false;
  }
  finalize();
  return true;
}

bool WorkDDL::isSuccess() const { return core_->done() && !core_->failed(); }

std::exception_ptr WorkDDL::exception() const {
  if (core_->done() && core_->failed()) return torch_errors::exceptionFor(core_->status());
  return nullptr;
}

std::vector<at::Tensor> WorkDDL::result() { return outputs_; }

void WorkDDL::onDevice(std::shared_ptr<DeviceCompletion> completion,
                       c10::intrusive_ptr<c10::ivalue::Future> future) {
  device_ = std::move(completion);
  future_ = std::move(future);
}

bool WorkDDL::wait(std::chrono::milliseconds timeout) {
  bool unlimited = timeout == kNoTimeout || timeout.count() < 0;
  if (!core_->wait(unlimited ? std::chrono::milliseconds(-1) : timeout)) {
    C10_THROW_ERROR(DistBackendError, "ddl: wait() gave up after " +
                                          std::to_string(timeout.count()) + " ms on " +
                                          core_->description() + ", which is still running");
  }
  finalize();
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkDDL::getFuture() {
  futureRequested_.store(true);
  core_->wakeIfDeferred();  // its callbacks, not a wait, take the result
  if (core_->done()) finalize();
  return future_;
}

int WorkDDL::sourceRank() const { return core_ ? core_->source() : -1; }

CoalescedWorkDDL::CoalescedWorkDDL(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)) {}

bool CoalescedWorkDDL::isCompleted() {
  for (auto& w : works_) {
    if (!w->isCompleted()) return false;
  }
  return true;
}

bool CoalescedWorkDDL::isSuccess() const {
  for (const auto& w : works_) {
    if (!w->isSuccess()) return false;
  }
  return true;
}

std::exception_ptr CoalescedWorkDDL::exception() const {
  for (const auto& w : works_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

std::vector<at::Tensor> CoalescedWorkDDL::result() {
  std::vector<at::Tensor> all;
  for (auto& w : works_) {
    for (at::Tensor& t : w->result()) all.push_back(t);
  }
  return all;
}

bool CoalescedWorkDDL::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto& w : works_) {
    if (timeout == kNoTimeout) {
      w->wait();
      continue;
    }
    // At least 1 ms: c10d reads 0 as no timeout, and a member awaited once no time is left
    // would be waited for without end.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    w->wait(std::max(left, std::chrono::milliseconds(1)));
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> CoalescedWorkDDL::getFuture() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (future_) return future_;
  future_ = torch_compat::tensorListFuture();
  if (works_.empty()) {
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return future_;
  }
  struct Pending {
    std::atomic<size_t> left;
    std::mutex mutex;
    std::exception_ptr error;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = works_.size();
  auto self = c10::intrusive_ptr<CoalescedWorkDDL>::reclaim_copy(this);
  for (auto& w : works_) {
    w->getFuture()->addCallback([pending, self](c10::ivalue::Future& f) {
      if (f.hasError()) {
        std::lock_guard<std::mutex> lock(pending->mutex);
        if (!pending->error) pending->error = f.exception_ptr();
      }
      if (pending->left.fetch_sub(1) == 1) {
        if (pending->error) {
          self->future_->setError(pending->error);
        } else {
          self->future_->markCompleted(c10::IValue(self->result()));
        }
      }
    });
  }
  return future_;
}

BatchMemberWork::BatchMemberWork(int rank, c10d::OpType type, std::vector<at::Tensor> tensors,
                                 int source, std::shared_ptr<Batch> batch)
    : c10d::Work(rank, type),
      tensors_(std::move(tensors)),
      source_(source),
      batch_(std::move(batch)) {}

c10d::Work& BatchMemberWork::batch() const {
  TORCH_CHECK(batch_->posted.load(),
              "ddl: this op belongs to a coalesced batch that has not been posted: its sends and "
              "receives start together when coalescing ends (endCoalescing), or the batch was "
              "refused");
  return *batch_->work;
}

bool BatchMemberWork::isCompleted() { return batch_->posted.load() && batch().isCompleted(); }

bool BatchMemberWork::isSuccess() const { return batch().isSuccess(); }

std::exception_ptr BatchMemberWork::exception() const {
  return batch_->posted.load() ? batch().exception() : nullptr;
}

bool BatchMemberWork::wait(std::chrono::milliseconds timeout) { return batch().wait(timeout); }

c10::intrusive_ptr<c10::ivalue::Future> BatchMemberWork::getFuture() { return batch().getFuture(); }

}  // namespace ddl
