// What the glue does around a collective on device tensors: the op starts once the caller's
// current stream has produced its inputs (the host does not wait for that), and its results are
// final on the device when its Work completes. wait() blocks the host until then, as gloo's
// does; NCCL's "the stream waits, not the host" is not offered: UCX's CUDA transports enqueue
// their copies on streams that wait for the legacy default stream, so a device-side wait queued
// there (or on any stream the legacy one then waits for) would hold up the op it waits for.
// Implemented for CUDA in cuda/cuda_streams.cpp, compiled only when torch has CUDA and nvcc is
// found; no_device_streams.cpp stands in otherwise.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <vector>

namespace ddl {

// One device op's completion.
class DeviceCompletion {
 public:
  virtual ~DeviceCompletion() = default;
  // Runs `finish` (copies into the caller's tensors once the op's results are final) on a
  // stream of ddl's own and waits for it. Call once, from any thread.
  virtual void finishOnHost(const std::function<void()>& finish) = 0;
};

class DeviceStreams {
 public:
  virtual ~DeviceStreams() = default;
  // For an op on `device` about to be submitted: refuses what cannot be ordered (a stream being
  // captured into a CUDA graph) with an error naming `where`; sets `*deferStart` to start the
  // op when the caller's current stream reaches this point; returns the op's completion.
  virtual std::shared_ptr<DeviceCompletion> order(
      const at::Device& device, const char* where,
      std::function<void(std::function<void()>)>* deferStart) = 0;
  // A Future that completes with a list of tensors on `device` (DDP's comm hooks).
  virtual c10::intrusive_ptr<c10::ivalue::Future> future(const at::Device& device) = 0;
};

// The CUDA implementation; nullptr in a build without CUDA.
DeviceStreams* cudaStreams();

}  // namespace ddl
