// Every difference between the torch versions we build against (2.11 on GPU machines, 2.13 here,
// 2.14 and 2.15 in environments of their own) lives in this header, so the rest of the glue is
// written once.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <exception>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

// torch 2.14 (its headers define C10D_BACKEND_HAS_RECONFIGURE) makes the `_single` names of the
// single-tensor collectives canonical (all_gather_single, ...) and keeps the old ones
// (_allgather_base, ...) as aliases that forward to them: ddl overrides the canonical names of
// the torch built against (process_group_ddl.hpp).
#ifdef C10D_BACKEND_HAS_RECONFIGURE
#define DDL_TORCH_HAS_SINGLE_NAMES 1
#endif

// torch 2.14's fault-tolerance API (supportsReconfigure, get_reconfigure_handle, reconfigure)
// and abort hooks (registerAbortHook, unregisterAbortHook): overridden where the headers have
// them.
#ifdef C10D_BACKEND_HAS_RECONFIGURE
#define DDL_TORCH_HAS_RECONFIGURE 1
#endif
#ifdef C10D_BACKEND_HAS_HOOKS
#define DDL_TORCH_HAS_ABORT_HOOKS 1
#endif
// torch 2.14: Work::getTimeout.
#ifdef C10D_BACKEND_HAS_RECONFIGURE
#define DDL_TORCH_HAS_WORK_TIMEOUT 1
#endif
// torch 2.15 (no macro of its own): Backend::isInitialized, supportsAbortHooks, completion hooks
// (supportsCompletionHooks, register/unregisterCompletionHook, CompletionHookArgs),
// Work::getCompletionKey, and start/endTimeEstimate as virtuals of Backend (endTimeEstimate
// returns float microseconds).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
#define DDL_TORCH_HAS_COMPLETION_HOOKS 1
#include <torch/csrc/distributed/c10d/Hooks.hpp>
#endif

// torch 2.14: one-sided windows (Backend::supportsWindow, new_window, c10d::Window). Before,
// ddl's window is a class of its own with the same methods (torch_ddl.new_window).
#ifdef C10D_BACKEND_HAS_WINDOW
#define DDL_TORCH_HAS_WINDOW 1
#include <torch/csrc/distributed/c10d/Window.hpp>
#endif

namespace ddl::torch_compat {

static_assert(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11,
              "torch_ddl needs torch 2.11 or newer");

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

// What ddl's window derives from: c10d's interface where torch has one.
#ifdef DDL_TORCH_HAS_WINDOW
using WindowBase = c10d::Window;
#else
using WindowBase = torch::CustomClassHolder;
#endif

}  // namespace ddl::torch_compat
