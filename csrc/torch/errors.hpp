// torch's error types, chosen in one place from a Status's kind (base/status.h):
//
//   kind                                  raised as                        getError()
//   invalid argument (this rank's call)   ValueError                       -
//   peer lost, partitioned                torch.distributed.DistNetworkError  COMM_ERROR
//   timeout                               torch.distributed.DistBackendError  TIMEOUT
//   mismatch, closed, other               torch.distributed.DistBackendError  COMM_ERROR
//
// A failure another rank reported (its words "rank N reports: ...") keeps that rank's kind, and
// getError() says REMOTE_ERROR for it unless it was a timeout. DistNetworkError and
// DistBackendError are both DistError (a RuntimeError), which is what code that catches either
// kind of failure catches.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "../core/base/status.h"
#include "../core/runtime/op.h"

namespace ddl::torch_errors {

// The exception for a failed op's Status (waited for, or seen by a Future).
inline std::exception_ptr exceptionFor(const Status& status) {
  try {
    switch (status.kind) {
      case StatusKind::kPeerLost:
      case StatusKind::kPartitioned:
        C10_THROW_ERROR(DistNetworkError, status.detail);
      default:
        C10_THROW_ERROR(DistBackendError, status.detail);
    }
  } catch (...) {
    return std::current_exception();
  }
}

[[noreturn]] inline void raise(const Status& status) {
  std::rethrow_exception(exceptionFor(status));
}

// A call this rank refused before anything moved.
[[noreturn]] inline void raiseBadInput(const std::string& words) {
  C10_THROW_ERROR(ValueError, words);
}

// getError(): the group's first failure.
inline c10d::ErrorType errorTypeOf(const GroupState::Failure& failure) {
  if (failure.status.ok()) return c10d::ErrorType::SUCCESS;
  if (failure.status.kind == StatusKind::kTimeout) return c10d::ErrorType::TIMEOUT;
  return failure.remote ? c10d::ErrorType::REMOTE_ERROR : c10d::ErrorType::COMM_ERROR;
}

}  // namespace ddl::torch_errors
