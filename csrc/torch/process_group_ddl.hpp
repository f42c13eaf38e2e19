// The c10d::Backend of torch_ddl: the c10d methods. Each collective checks its arguments
// (arguments.hpp), maps dtype and reduce op, hands type-erased buffers to the core communicator
// and returns a WorkDDL (work.hpp) at once. The only torch-aware code of the project is in this
// folder: the Work and its completion (work), argument checks and mapping (arguments), sparse
// all_reduce's packing (sparse), the store (store_adapter), which tensors may be adopted into
// shared memory (reuse_tracker), device streams (device_streams, cuda/).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "../core/group/communicator.h"
#include "compat.hpp"
#include "work.hpp"

namespace ddl {

class WindowDDL;

class ProcessGroupDDL : public c10d::Backend {
 public:
  ProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout);

  // A backend over a communicator made otherwise (shrink).
  explicit ProcessGroupDDL(std::shared_ptr<Communicator> comm);

  const std::string getBackendName() const override { return "ddl"; }
  // dist.shrink_group: the other ranks form a group by themselves (Communicator::shrink); with
  // SHRINK_ABORT this group's ops in flight fail first. Options (pg_options) are not taken: the
  // new group has this one's settings.
  bool supportsShrinking() const override { return true; }
  // Called with c10d's WorkInfo (op type, sequence number, start, end, duration) as each op of
  // the group ends, on the threads that complete Futures: ops that end close together may be
  // reported in either order (the sequence numbers give the call order). One hook per group.
  void registerOnCompletionHook(
      std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;
  // Work.get_duration(): milliseconds from the op's start on the progress thread to its end.
  void enableCollectivesTiming() override { observers_->timing.store(true); }
  // destroy_process_group's wait, where a hook is registered: every op started so far has ended
  // and its hook call returned (bounded by the group's timeout).
  void waitForPendingWorks() override;
  // ProcessGroup.split_group (dist.split_group): the ranks of `ranks` (of this group) form a
  // group by themselves, as shrink's survivors do; the others get nullptr and send nothing.
  bool supportsSplitting() const override { return true; }
  // Coalescing (batch_isend_irecv, the coalescing manager with a device): the sends and recvs
  // called between start and end are one op of the core (Communicator::pointToPoint), posted by
  // endCoalescing; collectives run as they are called. endCoalescing returns one Work for all.
  bool supportsCoalescing() const override { return true; }
  // Backend.allocate_tensor: CPU tensors in memory the host's ranks map (torch_ddl.empty_shared),
  // whose allreduces take the direct path. Device tensors are refused, naming the device.
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override { return deviceIdx < 0; }
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // dist._time_estimator: between start and end no op of this group communicates; each one
  // completes at once (its outputs untouched) and adds what the cost model predicts for it, with
  // the links the group probed. endTimeEstimate returns the sum in microseconds, as NCCL's does.
  bool supportsTimeEstimation() const override { return true; }
#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
  void startTimeEstimate() override;
  float endTimeEstimate() override;
  // A ddl group connects its peers when it is created: true until abort() or shutdown().
  bool isInitialized() override;
  bool supportsAbortHooks() const override { return true; }
  // Completion hooks (torch 2.15): each runs once per op that succeeded, on a completion thread
  // (never the progress thread, never holding the GIL), with the op's getCompletionKey() and,
  // while collective timing is on, its duration; failed ops fire nothing. In id order.
  bool supportsCompletionHooks() const override { return true; }
  void registerCompletionHook(int64_t hookId, c10d::CompletionHook hook) override;
  void unregisterCompletionHook(int64_t hookId) override;
#else
  void startTimeEstimate();
  float endTimeEstimate();
#endif
  // What a split inherits: the backend's name and this group's timeout.
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return c10::make_intrusive<Options>("ddl", comm_->timeout());
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  // ProcessGroup.merge_remote_group: processes of separate groups that share `store` form one
  // group of `size` (c10d numbers them in the order they reach the store). They are not all
  // members of this group, so it cannot connect them: the new group is created over the store.
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                          const c10::intrusive_ptr<Options>& opts, const int& rank,
                                          const int& size) override;
  // shrink_group requires the ranks left to be a quorum of the group (group/communicator.h);
  // torch_ddl.quorum_waived() lifts that for the calling thread.
  static bool quorumRequired();
  static void waiveQuorum(bool waived);
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude, int shrinkFlags = 0,
      const c10::intrusive_ptr<Options>& optsOverride = nullptr) override;
  void setTimeout(std::chrono::milliseconds timeout) override { comm_->setTimeout(timeout); }
  // The group's first failed op: TIMEOUT, COMM_ERROR (a peer gone, a mismatch, ...) or SUCCESS.
  c10d::ErrorType getError() override;
  // Both fail the group's ops in flight at once and every later one, naming why; abort() is for
  // a group in trouble, shutdown() (destroy_process_group) for one whose work is done.
  void abort() override;
  void shutdown() override;
