#include "window.hpp"

#include <Python.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "../core/base/log.h"
#include "arguments.hpp"
#include "device_streams.hpp"
#include "errors.hpp"

namespace ddl {
namespace {

// "float32 [4, 8] on cpu": what every rank's registration must agree on.
std::string layoutOf(const at::Tensor& t) {
  std::string sizes;
  for (int64_t s : t.sizes()) sizes += (sizes.empty() ? "" : ", ") + std::to_string(s);
  return std::string(c10::toString(t.scalar_type())) + " [" + sizes + "] on " +
         c10::DeviceTypeName(t.device().type(), true);
}

// Why this rank cannot register `t` ("" when it can).
std::string refusalOf(const at::Tensor& t) {
  if (!t.defined()) return "the tensor is undefined";
  if (t.layout() != c10::kStrided) return "the tensor is not dense (" + c10::str(t.layout()) + ")";
  if (!t.is_contiguous()) return "the tensor is not contiguous";
  if (t.is_cpu()) return "";
  if (!t.is_cuda())
    return "the tensor is on " + t.device().str() + "; windows hold CPU or CUDA tensors";
  if (cudaStreams() == nullptr) {
    return "the tensor is on " + t.device().str() +
           ", but this build of torch_ddl has no CUDA support";
  }
  return "";
}

// Lets other Python threads run while this one waits (the GIL is released only where it is held:
// torch's bindings may have released it already).
class WithoutGil {
 public:
  WithoutGil() : state_(Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~WithoutGil() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* state_;
};

// A device tensor's producer kernels have run once this returns (puts read it from the host's
// side of the transport).
void settle(const at::Tensor& t) {
  if (t.is_cpu()) return;
  c10::impl::VirtualGuardImpl impl(t.device().type());
  impl.synchronizeStream(impl.getStream(t.device()));
}

}  // namespace

WindowDDL::WindowDDL(c10::intrusive_ptr<ProcessGroupDDL> group,
                     const std::optional<at::Tensor>& tensor)
    : group_(std::move(group)) {
  try {
    WithoutGil released;
    window_ = ddl::Window::create(*group_->communicator());
  } catch (const ddl::Error& e) {
    torch_errors::raise(e.status());
  }
  if (tensor && tensor->defined()) tensor_register(*tensor, true);
}

WindowDDL::~WindowDDL() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!layout_ || !window_) return;
  if (logs(LogLevel::kWarn)) {
    logLine(LogLevel::kWarn, "window " + std::to_string(window_->id()) + " of group " +
                                 std::to_string(window_->communicator().id()) +
                                 " was dropped while it held a tensor (no tensor_deregister): "
                                 "the tensor stays registered until the group is destroyed");
  }
  group_->keepForLife(
      std::make_shared<std::pair<at::Tensor, std::shared_ptr<ddl::Window>>>(tensor_, window_));
}

