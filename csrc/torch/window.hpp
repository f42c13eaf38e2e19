// ddl's one-sided window (group/window.h) as torch sees it: c10d::Window from torch 2.14 on
// (dist._new_window, ProcessGroup.new_window), and a class of its own with the same methods
// before (torch_ddl.new_window). Tensors are checked here; puts and signals return WorkDDLs.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "../core/group/window.h"
#include "compat.hpp"
#include "process_group_ddl.hpp"

#ifdef DDL_TORCH_HAS_WINDOW
#define DDL_WINDOW_OVERRIDE override
#else
#define DDL_WINDOW_OVERRIDE
#endif

namespace ddl {

class WindowDDL : public torch_compat::WindowBase {
 public:
  // Collective over the group's ranks; registers `tensor` when given (collectively too).
  WindowDDL(c10::intrusive_ptr<ProcessGroupDDL> group, const std::optional<at::Tensor>& tensor);
  // Dropped while it holds a tensor (no tensor_deregister on every rank): peers may still put
  // into it, so the tensor stays registered and alive until the group is destroyed (a warning
  // says so), rather than freed memory being written.
  ~WindowDDL() override;

  // Collective: every rank registers a contiguous tensor of one dtype and shape, on the CPU or
  // (a build with CUDA) a CUDA device; a rank whose tensor is refused makes every rank raise.
  // `owning`: the window keeps the tensor alive until tensor_deregister.
  void tensor_register(const at::Tensor& tensor, bool owning = true) DDL_WINDOW_OVERRIDE;
  // Collective: waits for this rank's puts to land and for every rank to get here. When that
  // fails it raises and the tensor stays registered (peers may still put into it).
  void tensor_deregister() DDL_WINDOW_OVERRIDE;
  // The tensor of `rank`, mapped into this process: a peer on this host whose tensor is in
  // shared memory, or this rank's own (the registered tensor itself when the window owns it; a
  // view of its memory, which the caller keeps alive, when not). Raises, saying why, otherwise.
  at::Tensor map_remote_tensor(int64_t rank) DDL_WINDOW_OVERRIDE;

  // Writes `tensor` at element `targetOffset` of `dstRank`'s tensor. asyncOp false: returns once
  // the put is done (the source may be reused).
  c10::intrusive_ptr<c10d::Work> put(const at::Tensor& tensor, int64_t dstRank,
                                     int64_t targetOffset, bool asyncOp,
                                     std::chrono::milliseconds timeout);
  // A signal to `peer`, seen there after every put this rank made to it before.
  c10::intrusive_ptr<c10d::Work> signal(int64_t peer, bool asyncOp,
                                        std::chrono::milliseconds timeout);
  // Done once a signal from `peer` arrived (one per call).
  c10::intrusive_ptr<c10d::Work> waitSignal(int64_t peer, bool asyncOp,
                                            std::chrono::milliseconds timeout);
  // How puts reach `peer` from here: "mapped", "put" (the transport's), "self" or "none".
  std::string route(int64_t peer) const;
  uint64_t id() const { return window_->id(); }

#ifdef DDL_TORCH_HAS_WINDOW
  c10::intrusive_ptr<c10d::Work> put(const at::Tensor& tensor, int64_t dstRank,
                                     int64_t targetOffsetNelems, bool asyncOp,
                                     const c10d::PutOptions& opts) override {
    return put(tensor, dstRank, targetOffsetNelems, asyncOp, opts.timeout);
  }
  c10::intrusive_ptr<c10d::Work> signal(int64_t peerRank, bool asyncOp,
                                        const c10d::SignalOptions& opts) override {
    return signal(peerRank, asyncOp, opts.timeout);
  }
  c10::intrusive_ptr<c10d::Work> wait_signal(int64_t peerRank, bool asyncOp,
                                             const c10d::WaitSignalOptions& opts) override {
    return waitSignal(peerRank, asyncOp, opts.timeout);
  }
  // Every peer's memory is one coherent view (host memory, or a device's through its copies).
  c10d::WindowAttr get_attr(int64_t peerRank) override;
#endif

 private:
  // The registered tensor's layout (on the meta device) and device; bad input when there is none.
  std::pair<at::Tensor, at::Device> registered(const char* where) const;
  // A Work of the group for one window call: `submit` hands the core its options (`source`, if
  // any, lives as long as the op); waited for unless `asyncOp`.
  c10::intrusive_ptr<c10d::Work> launch(const char* where, c10d::OpType type,
                                        std::chrono::milliseconds timeout, bool asyncOp,
                                        const at::Tensor& source,
                                        const std::function<void(CallOptions&)>& submit);

  c10::intrusive_ptr<ProcessGroupDDL> group_;
  std::shared_ptr<ddl::Window> window_;  // qualified: c10d::Window is a base
  mutable std::mutex mutex_;
  at::Tensor tensor_;  // registered, while owning
  // The registered tensor's dtype, shape and device (an empty tensor of them), while registered.
  std::optional<at::Tensor> layout_;  // on the meta device
  at::Device layoutDevice_{at::kCPU};
};

}  // namespace ddl
