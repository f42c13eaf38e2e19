// Every difference between the torch versions we build against (2.11 on GPU machines, 2.13 here)
// lives in this header, so the rest of the glue is written once.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <exception>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace ddl::torch_compat {

static_assert(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11,
              "torch_ddl needs torch 2.11 or newer");

// The exception c10d raises for a failed collective (torch.distributed.DistBackendError).
inline std::exception_ptr backendError(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

// The root of a chain of PrefixStores: the store every group of the job shares.
inline c10::intrusive_ptr<c10d::Store> rootStore(c10::intrusive_ptr<c10d::Store> store) {
  while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get())) {
    store = prefixed->getUnderlyingStore();
  }
  return store;
}

// A Future that completes with a list of tensors (what DDP's comm hooks expect).
inline c10::intrusive_ptr<c10::ivalue::Future> tensorListFuture() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

// PREMUL_SUM's factor (a number or a one-element tensor). The supplement type was renamed
// PreMulSumSupplement after 2.11; the old name stays as an alias, so use it.
inline const c10d::NCCLPreMulSumSupplement* premulSupplement(const c10d::ReduceOp& op) {
  return dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
}

}  // namespace ddl::torch_compat