void WindowDDL::tensor_register(const at::Tensor& tensor, bool owning) {
  WindowMemory m;
  m.refusal = refusalOf(tensor);
  if (m.refusal.empty()) {
    m.data = tensor.data_ptr();
    m.bytes = tensor.nbytes();
    m.layout = layoutOf(tensor);
    m.memory = tensor.is_cpu() ? MemoryKind::kHost : MemoryKind::kCuda;
    m.device = tensor.is_cpu() ? 0 : tensor.device().index();
    // A tensor that is its whole storage may move into shared memory, for this host's peers to
    // map (as an allreduce's may: reuse_tracker.hpp). The window keeps such a tensor alive.
    const c10::Storage& storage = tensor.storage();
    if (owning && tensor.is_cpu() && tensor.data_ptr() == storage.data() &&
        tensor.nbytes() == storage.nbytes()) {
      m.adoptable = Adoptable{tensor.data_ptr(), storage.nbytes()};
    }
    settle(tensor);
  }
  {
    WithoutGil released;
    try {
      window_->attach(m);
    } catch (const ddl::Error& e) {
      if (e.kind() == StatusKind::kInvalidArgument) torch_errors::raiseBadInput(e.what());
      torch_errors::raise(e.status());
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (owning) tensor_ = tensor;
  layout_ = at::empty(tensor.sizes(), tensor.options().device(at::kMeta));
  layoutDevice_ = tensor.device();
}

void WindowDDL::tensor_deregister() {
  {
    WithoutGil released;
    try {
      window_->detach();
    } catch (const ddl::Error& e) {
      // Still registered (peers may put into it): the tensor is kept, as the window is.
      torch_errors::raise(e.status());
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  tensor_ = at::Tensor();
  layout_.reset();
}

std::pair<at::Tensor, at::Device> WindowDDL::registered(const char* where) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!layout_) badInput(where, "the window holds no tensor (tensor_register one first)");
  return {*layout_, layoutDevice_};
}

at::Tensor WindowDDL::map_remote_tensor(int64_t rank) {
  const char* where = "map_remote_tensor";
  const auto [layout, device] = registered(where);
  checkRank(where, "rank", rank, window_->size());
  if (!device.is_cpu() && rank != window_->rank()) {
    badInput(where, "the window's tensors are on " + device.str() +
                        "; only CPU tensors of peers are mapped");
  }
  if (layout.numel() == 0) return at::empty(layout.sizes(), layout.options().device(device));
  if (rank == window_->rank()) {
    // This rank's own tensor: itself, which its storage keeps alive also after
    // tensor_deregister (a view of memory the window does not own would not be).
    std::lock_guard<std::mutex> lock(mutex_);
    if (tensor_.defined()) return tensor_.view(layout.sizes());
  }
  std::string why;
  std::shared_ptr<char> base = window_->mapped(static_cast<int>(rank), &why);
  if (!base) {
    badInput(where, "rank " + std::to_string(rank) + "'s tensor cannot be mapped here: " + why);
  }
  char* data = base.get();
  return at::from_blob(
      data, layout.sizes(), [base](void*) mutable { base.reset(); },
      layout.options().device(device));
}

c10::intrusive_ptr<c10d::Work> WindowDDL::launch(const char* where, c10d::OpType type,
                                                 std::chrono::milliseconds timeout, bool asyncOp,
                                                 const at::Tensor& source,
                                                 const std::function<void(CallOptions&)>& submit) {
  auto work = c10::make_intrusive<WorkDDL>(where, window_->rank(), type, std::vector<at::Tensor>{});
  if (source.defined()) work->keepAlive(source);
  CallOptions options = group_->callOptions(*work, timeout);
  options.waited = !asyncOp;
  options.work->retain(work->tensorsInUse());
  try {
    WithoutGil released;
    submit(options);
  } catch (const ddl::Error& e) {
    options.work->finish(e.status());
    torch_errors::raiseBadInput(e.what());
  }
  if (!asyncOp) {
    WithoutGil released;
    work->wait();
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> WindowDDL::put(const at::Tensor& tensor, int64_t dstRank,
                                              int64_t targetOffset, bool asyncOp,
                                              std::chrono::milliseconds timeout) {
  const char* where = "put";
  const auto [layout, device] = registered(where);
  checkRank(where, "dst", dstRank, window_->size());
  if (!tensor.defined() || tensor.layout() != c10::kStrided) {
    badInput(where, "the tensor must be a defined dense tensor");
  }
  if (tensor.scalar_type() != layout.scalar_type()) {
    badInput(where, std::string("the tensor is ") + c10::toString(tensor.scalar_type()) +
                        ", the window's are " + c10::toString(layout.scalar_type()));
  }
  if (tensor.device().type() != device.type()) {
    badInput(where,
             "the tensor is on " + tensor.device().str() + ", the window's are on " + device.str());
  }
  const int64_t room = layout.numel();
  if (targetOffset < 0 || targetOffset > room || tensor.numel() > room - targetOffset) {
    badInput(where, std::to_string(tensor.numel()) + " elements at element offset " +
                        std::to_string(targetOffset) + " do not fit in the " +
                        std::to_string(room) + " elements of rank " + std::to_string(dstRank) +
                        "'s tensor");
  }
  at::Tensor source = tensor.contiguous();
  settle(source);
  return launch(where, c10d::OpType::SEND, timeout, asyncOp, source, [&](CallOptions& options) {
    options.memory = source.is_cpu() ? MemoryKind::kHost : MemoryKind::kCuda;
    options.device = source.is_cpu() ? 0 : source.device().index();
    window_->put(source.data_ptr(), source.nbytes(), static_cast<int>(dstRank),
                 static_cast<size_t>(targetOffset) * source.element_size(), options);
  });
}

c10::intrusive_ptr<c10d::Work> WindowDDL::signal(int64_t peer, bool asyncOp,
                                                 std::chrono::milliseconds timeout) {
  const char* where = "signal";
  checkRank(where, "peer", peer, window_->size());
  return launch(where, c10d::OpType::SEND, timeout, asyncOp, at::Tensor(),
                [&](CallOptions& o) { window_->signal(static_cast<int>(peer), o); });
}

c10::intrusive_ptr<c10d::Work> WindowDDL::waitSignal(int64_t peer, bool asyncOp,
                                                     std::chrono::milliseconds timeout) {
  const char* where = "wait_signal";
  checkRank(where, "peer", peer, window_->size());
  return launch(where, c10d::OpType::RECV, timeout, asyncOp, at::Tensor(),
                [&](CallOptions& o) { window_->waitSignal(static_cast<int>(peer), o); });
}

std::string WindowDDL::route(int64_t peer) const {
  checkRank("route", "peer", peer, window_->size());
  return window_->route(static_cast<int>(peer));
}

#ifdef DDL_TORCH_HAS_WINDOW
c10d::WindowAttr WindowDDL::get_attr(int64_t peerRank) {
  checkRank("get_attr", "peer", peerRank, window_->size());
  return c10d::WindowAttr{c10d::WindowAccessType::UNIFIED};
}
#endif

}  // namespace ddl
