#include "memory.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "../reduce/reduce.h"

namespace ddl {
namespace {

class HostMemory : public Memory {
 public:
  MemoryKind kind() const override { return MemoryKind::kHost; }
  std::shared_ptr<char> allocate(size_t bytes) override {
    return std::shared_ptr<char>(new char[bytes > 0 ? bytes : 1], std::default_delete<char[]>());
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void reduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
              Operands order) override {
    if (order == Operands::kDstFirst) {
      reduceInto(type, op, dst, src, count);
    } else {
      reduceTo(type, op, dst, src, dst, count);
    }
  }
  void average(DataType type, void* buf, size_t count, size_t divisor) override {
    finishAverage(type, buf, count, divisor);
  }
};

constexpr int kKinds = 2;

struct Registry {
  std::mutex mutex;
  MemoryFactory factories[kKinds] = {};
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: device modules may register late
  return *r;
}

}  // namespace

const char* memoryKindName(MemoryKind kind) {
  return kind == MemoryKind::kHost ? "host memory" : "CUDA device memory";
}

void registerMemory(MemoryKind kind, MemoryFactory factory) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().factories[static_cast<int>(kind)] = factory;
}

bool memoryAvailable(MemoryKind kind) {
  if (kind == MemoryKind::kHost) return true;
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().factories[static_cast<int>(kind)] != nullptr;
}

Memory& memoryFor(MemoryKind kind, int device) {
  static HostMemory host;
  if (kind == MemoryKind::kHost) return host;
  MemoryFactory factory = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    factory = registry().factories[static_cast<int>(kind)];
  }
  if (factory == nullptr) {
    throw Error(std::string("ddl: this build of torch_ddl has no support for ") +
                memoryKindName(kind) + " (it was built without CUDA)");
  }
  return *factory(device);
}

}  // namespace ddl
