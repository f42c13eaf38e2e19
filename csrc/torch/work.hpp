// The c10d Work of a ddl call: it finishes with the core Work, copies results that need a copy
// into the caller's tensors, and completes the Future (Future callbacks run on completion
// threads, never on the progress thread).
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "../core/runtime/work.h"
#include "compat.hpp"
#include "device_streams.hpp"

namespace ddl {

// What a backend asks of its Works' ends: the completion hook (registerOnCompletionHook) and
// whether get_duration is on (enableCollectivesTiming).
struct WorkObservers {
  std::atomic<bool> timing{false};
  std::mutex mutex;
  std::function<void(std::shared_ptr<c10d::WorkInfo>)> hook;  // set once, under mutex
  std::atomic<bool> hooked{false};  // hook is set: ops without one take no lock
  // While a hook is registered: the ops not known to have ended, and hook calls not yet over
  // (waitForPendingWorks waits for both).
  std::vector<std::weak_ptr<ddl::Work>> pending;
  std::atomic<int> hooksRunning{0};
  // Abort hooks (registerAbortHook), by id, under mutex. They run once per communicator: after
  // its first failure (a timeout or a lost peer, as groupFailed says; not a refused argument),
  // on a completion thread, or in abort() before it closes the group.
  std::map<int64_t, std::function<void()>> abortHooks;
  std::atomic<bool> abortHooked{false};
  std::atomic<bool> abortHooksRan{false};
  std::function<bool()> groupFailed;  // under mutex
  void runAbortHooks();
  void afterFailedOp();  // runAbortHooks if the group failed
#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
  // Completion hooks (registerCompletionHook), by id, under mutex: each op that succeeds calls
  // them once, on a completion thread.
  std::map<int64_t, c10d::CompletionHook> completionHooks;
  std::atomic<bool> completionHooked{false};
  void runCompletionHooks(const c10d::CompletionHookArgs& args);
#endif
};

// A c10d Work over a core Work. Results that need a copy after the transfer (non-contiguous
// outputs, list-form outputs) are finalized exactly once: by the first of wait(),
// isCompleted(), getFuture() on a finished op, or the completion thread when a Future is pending.
class WorkDDL : public c10d::Work {
 public:
  // `name`: the c10d call's ("all_gather_into_tensor"), in its errors and its core Work's.
  WorkDDL(const char* name, int rank, c10d::OpType type, std::vector<at::Tensor> outputs);
  ~WorkDDL() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  int sourceRank() const override;
  // Milliseconds from the engine starting the op to its end (after enableCollectivesTiming).
  float getDuration() const override;
  uint64_t getSequencenumber() const override { return sequence_; }
#ifdef DDL_TORCH_HAS_WORK_TIMEOUT
  // The op's timeout: the call's, else the group's at the call.
  std::chrono::milliseconds getTimeout() const override { return timeout_; }
#endif
#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
  // Unique in the process (never reused): what completion hooks report.
  uint64_t getCompletionKey() const override { return completionKey_; }
#endif
  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // Before coreWork(): who is told of the end, and the op's number in its group.
  void observe(std::shared_ptr<WorkObservers> observers, uint64_t sequence) {
    observers_ = std::move(observers);
    sequence_ = sequence;
  }
  // The hook call this op will make is counted in observers->hooksRunning from now on (not
  // only once it is posted), so that waitForPendingWorks cannot see the op done and no hook
  // running in between.
  void countHookCall() {
    hookCounted_ = true;
    observers_->hooksRunning.fetch_add(1);
  }

  // Setup, before start(). Copies run in the order given; `source` must be a view of the
  // buffer the operation writes (not a copy taken now).
  void copyAfter(at::Tensor destination, at::Tensor source) {
    copies_.emplace_back(std::move(destination), std::move(source));
  }
  // A copy that runs before those given so far (the first of a chain: see stageOnHost).
  void copyFirst(at::Tensor destination, at::Tensor source) {
    copies_.emplace(copies_.begin(), std::move(destination), std::move(source));
  }
  void keepAlive(at::Tensor tensor) { keep_.push_back(std::move(tensor)); }
  // The op's buffer is a host copy of device tensors (stageOnHost): it is ordered on the
  // device's streams and completes there, but runs on host memory.
  void markStagedOnHost() { stagedOnHost_ = true; }
  bool stagedOnHost() const { return stagedOnHost_; }
  // Runs at finalization after the copies, on success only; what it throws fails the work.
  void thenRun(std::function<void()> fn) { after_.push_back(std::move(fn)); }
  // The core Work this one finishes with; its completion hook is installed here.
  std::shared_ptr<ddl::Work> coreWork();
  // Every tensor the operation may touch (outputs, kept tensors, copies), for the core Work to
  // retain.
  std::shared_ptr<const void> tensorsInUse() const;
  // A device op: completes through `completion`; its Future is `future` (device-aware).
  void onDevice(std::shared_ptr<DeviceCompletion> completion,
                c10::intrusive_ptr<c10::ivalue::Future> future);
  const char* name() const { return name_; }

 private:
  void finalize();

  std::vector<at::Tensor> outputs_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> after_;
  std::shared_ptr<ddl::Work> core_;
  std::shared_ptr<WorkObservers> observers_;
  uint64_t sequence_ = 0;
  uint64_t completionKey_;
  std::chrono::milliseconds timeout_{0};
  bool hookCounted_ = false;
  bool stagedOnHost_ = false;
  const char* name_;
  std::shared_ptr<DeviceCompletion> device_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> futureRequested_{false};
  std::atomic<int> finalizeState_{0};  // 0 not started, 1 running, 2 done
};

// The Work of a coalesced batch (startCoalescing ... endCoalescing): the ops called between, as
// one Work that is done when they all are, fails with the first of them that failed, and
// whose Future completes with all their outputs, in call order.
class CoalescedWorkDDL : public c10d::Work {
 public:
  CoalescedWorkDDL(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  size_t size() const { return works_.size(); }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::mutex mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A send or recv called while its group coalesces: the batch (endCoalescing) posts it with the
// others as one op, and it is done when the batch is. Waiting on it before endCoalescing is an
// error, not a wait that cannot end.
class BatchMemberWork : public c10d::Work {
 public:
  struct Batch {  // the batch's Work, set once by endCoalescing
    std::atomic<bool> posted{false};
    c10::intrusive_ptr<c10d::Work> work;
  };
  BatchMemberWork(int rank, c10d::OpType type, std::vector<at::Tensor> tensors, int source,
                  std::shared_ptr<Batch> batch);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return tensors_; }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;  // the batch's
  int sourceRank() const override { return source_; }

 private:
  c10d::Work& batch() const;

  std::vector<at::Tensor> tensors_;
  int source_;
  std::shared_ptr<Batch> batch_;
};

}  // namespace ddl
