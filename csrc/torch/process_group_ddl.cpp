#include "process_group_ddl.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "../core/engine/config.h"
#include "compat.hpp"

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

// Which allreduce tensors' blocks may be adopted into shared memory (SharedBuffers::adopt), of the
// sizes the group offers for adoption (Communicator::offersAdoption): those
// of storages allreduced before, and only when the tensor is its whole storage. The block is
// copied while it moves; the op owns the tensor it reduces, but not the rest of a storage that a
// view leaves out, which other threads may be writing then (a gradient buffer whose next bucket
// backward still fills): such a write would be lost, so a view is never adopted. A storage is
// remembered by weak reference, so that a new storage at a recycled address is never taken for one
// seen before; each is offered for adoption once.
class ReuseTracker {
 public:
  static ReuseTracker& instance() {
    static auto* tracker = new ReuseTracker();  // never destroyed: may outlive interpreter exit
    return *tracker;
  }
  Adoptable adoptable(const at::Tensor& tensor) {
    const c10::Storage& storage = tensor.storage();
    void* base = const_cast<void*>(storage.data());
    if (tensor.data_ptr() != base || tensor.nbytes() != storage.nbytes()) return {};
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = seen_.find(impl);
    if (it != seen_.end()) {
      c10::intrusive_ptr<c10::StorageImpl> alive = it->second.storage.lock();
      if (alive.get() == impl && it->second.base == base) {
        if (it->second.offered) return {};
        it->second.offered = true;
        return Adoptable{base, storage.nbytes()};
      }
      seen_.erase(it);
    }
    if (seen_.size() >= kCapacity) {
      std::erase_if(seen_, [](const auto& e) { return e.second.storage.expired(); });
      if (seen_.size() >= kCapacity) seen_.clear();
    }
    seen_.emplace(impl, Seen{storage.getWeakStorageImpl(), base, false});
    return {};
  }

 private:
  static constexpr size_t kCapacity = 1024;
  struct Seen {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    void* base;
    bool offered;
  };
  std::mutex mutex_;
  std::unordered_map<c10::StorageImpl*, Seen> seen_;
};

class StoreAdapter : public KeyValueStore {
 public:
  explicit StoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    std::vector<uint8_t> value = store_->get(key);
    return std::string(value.begin(), value.end());
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  uint64_t nextGroupNumber() override {
    return static_cast<uint64_t>(
        torch_compat::rootStore(store_)->add("torch_ddl/group_counter", 1) - 1);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// The collective being called on this thread. When its arguments are refused here, the other
// ranks are told (Communicator::reject): the op they are in fails at once naming this rank's
// reason, and the group goes on. Once the call reaches the core (launch), the core numbers it, or
// refuses it and tells them, itself.
class CallScope {
 public:
  CallScope(Communicator& comm, const char* where)
      : comm_(comm), where_(where), uncaught_(std::uncaught_exceptions()) {
    if (current_ == nullptr) current_ = this;  // an inner scope (sparse all_reduce) defers
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  ~CallScope() {
    if (current_ != this) return;
    current_ = nullptr;
    if (!settled_ && std::uncaught_exceptions() > uncaught_) {
      comm_.reject(where_, "its call failed before it started");
    }
  }
  static void settle() {
    if (current_ != nullptr) current_->settled_ = true;
  }
  static void refuse(const std::string& what) {
    if (current_ == nullptr || current_->settled_) return;
    current_->settled_ = true;
    current_->comm_.reject(current_->where_, what);
  }

 private:
  static thread_local CallScope* current_;
  Communicator& comm_;
  const char* where_;
  int uncaught_;
  bool settled_ = false;
};
thread_local CallScope* CallScope::current_ = nullptr;

[[noreturn]] void badInput(const char* where, const std::string& what) {
  CallScope::refuse(what);
  C10_THROW_ERROR(ValueError, std::string("ddl: ") + where + ": " + what);
}

DataType toDataType(at::ScalarType type, const char* where) {
  switch (type) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kChar:
      return DataType::kInt8;
    case at::kByte:
      return DataType::kUInt8;
    case at::kShort:
      return DataType::kInt16;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kBool:
      return DataType::kBool;
    default:
      badInput(where, std::string("dtype ") + c10::toString(type) + " is not supported");
  }
}

ReduceOp toReduceOp(const c10d::ReduceOp& op, const char* where) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return ReduceOp::kBxor;
    case c10d::ReduceOp::PREMUL_SUM:
      return ReduceOp::kSum;  // after premultiply() has scaled the local contribution
    default:
      badInput(where, "this reduce op is not supported");
  }
}

