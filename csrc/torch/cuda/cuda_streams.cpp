// CUDA streams around a ddl op (device_streams.hpp). A host function enqueued on the caller's
// current stream submits the op when the stream gets there, so the op reads what the kernels
// before it wrote, and the host never blocks for that.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <string>

#include "../../core/base/types.h"
#include "../device_streams.hpp"
#include "../errors.hpp"

namespace ddl {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    torch_errors::raise(Status(StatusKind::kOther, std::string("ddl: CUDA ") + what +
                                                       " failed: " + cudaGetErrorString(status)));
  }
}

class CudaCompletion : public DeviceCompletion {
 public:
  explicit CudaCompletion(at::Device device) : device_(device) {}

  void finishOnHost(const std::function<void()>& finish) override {
    c10::cuda::CUDAGuard guard(device_);
    // A stream of our own: the default stream may be busy with the caller's later work.
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device_.index());
    c10::cuda::CUDAStreamGuard streamGuard(stream);
    finish();
    stream.synchronize();
  }

 private:
  at::Device device_;
};

class CudaStreams : public DeviceStreams {
 public:
  std::shared_ptr<DeviceCompletion> order(
      const at::Device& device, const char* where,
      std::function<void(std::function<void()>)>* deferStart) override {
    c10::cuda::CUDAGuard guard(device);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone) {
      torch_errors::raiseBadInput(
          std::string("ddl: ") + where +
          ": cannot be captured into a CUDA graph (ddl's collectives run on the host); run it "
          "outside torch.cuda.graph()");
    }
    *deferStart = [stream](std::function<void()> start) {
      auto* pending = new std::function<void()>(std::move(start));
      cudaError_t status = cudaLaunchHostFunc(
          stream,
          [](void* p) {
            auto* fn = static_cast<std::function<void()>*>(p);
            (*fn)();
            delete fn;
          },
          pending);
      if (status != cudaSuccess) {
        delete pending;
        throw Error(std::string("ddl: cudaLaunchHostFunc failed: ") + cudaGetErrorString(status));
      }
    };
    return std::make_shared<CudaCompletion>(device);
  }

  c10::intrusive_ptr<c10::ivalue::Future> future(const at::Device& device) override {
    return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                    std::vector<c10::Device>{device});
  }
};

}  // namespace

DeviceStreams* cudaStreams() {
  static CudaStreams streams;
  return &streams;
}

}  // namespace ddl