#ifdef DDL_TORCH_HAS_RECONFIGURE
  // dist._reconfigure (torch 2.14): the processes whose handles are listed form this group
  // again, over messages between them (Communicator::reconfigure): no store, no restart, no
  // wait for a process left out. The old group is closed (its ops in flight fail), rank and size
  // become the new ones, the links it probed are kept. Returns a completed Work once the new
  // group exists. No other thread may use the group meanwhile. A set of handles is ordered by
  // host, so that each host's ranks are consecutive.
  bool supportsReconfigure() const override { return true; }
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
#endif
#ifdef DDL_TORCH_HAS_ABORT_HOOKS
  // Run once (per reconfiguration) on the group's first failure, on a completion thread, or by
  // abort() before it fails the ops in flight; not by shutdown(). In id order.
  void registerAbortHook(int64_t hookId, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hookId) override;
#endif

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  // The single-tensor collectives, named as torch's Python calls them (all_gather_into_tensor,
  // reduce_scatter_tensor, all_to_all_single and the coalesced two), under the names c10d
  // calls: torch 2.14 (DDL_TORCH_HAS_SINGLE_NAMES) makes the `_single` names canonical and keeps
  // the old ones as aliases that forward to them; before, only the old names exist. Overriding
  // the canonical name of the torch built against, no call goes through a forwarding alias.
  c10::intrusive_ptr<c10d::Work> allgatherIntoTensor(at::Tensor& output, at::Tensor& input,
                                                     const c10d::AllgatherOptions& opts);
  c10::intrusive_ptr<c10d::Work> allgatherIntoTensorCoalesced(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllgatherOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduceScatterTensor(at::Tensor& output, at::Tensor& input,
                                                     const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduceScatterTensorCoalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> alltoallSingle(at::Tensor& output, at::Tensor& input,
                                                std::vector<int64_t>& outputSplitSizes,
                                                std::vector<int64_t>& inputSplitSizes,
                                                const c10d::AllToAllOptions& opts);
#ifdef DDL_TORCH_HAS_SINGLE_NAMES
  c10::intrusive_ptr<c10d::Work> all_gather_single(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override {
    return allgatherIntoTensor(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override {
    return allgatherIntoTensorCoalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override {
    return reduceScatterTensor(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override {
    return reduceScatterTensorCoalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> all_to_all_single(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override {
    return alltoallSingle(output, input, outputSplitSizes, inputSplitSizes, opts);
  }
#else
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override {
    return allgatherIntoTensor(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override {
    return allgatherIntoTensorCoalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override {
    return reduceScatterTensor(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override {
    return reduceScatterTensorCoalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override {
    return alltoallSingle(output, input, outputSplitSizes, inputSplitSizes, opts);
  }
#endif
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // Every rank's communicator counts collectives from 0 in program order, so the group's number
  // is in sync from creation on: there is nothing to agree on through the store.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return comm_->sequenceNumber(); }
  // The core communicator (torch_ddl.info: topology and plans).
  const std::shared_ptr<Communicator>& communicator() const { return comm_; }
  // One-sided windows (window.hpp): collective; `tensor`, when given, is registered with it.
  c10::intrusive_ptr<WindowDDL> newWindow(const std::optional<at::Tensor>& tensor);
#ifdef DDL_TORCH_HAS_WINDOW
  bool supportsWindow() const override { return true; }
  c10::intrusive_ptr<c10d::Window> new_window(const std::optional<at::Tensor>& tensor) override;
#endif

 private:
  // What the core is given for `work`: its core Work, named as it is, and the call's timeout.
  CallOptions callOptions(WorkDDL& work, std::chrono::milliseconds timeout);
  // Device tensors: checks that the call's tensors share one device, the group's, and orders
  // the op on that device's streams (device_streams.hpp). Host tensors: nothing to do.
  void placeOnDevice(WorkDDL& work, const std::vector<at::Tensor>& tensors, CallOptions& options);
  // Every c10d method ends here: `submit` hands the core its one call with the work's
  // CallOptions (callOptions(work, timeout), or options built from them).
  c10::intrusive_ptr<c10d::Work> launch(c10::intrusive_ptr<WorkDDL> work, CallOptions options,
                                        const std::function<void(CallOptions&)>& submit);
  c10::intrusive_ptr<c10d::Work> launch(c10::intrusive_ptr<WorkDDL> work,
                                        std::chrono::milliseconds timeout,
                                        const std::function<void(CallOptions&)>& submit) {
    CallOptions options = callOptions(*work, timeout);
    return launch(std::move(work), std::move(options), submit);
  }
  // A c10d call's options (`opts`: its timeout, and asyncOp false when the caller waits at once).
  template <typename Options>
  CallOptions callOptions(WorkDDL& work, const Options& opts) {
    CallOptions options = callOptions(work, opts.timeout);
    options.waited = !opts.asyncOp;
    return options;
  }
  template <typename Options>
  c10::intrusive_ptr<c10d::Work> launch(c10::intrusive_ptr<WorkDDL> work, const Options& opts,
                                        const std::function<void(CallOptions&)>& submit) {
    CallOptions options = callOptions(*work, opts);
    return launch(std::move(work), std::move(options), submit);
  }
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                         c10d::OpType type, const char* where);

  friend class WindowDDL;  // its puts and signals are Works of this group (callOptions)
  // What a window dropped while it held a tensor leaves behind (the tensor, its registration):
  // peers may still put into it, so it lives as long as the group.
  void keepForLife(std::shared_ptr<void> held) {
    std::lock_guard<std::mutex> lock(keptMutex_);
    kept_.push_back(std::move(held));
  }
  std::mutex keptMutex_;
  std::vector<std::shared_ptr<void>> kept_;
  // The observers' test of the group's failure, for the communicator in use.
  void watchFailures();

  std::shared_ptr<Communicator> comm_;
  std::vector<int64_t> usedUuids_;  // reconfigure's, so far
  std::shared_ptr<WorkObservers> observers_ = std::make_shared<WorkObservers>();
  std::mutex deviceMutex_;
  std::mutex coalescingMutex_;
  std::atomic<bool> coalescing_{false};  // set and cleared under coalescingMutex_
  std::mutex estimateMutex_;
  std::atomic<bool> estimating_{false};  // set and cleared under estimateMutex_
  std::atomic<bool> closed_{false};      // abort() or shutdown() was called
  double estimatedSeconds_ = 0;
  // The cost model's seconds for an op of `type` whose work holds `tensors` (its outputs).
  double estimateSeconds(c10d::OpType type, const std::vector<at::Tensor>& tensors) const;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  // The sends and recvs of the coalesced batch in progress (under coalescingMutex_).
  struct BatchEntry {
    bool isSend;
    at::Tensor tensor;
    int peer;
    int tag;
  };
  std::vector<BatchEntry> batch_;
  std::shared_ptr<BatchMemberWork::Batch> batchSlot_;
  c10::intrusive_ptr<c10d::Work> joinBatch(std::vector<at::Tensor>& tensors, bool isSend, int peer,
                                           int tag, const char* where);
  c10::intrusive_ptr<c10d::Work> postBatch(std::vector<BatchEntry> batch,
                                           const std::shared_ptr<BatchMemberWork::Batch>& slot);
  int cudaDevice_ = -1;  // the CUDA device of the group's first CUDA collective
};

}  // namespace ddl
