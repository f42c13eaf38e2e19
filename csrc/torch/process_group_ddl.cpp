#include "process_group_ddl.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include "../core/group/creation.h"
#include "../core/shm/shared_buffers.h"
#include "../core/topology/allreduce_plan.h"
#include "../core/topology/cost_model.h"
#include "arguments.hpp"
#include "compat.hpp"
#include "errors.hpp"
#include "reuse_tracker.hpp"
#include "sparse.hpp"
#include "store_adapter.hpp"
#include "window.hpp"

namespace ddl {

ProcessGroupDDL::ProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size) {
  auto adapter = std::make_shared<StoreAdapter>(store);
  try {
    // The planner's settings in effect now (torch_ddl._C.check_config() reloads them): groups of
    // one process may plan differently, each as configured when it was created.
    GroupOptions options;
    options.timeout = timeout;
    options.plan = planRequest(ddl::config());
    comm_ = Creation::begin(Engine::process(), adapter, rank, size, options)->await();
  } catch (const ddl::Error& e) {
    torch_errors::raise(e.status());
  }
  watchFailures();
}

ProcessGroupDDL::ProcessGroupDDL(std::shared_ptr<Communicator> comm)
    : c10d::Backend(comm->rank(), comm->size()), comm_(std::move(comm)) {
  watchFailures();
}

void ProcessGroupDDL::watchFailures() {
  std::weak_ptr<Communicator> weak = comm_;
  std::lock_guard<std::mutex> lock(observers_->mutex);
  observers_->groupFailed = [weak] {
    auto comm = weak.lock();
    return comm && !comm->firstFailure().status.ok();
  };
  observers_->abortHooksRan.store(false);
}

#ifdef DDL_TORCH_HAS_RECONFIGURE
c10d::ReconfigureHandle ProcessGroupDDL::get_reconfigure_handle() const {
  return Derivation::handle(comm_->engine());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reconfigure(const c10d::ReconfigureOptions& opts) {
  const char* where = "reconfigure";
  if (std::find(usedUuids_.begin(), usedUuids_.end(), opts.uuid) != usedUuids_.end()) {
    badInput(where, "uuid " + std::to_string(opts.uuid) +
                        " was used before on this group; pass a fresh one each time");
  }
  std::vector<std::string> handles;
  if (const auto* list = std::get_if<std::vector<c10d::ReconfigureHandle>>(&opts.handles)) {
    handles = *list;
  } else {
    const auto& set = std::get<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles);
    handles = Derivation::orderHandles({set.begin(), set.end()});
  }
  const std::chrono::milliseconds timeout = opts.timeout.value_or(comm_->timeout());
  const LinkCosts links = comm_->links();
  std::shared_ptr<Communicator> next;
  try {
    next = Communicator::reconfigure(comm_->engine(), handles, opts.uuid, timeout, &links);
  } catch (const ddl::Error& e) {
    torch_errors::raise(e.status());
  }
  usedUuids_.push_back(opts.uuid);
  comm_->close("the group was reconfigured (uuid " + std::to_string(opts.uuid) + ")");
  comm_ = std::move(next);
  rank_ = comm_->rank();
  size_ = comm_->size();
  watchFailures();
  auto work =
      c10::make_intrusive<WorkDDL>(where, rank_, c10d::OpType::UNKNOWN, std::vector<at::Tensor>{});
  work->coreWork()->succeed();
  return work;
}
#endif

#ifdef DDL_TORCH_HAS_ABORT_HOOKS
void ProcessGroupDDL::registerAbortHook(int64_t hookId, c10d::AbortHook hook) {
  TORCH_CHECK(hook, "ddl: register_abort_hook: the hook is empty");
  std::lock_guard<std::mutex> lock(observers_->mutex);
  TORCH_CHECK(observers_->abortHooks.count(hookId) == 0, "ddl: register_abort_hook: id ", hookId,
              " is registered already");
  observers_->abortHooks[hookId] = std::move(hook);
  observers_->abortHooked.store(true);
}

void ProcessGroupDDL::unregisterAbortHook(int64_t hookId) {
  std::lock_guard<std::mutex> lock(observers_->mutex);
  TORCH_CHECK(observers_->abortHooks.erase(hookId) == 1, "ddl: unregister_abort_hook: no hook ",
              hookId, " is registered");
}
#endif

#ifdef DDL_TORCH_HAS_COMPLETION_HOOKS
bool ProcessGroupDDL::isInitialized() { return !closed_.load(); }

