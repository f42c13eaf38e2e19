#include "shared_allocator.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "../core/base/config.h"
#include "../core/shm/shared_arena.h"

namespace ddl {
namespace {

void releaseShared(void* p) { SharedArena::process().release(p); }

class SharedCpuAllocator final : public c10::Allocator {
 public:
  SharedCpuAllocator(c10::Allocator* fallback, size_t minBytes)
      : fallback_(fallback), minBytes_(minBytes) {}

  c10::DataPtr allocate(size_t n) override {
    if (n >= minBytes_) {
      if (void* p = SharedArena::process().allocate(n)) {
        return {p, p, &releaseShared, c10::Device(c10::DeviceType::CPU)};
      }
    }
    return fallback_->allocate(n);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }

  size_t minBytes() const { return minBytes_; }

 private:
  c10::Allocator* fallback_;
  size_t minBytes_;
};

std::atomic<SharedCpuAllocator*> gInstalled{nullptr};

}  // namespace

bool installSharedAllocatorIfAsked() {
  static std::once_flag once;
  std::call_once(once, [] {
    const Config& c = config();
    if (!c.sharedAllocator) return;
    // Never freed: tensors it served may be freed during interpreter exit.
    auto* allocator = new SharedCpuAllocator(c10::GetCPUAllocator(),
                                             std::max(c.directMinBytes, SharedArena::kPage));
    c10::SetCPUAllocator(allocator, /*priority=*/1);
    gInstalled.store(allocator);
  });
  return gInstalled.load() != nullptr;
}

bool sharedAllocatorInstalled(size_t* minBytes) {
  SharedCpuAllocator* allocator = gInstalled.load();
  if (allocator != nullptr && minBytes != nullptr) *minBytes = allocator->minBytes();
  return allocator != nullptr;
}

}  // namespace ddl
