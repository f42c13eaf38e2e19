#include "arguments.hpp"

#include <c10/util/Exception.h>

#include <string>

#include "../core/base/config.h"
#include "compat.hpp"
#include "errors.hpp"

namespace ddl {
namespace {

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

}  // namespace

thread_local CallScope* CallScope::current_ = nullptr;

[[noreturn]] void badInput(const char* where, const std::string& what) {
  CallScope::refuse(what);
  torch_errors::raiseBadInput(std::string("ddl: ") + where + ": " + what);
}

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

void stageOnHost(at::Tensor& buffer, WorkDDL& work) {
  const size_t bytes = static_cast<size_t>(buffer.numel()) * buffer.element_size();
  if (!buffer.is_cuda() || bytes == 0 || bytes > config().deviceStageBytes) return;
  at::Tensor host =
      at::empty(buffer.sizes(), buffer.options().device(at::kCPU).pinned_memory(true));
  host.copy_(buffer, /*non_blocking=*/true);
  work.copyFirst(buffer, host);
  work.keepAlive(host);
  work.markStagedOnHost();
  buffer = host;
}

void checkRank(const char* where, const char* what, int64_t rank, int size) {
  if (rank < 0 || rank >= size) {
    badInput(where, std::string(what) + " " + std::to_string(rank) +
                        " is not a rank of a group of size " + std::to_string(size));
  }
}

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

at::Tensor concatenate(const std::vector<at::Tensor>& list, const at::Tensor& like) {
  if (list.empty()) return at::empty({0}, like.options());
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

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

void checkRootList(const char* where, const std::vector<std::vector<at::Tensor>>& lists,
                   const at::Tensor& like, bool root, int size, const char* role,
                   const char* what) {
  if (root) {
    if (lists.size() != 1) {
      badInput(where, std::string("the ") + role + " needs one list of " + what + "s");
    }
    checkList(where, lists[0], like, like.numel(), static_cast<size_t>(size));
  } else if (!lists.empty() && !lists[0].empty()) {
    badInput(where, std::string("only the ") + role + " rank passes an " + what + " list");
  }
}

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

}  // namespace ddl