void ProcessGroupDDL::registerCompletionHook(int64_t hookId, c10d::CompletionHook hook) {
  TORCH_CHECK(hook, "ddl: register_completion_hook: the hook is empty");
  std::lock_guard<std::mutex> lock(observers_->mutex);
  TORCH_CHECK(observers_->completionHooks.count(hookId) == 0, "ddl: register_completion_hook: id ",
              hookId, " is registered already");
  observers_->completionHooks[hookId] = std::move(hook);
  observers_->completionHooked.store(true);
}

void ProcessGroupDDL::unregisterCompletionHook(int64_t hookId) {
  std::lock_guard<std::mutex> lock(observers_->mutex);
  TORCH_CHECK(observers_->completionHooks.erase(hookId) == 1,
              "ddl: unregister_completion_hook: no hook ", hookId, " is registered");
  observers_->completionHooked.store(!observers_->completionHooks.empty());
}
#endif

namespace {
thread_local bool tQuorumWaived = false;
}  // namespace

bool ProcessGroupDDL::quorumRequired() { return !tQuorumWaived; }
void ProcessGroupDDL::waiveQuorum(bool waived) { tQuorumWaived = waived; }

c10::intrusive_ptr<c10d::Backend> ProcessGroupDDL::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>&) {
  constexpr int kShrinkAbort = 1;  // torch.distributed.SHRINK_ABORT
  std::vector<int> excluded;
  for (int64_t r : ranksToExclude) {
    if (r < 0 || r >= size_)
      badInput("shrink_group", "rank " + std::to_string(r) +
                                   " to exclude "
                                   "is not a rank of a group of " +
                                   std::to_string(size_));
    excluded.push_back(static_cast<int>(r));
  }
  try {
    return c10::make_intrusive<ProcessGroupDDL>(
        comm_->shrink(excluded, (shrinkFlags & kShrinkAbort) != 0, quorumRequired()));
  } catch (const ddl::Error& e) {
    torch_errors::raise(e.status());
  }
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupDDL::split(const c10::intrusive_ptr<c10d::Store>&,
                                                         const std::vector<int>& ranks,
                                                         const c10::intrusive_ptr<Options>& opts) {
  std::shared_ptr<Communicator> comm;
  try {
    comm = comm_->split(ranks);
  } catch (const ddl::Error& e) {
    torch_errors::raise(e.status());
  }
  if (!comm) return nullptr;
  if (opts && opts->timeout.count() > 0) comm->setTimeout(opts->timeout);
  return c10::make_intrusive<ProcessGroupDDL>(std::move(comm));
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupDDL::merge(
    const c10::intrusive_ptr<c10d::Store>& store, const c10::intrusive_ptr<Options>& opts,
    const int& rank, const int& size) {
  const std::chrono::milliseconds timeout =
      opts && opts->timeout.count() > 0 ? opts->timeout : comm_->timeout();
  return c10::make_intrusive<ProcessGroupDDL>(store, rank, size, timeout);
}

void ProcessGroupDDL::registerOnCompletionHook(
    std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  std::lock_guard<std::mutex> lock(observers_->mutex);
  TORCH_CHECK(!observers_->hook, "ddl: this group already has a completion hook");
  observers_->hook = hook;
  observers_->hooked.store(true);
  onCompletionHook_ = std::move(hook);  // what hasHooks() looks at
}

void ProcessGroupDDL::waitForPendingWorks() {
  std::vector<std::weak_ptr<ddl::Work>> pending;
  {
    std::lock_guard<std::mutex> lock(observers_->mutex);
    pending.swap(observers_->pending);
  }
  const auto deadline = std::chrono::steady_clock::now() + comm_->timeout();
  for (const auto& weak : pending) {
    if (auto work = weak.lock()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      work->wait(std::max(left, std::chrono::milliseconds(0)));
    }
  }
  while (observers_->hooksRunning.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

CallOptions ProcessGroupDDL::callOptions(WorkDDL& work, std::chrono::milliseconds timeout) {
  work.observe(observers_, comm_->sequenceNumber());
  work.setTimeout(timeout.count() >= 0 ? timeout : comm_->timeout());
  CallOptions options{timeout, work.coreWork()};
  if (!observers_->hooked.load()) return options;
  work.countHookCall();
  std::lock_guard<std::mutex> lock(observers_->mutex);
  std::erase_if(observers_->pending, [](const auto& w) {
    auto work = w.lock();
    return !work || work->done();
  });
  observers_->pending.push_back(options.work);
  return options;
}

void ProcessGroupDDL::placeOnDevice(WorkDDL& work, const std::vector<at::Tensor>& tensors,
                                    CallOptions& options) {
  const char* where = work.name();
  std::optional<at::Device> device;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (device && t.device() != *device) {
      badInput(where, "tensors on " + device->str() + " and " + t.device().str() +
                          " in one call; every tensor of a call must be on one device");
    }
    device = t.device();
  }
  if (!device || device->is_cpu()) return;
  DeviceStreams* streams = cudaStreams();
  if (streams == nullptr) {
    badInput(where, "the tensor is on " + device->str() +
                        ", but this build of torch_ddl has no CUDA support (it was built "
                        "against a torch without CUDA, or without nvcc)");
  }
  {
    std::lock_guard<std::mutex> lock(deviceMutex_);
    if (cudaDevice_ < 0) cudaDevice_ = device->index();
    if (device->index() != cudaDevice_) {
      badInput(where, "the tensor is on " + device->str() +
                          ", but this group works on cuda:" + std::to_string(cudaDevice_) +
                          " (the device of its first CUDA collective)");
    }
  }
  if (!work.stagedOnHost()) {
    options.memory = MemoryKind::kCuda;
    options.device = device->index();
  }
  work.onDevice(streams->order(*device, where, &options.deferStart), streams->future(*device));
}

// Runs `submit` with the work's CallOptions; a core validation error becomes a ValueError and
// finishes the core work (which releases the work's self-reference).
c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::launch(
    c10::intrusive_ptr<WorkDDL> work, CallOptions options,
    const std::function<void(CallOptions&)>& submit) {
  // If the op fails while UCX still holds one of its messages, the engine keeps the core Work,
  // and with it these tensors, until UCX lets go.
  auto tensors = std::static_pointer_cast<const std::vector<at::Tensor>>(work->tensorsInUse());
  if (estimating_.load()) {
    const double seconds = estimateSeconds(work->retrieveOpType(), *tensors);
    {
      std::lock_guard<std::mutex> lock(estimateMutex_);
      estimatedSeconds_ += seconds;
    }
    options.work->succeed();
    return work;
  }
  try {
    // A buffer staged on the host: the device is the caller's tensors'.
    placeOnDevice(*work, work->stagedOnHost() ? work->result() : *tensors, options);
  } catch (...) {
    options.work->finish(Status(StatusKind::kInvalidArgument, "ddl: the op was refused"));
    throw;
  }
  options.work->retain(tensors);
  CallScope::settle();
  try {
    submit(options);
  } catch (const ddl::Error& e) {
    options.work->finish(e.status());
    torch_errors::raiseBadInput(e.what());
  }
  if (coalescing_.load()) {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    if (coalescing_.load()) coalesced_.push_back(work);
  }
  return work;
}

at::Tensor ProcessGroupDDL::allocateTensor(long size, at::TensorOptions options) {
  const char* where = "allocate_tensor";
  if (options.has_device() && !options.device().is_cpu()) {
    badInput(where, "ddl allocates CPU tensors in shared memory, not on " + options.device().str());
  }
  if (size < 0) badInput(where, "negative size " + std::to_string(size));
  const auto type = options.has_dtype() ? c10::typeMetaToScalarType(options.dtype()) : at::kFloat;
  const size_t bytes = static_cast<size_t>(size) * c10::elementSize(type);
  std::shared_ptr<ddl::SharedBuffers> buffers = comm_->engine().sharedBuffers();
  void* data = buffers->allocate(bytes);
  return at::from_blob(
      data, {size}, [buffers](void* p) { buffers->release(p); },
      at::TensorOptions().dtype(type).device(at::kCPU));
}

void ProcessGroupDDL::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  TORCH_CHECK(!coalescing_.load(), "ddl: startCoalescing while this group already coalesces");
  coalescing_.store(true);
  coalesced_.clear();
  batch_.clear();
  batchSlot_ = std::make_shared<BatchMemberWork::Batch>();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<BatchEntry> batch;
  std::shared_ptr<BatchMemberWork::Batch> slot;
  {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    TORCH_CHECK(coalescing_.load(), "ddl: endCoalescing without startCoalescing");
    coalescing_.store(false);
    works = std::move(coalesced_);
    batch = std::move(batch_);
    slot = std::move(batchSlot_);
  }
  if (!batch.empty()) works.push_back(postBatch(std::move(batch), slot));
  return c10::make_intrusive<CoalescedWorkDDL>(rank_, std::move(works));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::joinBatch(std::vector<at::Tensor>& tensors,
                                                          bool isSend, int peer, int tag,
                                                          const char* where) {
  if (peer == rank_) {
    badInput(where,
             std::string("a rank cannot ") + (isSend ? "send to" : "receive from") + " itself");
  }
  if (peer < 0) {
    badInput(where, "a coalesced batch receives from named ranks only, not from any source");
  }
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  batch_.push_back({isSend, tensors[0], peer, tag});
  return c10::make_intrusive<BatchMemberWork>(rank_,
                                              isSend ? c10d::OpType::SEND : c10d::OpType::RECV,
                                              tensors, isSend ? -1 : peer, batchSlot_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::postBatch(
    std::vector<BatchEntry> batch, const std::shared_ptr<BatchMemberWork::Batch>& slot) {
  std::vector<at::Tensor> tensors;
  for (const BatchEntry& e : batch) tensors.push_back(e.tensor);
  auto work = c10::make_intrusive<WorkDDL>("coalesced", rank_, c10d::OpType::COALESCED, tensors);
  std::vector<Communicator::Transfer> transfers;
  for (const BatchEntry& e : batch) {
    at::Tensor buffer = contiguousFor(e.tensor, *work, !e.isSend);
    transfers.push_back({e.isSend, buffer.data_ptr(),
                         static_cast<size_t>(buffer.numel()) * buffer.element_size(), e.peer,
                         static_cast<uint32_t>(e.tag)});
  }
  auto posted = launch(work, c10d::kUnsetTimeout,
                       [&](CallOptions& o) { comm_->pointToPoint(std::move(transfers), o); });
  slot->work = posted;
  slot->posted.store(true);
  return posted;
}

void ProcessGroupDDL::startTimeEstimate() {
  std::lock_guard<std::mutex> lock(estimateMutex_);
  TORCH_CHECK(!estimating_.load(), "ddl: _start_time_estimate while this group already estimates");
  estimatedSeconds_ = 0;
  estimating_.store(true);
}

float ProcessGroupDDL::endTimeEstimate() {
  std::lock_guard<std::mutex> lock(estimateMutex_);
  TORCH_CHECK(estimating_.load(), "ddl: _end_time_estimate without _start_time_estimate");
  estimating_.store(false);
  return static_cast<float>(estimatedSeconds_ * 1e6);
}

// allreduce: the plan the group would take for that size, as `info --plan` predicts it. Other
// ops: the cost model's estimate (topology/cost_model.h).
double ProcessGroupDDL::estimateSeconds(c10d::OpType type,
                                        const std::vector<at::Tensor>& tensors) const {
  double bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (t.defined()) bytes += static_cast<double>(t.numel() * t.element_size());
  }
  const ddl::Topology& topology = comm_->topology();
  const ddl::LinkCosts& links = comm_->links();
  using Shape = ddl::CollectiveShape;
  switch (type) {
    case c10d::OpType::ALLREDUCE:
    case c10d::OpType::ALLREDUCE_COALESCED: {
      if (size_ <= 1) return 0;
      size_t elementSize = 4;  // in elements of the first tensor's type
      for (const at::Tensor& t : tensors) {
        if (t.defined()) {
          elementSize = static_cast<size_t>(t.element_size());
          break;
        }
      }
      return comm_->planBook()
          .allreduce(static_cast<size_t>(bytes) / elementSize, elementSize)
          ->predicted;
    }
    case c10d::OpType::BARRIER:
      return ddl::estimateSeconds(Shape::kBarrier, topology, links, bytes);
    case c10d::OpType::BROADCAST:
    case c10d::OpType::REDUCE:
      return ddl::estimateSeconds(Shape::kTree, topology, links, bytes);
    case c10d::OpType::SEND:
    case c10d::OpType::RECV:
    case c10d::OpType::RECVANYSOURCE:
      return ddl::estimateSeconds(Shape::kPointToPoint, topology, links, bytes);
    case c10d::OpType::REDUCE_SCATTER:
    case c10d::OpType::_REDUCE_SCATTER_BASE:  // the work holds this rank's share
      return ddl::estimateSeconds(Shape::kReduceScatter, topology, links, bytes);
    default:  // gathers, scatters, all-to-all
      return ddl::estimateSeconds(Shape::kExchange, topology, links, bytes);
  }
}

c10d::ErrorType ProcessGroupDDL::getError() {
  return torch_errors::errorTypeOf(comm_->firstFailure());
}

void ProcessGroupDDL::abort() {
  observers_->runAbortHooks();
  closed_.store(true);
  comm_->close("aborted: abort() was called on this group");
}

void ProcessGroupDDL::shutdown() {
  closed_.store(true);
  comm_->close("the group was shut down");
}

c10::intrusive_ptr<WindowDDL> ProcessGroupDDL::newWindow(const std::optional<at::Tensor>& tensor) {
  return c10::make_intrusive<WindowDDL>(c10::intrusive_ptr<ProcessGroupDDL>::reclaim_copy(this),
                                        tensor);
}

#ifdef DDL_TORCH_HAS_WINDOW
c10::intrusive_ptr<c10d::Window> ProcessGroupDDL::new_window(
    const std::optional<at::Tensor>& tensor) {
  return newWindow(tensor);
}
#endif

}  // namespace ddl
