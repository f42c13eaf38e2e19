// The c10d::Backend of torch_ddl. Each collective validates its tensors, maps dtype and reduce
// op, hands type-erased buffers to the core communicator and returns a WorkDDL at once. The only
// torch-aware code of the project is in this folder.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "../core/engine/communicator.h"
#include "device_streams.hpp"

namespace ddl {

// A c10d Work over a core Work. Results that need a copy after the transfer (non-contiguous
// outputs, list-form outputs) are finalized exactly once: by the first of wait(),
// isCompleted(), getFuture() on a finished op, or the completion thread when a Future is pending.
class WorkDDL : public c10d::Work {
 public:
  WorkDDL(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);
  ~WorkDDL() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  int sourceRank() const override;

  // Setup, before start(). Copies run in the order given; `source` must be a view of the
  // buffer the operation writes (not a copy taken now).
  void copyAfter(at::Tensor destination, at::Tensor source) {
    copies_.emplace_back(std::move(destination), std::move(source));
  }
  void keepAlive(at::Tensor tensor) { keep_.push_back(std::move(tensor)); }
  // Runs at finalization after the copies, on success only; what it throws fails the work.
  void thenRun(std::function<void()> fn) { after_.push_back(std::move(fn)); }
  // The core Work this one finishes with; its completion hook is installed here.
  std::shared_ptr<ddl::Work> coreWork(const char* name);
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
  const char* name_ = "collective";
  std::shared_ptr<DeviceCompletion> device_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> futureRequested_{false};
  std::atomic<int> finalizeState_{0};  // 0 not started, 1 running, 2 done
};

class ProcessGroupDDL : public c10d::Backend {
 public:
  ProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout);

  const std::string getBackendName() const override { return "ddl"; }
  void setTimeout(std::chrono::milliseconds timeout) override { comm_->setTimeout(timeout); }
  // The group's first failed op: TIMEOUT, COMM_ERROR (a peer gone, a mismatch, ...) or SUCCESS.
  c10d::ErrorType getError() override;
  // Both fail the group's ops in flight at once and every later one, naming why; abort() is for
  // a group in trouble, shutdown() (destroy_process_group) for one whose work is done.
  void abort() override;
  void shutdown() override;

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
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
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;

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
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
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

 private:
  CallOptions callOptions(WorkDDL& work, const char* name, std::chrono::milliseconds timeout);
  // Device tensors: checks that the call's tensors share one device, the group's, and orders
  // the op on that device's streams (device_streams.hpp). Host tensors: nothing to do.
  void placeOnDevice(WorkDDL& work, const std::vector<at::Tensor>& tensors, CallOptions& options);
  template <typename Submit>
  c10::intrusive_ptr<c10d::Work> launch(c10::intrusive_ptr<WorkDDL> work, CallOptions options,
                                        Submit&& submit);
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                         c10d::OpType type, const char* where);

  std::shared_ptr<Communicator> comm_;
  std::mutex deviceMutex_;
  int cudaDevice_ = -1;  // the CUDA device of the group's first CUDA collective
};

}  // namespace ddl
