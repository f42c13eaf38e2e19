// The CUDA memory kind (memory/memory.h): scratch from a cache of device allocations, copies and
// kernels on a non-blocking stream of ddl's own, each synchronised before returning. Registered
// when the library loads.
//
// Scratch is never handed back to the driver while ddl runs: cudaFree waits for the whole
// device, which would tie the progress thread to every stream of the process.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "../core/memory/memory.h"
#include "kernels.h"

namespace ddl::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string("ddl: CUDA ") + what + " failed: " + cudaGetErrorString(status));
  }
}

class CudaMemory : public Memory {
 public:
  explicit CudaMemory(int device) : device_(device) {}

  MemoryKind kind() const override { return MemoryKind::kCuda; }
  void activate() override { select(); }

  std::shared_ptr<char> allocate(size_t bytes) override {
    bytes = (std::max<size_t>(bytes, 1) + kRound - 1) / kRound * kRound;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= 2 * bytes) {
        bytes = it->first;
        p = it->second;
        free_.erase(it);
      }
    }
    if (p == nullptr) {
      select();
      check(cudaMalloc(&p, bytes), "cudaMalloc of scratch");
    }
    return std::shared_ptr<char>(static_cast<char*>(p), [this, bytes](char* q) {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.emplace(bytes, q);
    });
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    cudaStream_t s = stream();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "copy");
    check(cudaStreamSynchronize(s), "copy");
  }

  void reduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
              Operands order) override {
    if (count == 0) return;
    cudaStream_t s = stream();
    check(launchReduce(type, op, dst, src, count, order, s), "reduction kernel launch");
    check(cudaStreamSynchronize(s), "reduction kernel");
  }

  void average(DataType type, void* buf, size_t count, size_t divisor) override {
    if (count == 0 || divisor <= 1) return;
    cudaStream_t s = stream();
    check(launchAverage(type, buf, count, divisor, s), "average kernel launch");
    check(cudaStreamSynchronize(s), "average kernel");
  }

 private:
  static constexpr size_t kRound = 64 << 10;

  void select() { check(cudaSetDevice(device_), "cudaSetDevice"); }

  cudaStream_t stream() {
    select();
    std::call_once(streamOnce_, [this] {
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    });
    return stream_;
  }

  int device_;
  std::once_flag streamOnce_;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;  // cached scratch by size
};

constexpr int kMaxDevices = 64;

Memory* cudaMemory(int device) {
  static std::mutex mutex;
  static CudaMemory* memories[kMaxDevices] = {};  // never destroyed: see the note above
  if (device < 0 || device >= kMaxDevices) {
    throw Error("ddl: CUDA device " + std::to_string(device) + " is out of range");
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (memories[device] == nullptr) memories[device] = new CudaMemory(device);
  return memories[device];
}

const bool registered = [] {
  registerMemory(MemoryKind::kCuda, &cudaMemory);
  return true;
}();

}  // namespace
}  // namespace ddl::cuda