// PREMUL_SUM: scales `buffer` (a private copy, or an in-place output) by the op's factor.
void premultiply(const c10d::ReduceOp& op, at::Tensor& buffer, const char* where) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return;
  if (!buffer.is_floating_point()) {
    badInput(where, "PREMUL_SUM is defined on floating-point tensors, not on " +
                        std::string(c10::toString(buffer.scalar_type())));
  }
  const auto* factor = torch_compat::premulSupplement(op);
  if (factor == nullptr) badInput(where, "PREMUL_SUM carries no factor");
  at::NoGradGuard noGrad;
  if (factor->tensor_factor.defined()) {
    buffer.mul_(factor->tensor_factor.to(buffer.device()).reshape({}));
  } else {
    buffer.mul_(factor->double_factor);
  }
}

DataType checkTensor(const at::Tensor& t, const char* where);

// The core reduce op for `op` on `type`; bad input when the pair makes no sense.
ReduceOp reduceOpFor(const c10d::ReduceOp& op, DataType type, const char* where) {
  ReduceOp mapped = toReduceOp(op, where);
  std::string bad = checkReduceOp(type, mapped);
  if (!bad.empty()) badInput(where, bad);
  return mapped;
}

DataType checkTensor(const at::Tensor& t, const char* where) {
  if (!t.defined()) badInput(where, "the tensor is undefined");
  if (t.layout() != c10::kStrided) {
    badInput(where, "sparse and other non-strided tensors are not supported (use .to_dense())");
  }
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    badInput(where, "the tensor is on " + t.device().str() + "; ddl handles CPU and CUDA tensors");
  }
  return toDataType(t.scalar_type(), where);
}

// `t` (the `what` tensor) must have dtype `type`, like the call's other tensor.
void checkSameType(const char* where, const at::Tensor& t, DataType type, const char* what) {
  if (checkTensor(t, where) != type) {
    badInput(where, std::string(what) + " dtype " + c10::toString(t.scalar_type()) +
                        " differs from " + dataTypeName(type));
  }
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* where) {
  if (tensors.size() != 1) {
    badInput(where, "expects exactly one tensor per call, got " + std::to_string(tensors.size()));
  }
  return tensors[0];
}

// `t` itself when contiguous; otherwise a contiguous copy that the work writes back to `t`.
// Either way the work keeps it alive.
at::Tensor contiguousFor(const at::Tensor& t, WorkDDL& work, bool writeBack) {
  if (t.is_contiguous()) {
    work.keepAlive(t);
    return t;
  }
  at::Tensor copy = t.contiguous();
  if (writeBack) work.copyAfter(t, copy);
  work.keepAlive(copy);
  return copy;
}

size_t count(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }

void checkRank(const char* where, const char* what, int64_t rank, int size) {
  if (rank < 0 || rank >= size) {
    badInput(where, std::string(what) + " " + std::to_string(rank) +
                        " is not a rank of a group of size " + std::to_string(size));
  }
}

// Checks that every tensor of `list` matches `like` in dtype and element count.
void checkList(const char* where, const std::vector<at::Tensor>& list, const at::Tensor& like,
               int64_t numel, size_t expected) {
  if (list.size() != expected) {
    badInput(where, "needs a list of " + std::to_string(expected) + " tensors, got " +
                        std::to_string(list.size()));
  }
  DataType type = checkTensor(like, where);
  for (const at::Tensor& t : list) {
    if (checkTensor(t, where) != type || t.numel() != numel) {
      badInput(where, "every tensor of the list must have dtype " +
                          std::string(c10::toString(like.scalar_type())) + " and " +
                          std::to_string(numel) + " elements");
    }
  }
}

// One contiguous 1-D tensor holding the tensors of `list` back to back.
at::Tensor concatenate(const std::vector<at::Tensor>& list, const at::Tensor& like) {
  if (list.empty()) return at::empty({0}, like.options());
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

}  // namespace

