// A call's arguments: what each c10d method checks before anything moves (an error names the
// call and the problem, and the other ranks' op fails at once: CallScope), and how tensors map
// to the core's types and buffers.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "../core/group/communicator.h"
#include "work.hpp"

namespace ddl {

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

// Refuses the call on this rank (and tells the others, see CallScope) with a ValueError that
// names `where` and `what`.
[[noreturn]] void badInput(const char* where, const std::string& what);

// The core dtype of a strided CPU or CUDA tensor; bad input otherwise.
DataType checkTensor(const at::Tensor& t, const char* where);
// `t` (the `what` tensor) must have dtype `type`, like the call's other tensor.
void checkSameType(const char* where, const at::Tensor& t, DataType type, const char* what);
// The core reduce op for `op` on `type`; bad input when the pair makes no sense.
ReduceOp reduceOpFor(const c10d::ReduceOp& op, DataType type, const char* where);
// PREMUL_SUM: scales `buffer` (a private copy, or an in-place output) by the op's factor.
void premultiply(const c10d::ReduceOp& op, at::Tensor& buffer, const char* where);
// The one tensor of a call that takes a list of one.
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* where);
void checkRank(const char* where, const char* what, int64_t rank, int size);
// Checks that every tensor of `list` matches `like` in dtype and element count.
void checkList(const char* where, const std::vector<at::Tensor>& list, const at::Tensor& like,
               int64_t numel, size_t expected);
// gather's outputs, scatter's inputs: at the root (`role`: "destination", "source") one list of
// `size` tensors like `like`, elsewhere none (`what`: "output", "input").
void checkRootList(const char* where, const std::vector<std::vector<at::Tensor>>& lists,
                   const at::Tensor& like, bool root, int size, const char* role, const char* what);
// Checks that the coalesced tensors share one dtype and returns it.
DataType commonType(const char* where, const std::vector<at::Tensor>& tensors);
// Rows per rank: the given split sizes, or an even split of dimension 0.
std::vector<int64_t> splitsOf(const char* where, const char* what, const at::Tensor& t,
                              const std::vector<int64_t>& splits, int size);

// `t` itself when contiguous; otherwise a contiguous copy that the work writes back to `t`.
// Either way the work keeps it alive.
at::Tensor contiguousFor(const at::Tensor& t, WorkDDL& work, bool writeBack);
// A contiguous CUDA `buffer` of 1 to TORCH_DDL_DEVICE_STAGE_BYTES bytes is replaced by a pinned
// host copy, taken on the caller's current stream (the op starts behind it) and written back to
// the old buffer on the device before the work completes, ahead of the work's other copies: the
// op then runs the host algorithms (docs/gpus.md). Anything else is left as it is.
void stageOnHost(at::Tensor& buffer, WorkDDL& work);
inline size_t count(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }
// One contiguous 1-D tensor holding the tensors of `list` back to back.
at::Tensor concatenate(const std::vector<at::Tensor>& list, const at::Tensor& like);
// Byte layout of an all-to-all whose blocks are given in elements.
AlltoallLayout layoutOf(const std::vector<int64_t>& sendElements,
                        const std::vector<int64_t>& recvElements, size_t elementBytes);

}  // namespace ddl