WorkDDL::WorkDDL(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(torch_compat::tensorListFuture()) {}

WorkDDL::~WorkDDL() = default;

std::shared_ptr<ddl::Work> WorkDDL::coreWork(const char* name) {
  name_ = name;
  core_ = std::make_shared<ddl::Work>(name);
  auto self = c10::intrusive_ptr<WorkDDL>::reclaim_copy(this);
  // The hook holds `self` until it runs (once, on the progress thread). A device op is always
  // finalized at once: the caller's streams may be waiting for it.
  core_->setCompletionHook([self] {
    if (self->futureRequested_.load() || self->device_) {
      CompletionThreads::instance().post([self] { self->finalize(); });
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
      error = torch_compat::backendError(core_->error());
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
  if (!core_->done()) return false;
  finalize();
  return true;
}

bool WorkDDL::isSuccess() const { return core_->done() && !core_->failed(); }

std::exception_ptr WorkDDL::exception() const {
  if (core_->done() && core_->failed()) return torch_compat::backendError(core_->error());
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
  if (core_->done()) finalize();
  return future_;
}

int WorkDDL::sourceRank() const { return core_ ? core_->source() : -1; }

ProcessGroupDDL::ProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size) {
  StoreAdapter adapter(store);
  try {
    comm_ = Communicator::create(Engine::process(), adapter, rank, size, timeout);
  } catch (const ddl::Error& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
}

CallOptions ProcessGroupDDL::callOptions(WorkDDL& work, const char* name,
                                         std::chrono::milliseconds timeout) {
  return CallOptions{timeout, work.coreWork(name)};
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
  options.memory = MemoryKind::kCuda;
  options.device = device->index();
  work.onDevice(streams->order(*device, where, &options.deferStart), streams->future(*device));
}

// Runs `submit` with the work's CallOptions; a core validation error becomes a ValueError and
// finishes the core work (which releases the work's self-reference).
template <typename Submit>
c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::launch(c10::intrusive_ptr<WorkDDL> work,
                                                       CallOptions options, Submit&& submit) {
  // If the op fails while UCX still holds one of its messages, the engine keeps the core Work,
  // and with it these tensors, until UCX lets go.
  auto tensors = std::static_pointer_cast<const std::vector<at::Tensor>>(work->tensorsInUse());
  try {
    placeOnDevice(*work, *tensors, options);
  } catch (...) {
    options.work->finish("ddl: the op was refused");
    throw;
  }
  options.work->retain(tensors);
  CallScope::settle();
  try {
    submit(options);
  } catch (const ddl::Error& e) {
    options.work->finish(e.what());
    C10_THROW_ERROR(ValueError, e.what());
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const char* where = "all_reduce";
  CallScope scope(*comm_, where);
  at::Tensor& tensor = single(tensors, where);
  if (tensor.defined() && tensor.layout() == c10::kSparse) return allreduceSparse(tensors, opts);
  DataType type = checkTensor(tensor, where);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::ALLREDUCE, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, true);
  premultiply(opts.reduceOp, buffer, where);
  CallOptions options = callOptions(*work, "allreduce", opts.timeout);
  if (size_ > 1 && buffer.data_ptr() == tensor.data_ptr() &&
      comm_->offersAdoption(count(buffer), type)) {
    options.adoptable = ReuseTracker::instance().adoptable(buffer);
  }
  return launch(work, options, [&](CallOptions& o) {
    comm_->allreduce(buffer.data_ptr(), count(buffer), type, op, o);
  });
}

namespace {

// A sparse COO tensor as one byte block: [sparse_dim, dense_dim, dtype, ndim, sizes..., nnz] as
// int64, then the indices (sparse_dim x nnz, int64), then the values (nnz x dense shape).
at::Tensor packSparse(const at::Tensor& sparse) {
  at::Tensor indices = sparse._indices().contiguous();
  at::Tensor values = sparse._values().contiguous();
  std::vector<int64_t> header{sparse.sparse_dim(), sparse.dense_dim(),
                              static_cast<int64_t>(sparse.scalar_type()), sparse.dim()};
  for (int64_t size : sparse.sizes()) header.push_back(size);
  header.push_back(sparse._nnz());
  auto bytes = [](const at::Tensor& t) {
    return t.numel() * static_cast<int64_t>(t.element_size());
  };
  const int64_t headerBytes = static_cast<int64_t>(header.size() * sizeof(int64_t));
  at::Tensor packed = at::empty({headerBytes + bytes(indices) + bytes(values)}, at::kByte);
  auto* out = static_cast<char*>(packed.data_ptr());
  std::memcpy(out, header.data(), headerBytes);
  if (bytes(indices) > 0) std::memcpy(out + headerBytes, indices.data_ptr(), bytes(indices));
  if (bytes(values) > 0) {
    std::memcpy(out + headerBytes + bytes(indices), values.data_ptr(), bytes(values));
  }
  return packed;
}

// "[2, 3]": a shape for a message. (Not c10::str: its ostream path for an ArrayRef crashed the
// sparse tests' error cases against torch 2.11.)
std::string shapeText(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + "]";
}

// The sum of every rank's block of `blocks` (as packSparse wrote them), coalesced; each block
// must describe a tensor of `like`'s shape, sparse/dense split and dtype.
at::Tensor sumPackedSparse(const VaryingBlocks& blocks, const at::Tensor& like) {
  const int ranks = static_cast<int>(blocks.offsets.size()) - 1;
  std::vector<at::Tensor> indices, values;
  for (int r = 0; r < ranks; ++r) {
    const char* block = blocks.data.data() + blocks.offsets[r];
    const size_t length = blocks.offsets[r + 1] - blocks.offsets[r];
    auto shortBlock = [&] {
      C10_THROW_ERROR(DistBackendError,
                      "ddl: all_reduce: rank " + std::to_string(r) + " sent a malformed block");
    };
    int64_t fixed[4];  // sparse_dim, dense_dim, dtype, ndim
    if (length < sizeof(fixed)) shortBlock();
    std::memcpy(fixed, block, sizeof(fixed));
    if (fixed[3] < 0 || fixed[3] > 64 || length < (5 + fixed[3]) * sizeof(int64_t)) shortBlock();
    std::vector<int64_t> header(5 + fixed[3]);
    std::memcpy(header.data(), block, header.size() * sizeof(int64_t));
    std::vector<int64_t> sizes(header.begin() + 4, header.end() - 1);
    if (fixed[0] != like.sparse_dim() || fixed[1] != like.dense_dim() ||
        c10::IntArrayRef(sizes) != like.sizes()) {
      C10_THROW_ERROR(DistBackendError,
                      "ddl: all_reduce: rank " + std::to_string(r) + "'s sparse tensor has sizes " +
                          shapeText(sizes) + " with sparse_dim " + std::to_string(fixed[0]) +
                          "; this rank's has sizes " + shapeText(like.sizes()) +
                          " with sparse_dim " + std::to_string(like.sparse_dim()));
    }
    if (fixed[2] != static_cast<int64_t>(like.scalar_type())) {
      C10_THROW_ERROR(DistBackendError,
                      "ddl: all_reduce: rank " + std::to_string(r) + "'s sparse tensor has dtype " +
                          c10::toString(static_cast<at::ScalarType>(fixed[2])) +
                          "; this rank's has " + c10::toString(like.scalar_type()));
    }
    const int64_t nnz = header.back();
    if (nnz < 0) shortBlock();
    std::vector<int64_t> valueShape{nnz};
    for (int64_t d = like.sparse_dim(); d < like.dim(); ++d) valueShape.push_back(like.size(d));
    at::Tensor rankIndices = at::empty({like.sparse_dim(), nnz}, at::kLong);
    at::Tensor rankValues = at::empty(valueShape, like._values().options());
    const size_t indexBytes = rankIndices.numel() * sizeof(int64_t);
    const size_t valueBytes = rankValues.numel() * rankValues.element_size();
    const size_t headerBytes = header.size() * sizeof(int64_t);
    if (length != headerBytes + indexBytes + valueBytes) shortBlock();
    if (indexBytes > 0) std::memcpy(rankIndices.data_ptr(), block + headerBytes, indexBytes);
    if (valueBytes > 0) {
      std::memcpy(rankValues.data_ptr(), block + headerBytes + indexBytes, valueBytes);
    }
    indices.push_back(rankIndices);
    values.push_back(rankValues);
  }
  return at::sparse_coo_tensor(at::cat(indices, 1), at::cat(values, 0), like.sizes(),
                               like.options())
      .coalesce();
}

}  // namespace

// Sparse COO all_reduce (SUM), as gloo offers it: every rank's indices and values are gathered
// (blocks of different sizes around the ring), summed and coalesced; the input tensor takes the
// result.
c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduceSparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const char* where = "all_reduce";
  at::Tensor& tensor = tensors[0];
  if (!tensor.device().is_cpu()) {
    badInput(where, "the sparse tensor is on " + tensor.device().str() +
                        "; ddl reduces sparse tensors on the CPU only");
  }
  if (opts.reduceOp.op_ != c10d::ReduceOp::SUM) {
    badInput(where, "sparse tensors are reduced with ReduceOp.SUM only");
  }
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::ALLREDUCE, tensors);
  at::Tensor packed = packSparse(tensor.coalesce());
  auto blocks = std::make_shared<VaryingBlocks>();
  work->keepAlive(packed);
  work->thenRun([tensor, blocks] {
    at::Tensor sum = sumPackedSparse(*blocks, tensor);
    tensor.copy_(sum);
  });
  return launch(work, callOptions(*work, "allreduce", opts.timeout), [&](CallOptions& o) {
    comm_->allgatherVarying(packed.data_ptr(), static_cast<size_t>(packed.numel()), blocks, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const char* where = "broadcast";
  CallScope scope(*comm_, where);
  at::Tensor& tensor = single(tensors, where);
  DataType type = checkTensor(tensor, where);
  if (opts.rootRank < 0 || opts.rootRank >= size_) {
    badInput(where, "src rank " + std::to_string(opts.rootRank) + " is not in a group of size " +
                        std::to_string(size_));
  }
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::BROADCAST, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, rank_ != opts.rootRank);
  return launch(work, callOptions(*work, "broadcast", opts.timeout), [&](CallOptions& o) {
    comm_->broadcast(buffer.data_ptr(), count(buffer), type, static_cast<int>(opts.rootRank), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* where = "all_gather";
  CallScope scope(*comm_, where);
  at::Tensor& input = single(inputs, where);
  DataType type = checkTensor(input, where);
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
    badInput(where, "needs a list of " + std::to_string(size_) + " output tensors, got " +
                        std::to_string(outputs.empty() ? 0 : outputs[0].size()));
  }
  for (const at::Tensor& out : outputs[0]) {
    if (checkTensor(out, where) != type || out.numel() != input.numel()) {
      badInput(where, "every output tensor must have the input's dtype (" +
                          std::string(c10::toString(input.scalar_type())) + ") and numel (" +
                          std::to_string(input.numel()) + ")");
    }
  }
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::ALLGATHER, outputs[0]);
  at::Tensor in = contiguousFor(input, *work, false);
  at::Tensor gathered = at::empty({size_, input.numel()}, input.options());
  work->keepAlive(in);
  work->keepAlive(gathered);
  for (int r = 0; r < size_; ++r) work->copyAfter(outputs[0][r], gathered[r].view_as(input));
  return launch(work, callOptions(*work, "allgather", opts.timeout), [&](CallOptions& o) {
    comm_->allgather(in.data_ptr(), gathered.data_ptr(), count(in), type, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const char* where = "all_gather_into_tensor";
  CallScope scope(*comm_, where);
  DataType type = checkTensor(input, where);
  checkSameType(where, output, type, "output");
  if (output.numel() != input.numel() * size_) {
    badInput(where, "output has " + std::to_string(output.numel()) + " elements; it needs " +
                        std::to_string(size_) + " x " + std::to_string(input.numel()));
  }
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::_ALLGATHER_BASE,
                                           std::vector<at::Tensor>{output});
  at::Tensor in = contiguousFor(input, *work, false);
  at::Tensor out = contiguousFor(output, *work, true);
  return launch(work, callOptions(*work, "allgather", opts.timeout), [&](CallOptions& o) {
    comm_->allgather(in.data_ptr(), out.data_ptr(), count(in), type, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::barrier(const c10d::BarrierOptions& opts) {
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::BARRIER, std::vector<at::Tensor>{});
  return launch(work, callOptions(*work, "barrier", opts.timeout),
                [&](CallOptions& o) { comm_->barrier(o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const char* where = "reduce";
  CallScope scope(*comm_, where);
  at::Tensor& tensor = single(tensors, where);
  DataType type = checkTensor(tensor, where);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  checkRank(where, "dst", opts.rootRank, size_);
  const bool root = rank_ == opts.rootRank;
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::REDUCE, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, root);
  if (opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM && !root && buffer.is_same(tensor)) {
    buffer = buffer.clone();
    work->keepAlive(buffer);
  }
  premultiply(opts.reduceOp, buffer, where);
  return launch(work, callOptions(*work, "reduce", opts.timeout), [&](CallOptions& o) {
    comm_->reduce(buffer.data_ptr(), root ? buffer.data_ptr() : nullptr, count(buffer), type, op,
                  static_cast<int>(opts.rootRank), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* where = "gather";
  CallScope scope(*comm_, where);
  at::Tensor& input = single(inputs, where);
  DataType type = checkTensor(input, where);
  checkRank(where, "dst", opts.rootRank, size_);
  const bool root = rank_ == opts.rootRank;
  if (root) {
    if (outputs.size() != 1) badInput(where, "the destination needs one list of outputs");
    checkList(where, outputs[0], input, input.numel(), size_);
  } else if (!outputs.empty() && !outputs[0].empty()) {
    badInput(where, "only the destination rank passes an output list");
  }
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::GATHER,
                                           root ? outputs[0] : std::vector<at::Tensor>{});
  at::Tensor in = contiguousFor(input, *work, false);
  at::Tensor gathered;
  if (root) {
    gathered = at::empty({size_, input.numel()}, input.options());
    work->keepAlive(gathered);
    for (int r = 0; r < size_; ++r) work->copyAfter(outputs[0][r], gathered[r].view_as(input));
  }
  return launch(work, callOptions(*work, "gather", opts.timeout), [&](CallOptions& o) {
    comm_->gather(in.data_ptr(), root ? gathered.data_ptr() : nullptr, count(in), type,
                  static_cast<int>(opts.rootRank), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* where = "scatter";
  CallScope scope(*comm_, where);
  at::Tensor& output = single(outputs, where);
  DataType type = checkTensor(output, where);
  checkRank(where, "src", opts.rootRank, size_);
  const bool root = rank_ == opts.rootRank;
  if (root) {
    if (inputs.size() != 1) badInput(where, "the source needs one list of inputs");
    checkList(where, inputs[0], output, output.numel(), size_);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    badInput(where, "only the source rank passes an input list");
  }
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::SCATTER, outputs);
  at::Tensor staged = root ? concatenate(inputs[0], output) : at::Tensor();
  if (root) work->keepAlive(staged);
  at::Tensor out = contiguousFor(output, *work, true);
  return launch(work, callOptions(*work, "scatter", opts.timeout), [&](CallOptions& o) {
    comm_->scatter(root ? staged.data_ptr() : nullptr, out.data_ptr(), count(out), type,
                   static_cast<int>(opts.rootRank), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* where = "reduce_scatter";
  CallScope scope(*comm_, where);
  at::Tensor& output = single(outputs, where);
  DataType type = checkTensor(output, where);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  if (inputs.size() != 1) badInput(where, "needs one list of inputs");
  checkList(where, inputs[0], output, output.numel(), size_);
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::REDUCE_SCATTER, outputs);
  at::Tensor staged = concatenate(inputs[0], output);
  work->keepAlive(staged);
  premultiply(opts.reduceOp, staged, where);
  const int64_t n = output.numel();
  work->copyAfter(output, staged.narrow(0, rank_ * n, n).view_as(output));
  return launch(work, callOptions(*work, "reduce_scatter", opts.timeout), [&](CallOptions& o) {
    comm_->reduceScatter(staged.data_ptr(), count(output), type, op, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* where = "reduce_scatter_tensor";
  CallScope scope(*comm_, where);
  DataType type = checkTensor(output, where);
  checkSameType(where, input, type, "input");
  if (input.numel() != output.numel() * size_) {
    badInput(where, "input has " + std::to_string(input.numel()) + " elements; it needs " +
                        std::to_string(size_) + " x " + std::to_string(output.numel()));
  }
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::_REDUCE_SCATTER_BASE,
                                           std::vector<at::Tensor>{output});
  at::Tensor staged = input.reshape({-1}).clone(at::MemoryFormat::Contiguous);
  work->keepAlive(staged);
  premultiply(opts.reduceOp, staged, where);
  const int64_t n = output.numel();
  work->copyAfter(output, staged.narrow(0, rank_ * n, n).view_as(output));
  return launch(work, callOptions(*work, "reduce_scatter", opts.timeout), [&](CallOptions& o) {
    comm_->reduceScatter(staged.data_ptr(), count(output), type, op, o);
  });
}

namespace {

// Byte layout of an all-to-all whose blocks are given in elements.
AlltoallLayout layoutOf(const std::vector<int64_t>& sendElements,
                        const std::vector<int64_t>& recvElements, size_t elementBytes) {
  AlltoallLayout layout;
  size_t sendAt = 0, recvAt = 0;
  for (size_t p = 0; p < sendElements.size(); ++p) {
    layout.sendOffsets.push_back(sendAt);
    layout.sendBytes.push_back(static_cast<size_t>(sendElements[p]) * elementBytes);
    sendAt += layout.sendBytes.back();
    layout.recvOffsets.push_back(recvAt);
    layout.recvBytes.push_back(static_cast<size_t>(recvElements[p]) * elementBytes);
    recvAt += layout.recvBytes.back();
  }
  return layout;
}

// Rows per rank: the given split sizes, or an even split of dimension 0.
std::vector<int64_t> splitsOf(const char* where, const char* what, const at::Tensor& t,
                              const std::vector<int64_t>& splits, int size) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  if (splits.empty()) {
    if (rows % size != 0) {
      badInput(where, std::string(what) + " has " + std::to_string(rows) +
                          " rows, which do not split evenly over " + std::to_string(size) +
                          " ranks; pass split sizes");
    }
    return std::vector<int64_t>(size, rows / size);
  }
  if (splits.size() != static_cast<size_t>(size)) {
    badInput(where, std::string(what) + " split sizes name " + std::to_string(splits.size()) +
                        " ranks, not " + std::to_string(size));
  }
  int64_t total = 0;
  for (int64_t s : splits) {
    if (s < 0) badInput(where, std::string(what) + " split sizes must not be negative");
    total += s;
  }
  if (total != rows) {
    badInput(where, std::string(what) + " split sizes add up to " + std::to_string(total) +
                        ", but the tensor has " + std::to_string(rows) + " rows");
  }
  return splits;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  const char* where = "all_to_all_single";
  CallScope scope(*comm_, where);
  DataType type = checkTensor(input, where);
  checkSameType(where, output, type, "output");
  std::vector<int64_t> sendRows = splitsOf(where, "input", input, inputSplitSizes, size_);
  std::vector<int64_t> recvRows = splitsOf(where, "output", output, outputSplitSizes, size_);
  const int64_t inRow = input.dim() == 0 || input.size(0) == 0 ? 0 : input.numel() / input.size(0);
  const int64_t outRow =
      output.dim() == 0 || output.size(0) == 0 ? 0 : output.numel() / output.size(0);
  for (auto& r : sendRows) r *= inRow;
  for (auto& r : recvRows) r *= outRow;
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::ALLTOALL_BASE,
                                           std::vector<at::Tensor>{output});
  at::Tensor in = contiguousFor(input, *work, false);
  at::Tensor out = contiguousFor(output, *work, true);
  if (in.numel() > 0 && in.data_ptr() == out.data_ptr()) {
    in = in.clone();
    work->keepAlive(in);
  }
  AlltoallLayout layout = layoutOf(sendRows, recvRows, elementSize(type));
  return launch(work, callOptions(*work, "all_to_all", opts.timeout),
                [&](CallOptions& o) { comm_->alltoall(in.data_ptr(), out.data_ptr(), layout, o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  const char* where = "all_to_all";
  CallScope scope(*comm_, where);
  if (inputs.size() != static_cast<size_t>(size_) || outputs.size() != inputs.size()) {
    badInput(where, "needs " + std::to_string(size_) + " input and output tensors, got " +
                        std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  }
  DataType type = checkTensor(inputs[0], where);
  std::vector<int64_t> sendElements, recvElements;
  for (int p = 0; p < size_; ++p) {
    if (checkTensor(inputs[p], where) != type || checkTensor(outputs[p], where) != type) {
      badInput(where, "every tensor must have dtype " +
                          std::string(c10::toString(inputs[0].scalar_type())));
    }
    sendElements.push_back(inputs[p].numel());
    recvElements.push_back(outputs[p].numel());
  }
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::ALLTOALL, outputs);
  at::Tensor in = concatenate(inputs, inputs[0]);
  int64_t total = 0;
  for (int64_t e : recvElements) total += e;
  at::Tensor out = at::empty({total}, inputs[0].options());
  work->keepAlive(in);
  work->keepAlive(out);
  int64_t offset = 0;
  for (int p = 0; p < size_; ++p) {
    work->copyAfter(outputs[p], out.narrow(0, offset, recvElements[p]).view_as(outputs[p]));
    offset += recvElements[p];
  }
  AlltoallLayout layout = layoutOf(sendElements, recvElements, elementSize(type));
  return launch(work, callOptions(*work, "all_to_all", opts.timeout),
                [&](CallOptions& o) { comm_->alltoall(in.data_ptr(), out.data_ptr(), layout, o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                     int tag) {
  const char* where = "send";
  at::Tensor& tensor = single(tensors, where);
  DataType type = checkTensor(tensor, where);
  checkRank(where, "dst", dstRank, size_);
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::SEND, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, false);
  work->keepAlive(buffer);
  return launch(work, callOptions(*work, "send", c10d::kUnsetTimeout), [&](CallOptions& o) {
    comm_->send(buffer.data_ptr(), count(buffer) * elementSize(type), dstRank,
                static_cast<uint32_t>(tag), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::receive(std::vector<at::Tensor>& tensors,
                                                        int srcRank, int tag, c10d::OpType type,
                                                        const char* where) {
  at::Tensor& tensor = single(tensors, where);
  DataType dtype = checkTensor(tensor, where);
  if (srcRank != -1) checkRank(where, "src", srcRank, size_);
  auto work = c10::make_intrusive<WorkDDL>(rank_, type, tensors);
  at::Tensor buffer = contiguousFor(tensor, *work, true);
  return launch(work, callOptions(*work, "recv", c10d::kUnsetTimeout), [&](CallOptions& o) {
    comm_->recv(buffer.data_ptr(), count(buffer) * elementSize(dtype), srcRank,
                static_cast<uint32_t>(tag), o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                     int tag) {
  return receive(tensors, srcRank, tag, c10d::OpType::RECV, "recv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return receive(tensors, -1, tag, c10d::OpType::RECVANYSOURCE, "recv");
}

void ProcessGroupDDL::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::BARRIER, std::vector<at::Tensor>{});
  launch(work, callOptions(*work, "monitored_barrier", opts.timeout),
         [&](CallOptions& o) { comm_->monitoredBarrier(waitAllRanks, o); });
  work->wait();
}

namespace {

// Checks that the coalesced tensors share one dtype and returns it.
DataType commonType(const char* where, const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) badInput(where, "needs at least one tensor");
  DataType type = checkTensor(tensors[0], where);
  for (const at::Tensor& t : tensors) {
    if (checkTensor(t, where) != type) {
      badInput(where, "every tensor must have dtype " +
                          std::string(c10::toString(tensors[0].scalar_type())));
    }
  }
  return type;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* where = "all_reduce_coalesced";
  CallScope scope(*comm_, where);
  DataType type = commonType(where, tensors);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  // One allreduce over the tensors laid end to end.
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::ALLREDUCE_COALESCED, tensors);
  at::Tensor flat = concatenate(tensors, tensors[0]);
  work->keepAlive(flat);
  premultiply(opts.reduceOp, flat, where);
  int64_t offset = 0;
  for (at::Tensor& t : tensors) {
    work->copyAfter(t, flat.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
  return launch(work, callOptions(*work, "allreduce", opts.timeout), [&](CallOptions& o) {
    comm_->allreduce(flat.data_ptr(), count(flat), type, op, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* where = "all_gather_into_tensor_coalesced";
  CallScope scope(*comm_, where);
  DataType type = commonType(where, inputs);
  if (outputs.size() != inputs.size()) badInput(where, "needs one output per input");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (checkTensor(outputs[i], where) != type || outputs[i].numel() != inputs[i].numel() * size_) {
      badInput(where, "output " + std::to_string(i) + " needs dtype " +
                          std::string(c10::toString(inputs[0].scalar_type())) + " and " +
                          std::to_string(size_) + " x " + std::to_string(inputs[i].numel()) +
                          " elements");
    }
  }
  // One allgather of the inputs laid end to end; output i takes its column of each block.
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::COALESCED, outputs);
  at::Tensor flat = concatenate(inputs, inputs[0]);
  at::Tensor gathered = at::empty({size_, flat.numel()}, flat.options());
  work->keepAlive(flat);
  work->keepAlive(gathered);
  int64_t offset = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t n = inputs[i].numel();
    // Copy sources must be views (a reshape of this strided column would copy now, too early).
    at::Tensor column = gathered.narrow(1, offset, n);
    if (outputs[i].is_contiguous()) {
      work->copyAfter(outputs[i].view({size_, n}), column);
    } else {
      at::Tensor staged = at::empty({size_, n}, flat.options());
      work->keepAlive(staged);
      work->copyAfter(staged, column);
      work->copyAfter(outputs[i], staged.view(outputs[i].sizes()));
    }
    offset += n;
  }
  return launch(work, callOptions(*work, "allgather", opts.timeout), [&](CallOptions& o) {
    comm_->allgather(flat.data_ptr(), gathered.data_ptr(), count(flat), type, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // outputLists[r][i] receives rank r's inputs[i] (rank-major, as torch documents it).
  const char* where = "all_gather_coalesced";
  CallScope scope(*comm_, where);
  DataType type = commonType(where, inputs);
  if (outputLists.size() != static_cast<size_t>(size_)) {
    badInput(where, "needs " + std::to_string(size_) + " output lists, one per rank, got " +
                        std::to_string(outputLists.size()));
  }
  std::vector<at::Tensor> all;
  for (int r = 0; r < size_; ++r) {
    if (outputLists[r].size() != inputs.size()) {
      badInput(where, "output list " + std::to_string(r) + " needs " +
                          std::to_string(inputs.size()) + " tensors, one per input");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (checkTensor(outputLists[r][i], where) != type ||
          outputLists[r][i].numel() != inputs[i].numel()) {
        badInput(where, "output " + std::to_string(r) + "/" + std::to_string(i) +
                            " must match input " + std::to_string(i) + " in dtype and numel");
      }
    }
    all.insert(all.end(), outputLists[r].begin(), outputLists[r].end());
  }
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::ALLGATHER_COALESCED, all);
  at::Tensor flat = concatenate(inputs, inputs[0]);
  at::Tensor gathered = at::empty({size_, flat.numel()}, flat.options());
  work->keepAlive(flat);
  work->keepAlive(gathered);
  int64_t offset = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t n = inputs[i].numel();
    for (int r = 0; r < size_; ++r) {
      work->copyAfter(outputLists[r][i], gathered[r].narrow(0, offset, n).view_as(inputs[i]));
    }
    offset += n;
  }
  return launch(work, callOptions(*work, "allgather", opts.timeout), [&](CallOptions& o) {
    comm_->allgather(flat.data_ptr(), gathered.data_ptr(), count(flat), type, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* where = "reduce_scatter_tensor_coalesced";
  CallScope scope(*comm_, where);
  DataType type = commonType(where, inputs);
  ReduceOp op = reduceOpFor(opts.reduceOp, type, where);
  if (outputs.size() != inputs.size()) badInput(where, "needs one output per input");
  std::vector<at::Tensor> columns;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (checkTensor(outputs[i], where) != type || inputs[i].numel() != outputs[i].numel() * size_) {
      badInput(where, "input " + std::to_string(i) + " needs " + std::to_string(size_) + " x " +
                          std::to_string(outputs[i].numel()) + " elements");
    }
    columns.push_back(inputs[i].reshape({size_, outputs[i].numel()}));
  }
  // Block r of the staged buffer holds block r of every input, so one reduce-scatter serves all.
  auto work = c10::make_intrusive<WorkDDL>(rank_, c10d::OpType::COALESCED, outputs);
  at::Tensor staged = at::cat(columns, 1).contiguous();
  work->keepAlive(staged);
  premultiply(opts.reduceOp, staged, where);
  const int64_t block = staged.size(1);
  int64_t offset = 0;
  for (at::Tensor& out : outputs) {
    work->copyAfter(out, staged[rank_].narrow(0, offset, out.numel()).view_as(out));
    offset += out.numel();
  }
  return launch(work, callOptions(*work, "reduce_scatter", opts.timeout), [&](CallOptions& o) {
    comm_->reduceScatter(staged.data_ptr(), static_cast<size_t>(block), type, op, o);
  });
}

c10d::ErrorType ProcessGroupDDL::getError() {
  switch (comm_->firstFailure().first) {
    case GroupState::Failure::kNone:
      return c10d::ErrorType::SUCCESS;
    case GroupState::Failure::kTimeout:
      return c10d::ErrorType::TIMEOUT;
    case GroupState::Failure::kCommunication:
      return c10d::ErrorType::COMM_ERROR;
  }
  return c10d::ErrorType::COMM_ERROR;
}

void ProcessGroupDDL::abort() { comm_->close("aborted: abort() was called on this group"); }

void ProcessGroupDDL::shutdown() { comm_->close("the group was shut down"); }

}  // namespace ddl
