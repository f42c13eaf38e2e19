#pragma once

#include <ATen/ATen.h>

#include <mutex>
#include <unordered_map>

#include "../core/group/communicator.h"

namespace ddl {

// Which allreduce tensors' blocks may be adopted into shared memory (SharedBuffers::adopt), of the
// sizes the group offers for adoption (AllreducePlan::offersAdoption): those
// of storages allreduced before, and only when the tensor is its whole storage. The block is
// copied while it moves; the op owns the tensor it reduces, but not the rest of a storage that a
// view leaves out, which other threads may be writing then (a gradient buffer whose next bucket
// backward still fills): such a write would be lost, so a view is never adopted. A storage is
// remembered by weak reference, so that a new storage at a recycled address is never taken for one
// seen before; each is offered for adoption once.
class ReuseTracker {
 public:
  static ReuseTracker& instance() {
    static auto* tracker = new ReuseTracker();  // never destroyed: may outlive interpreter exit
    return *tracker;
  }
  Adoptable adoptable(const at::Tensor& tensor) {
    const c10::Storage& storage = tensor.storage();
    void* base = const_cast<void*>(storage.data());
    if (tensor.data_ptr() != base || tensor.nbytes() != storage.nbytes()) return {};
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = seen_.find(impl);
    if (it != seen_.end()) {
      c10::intrusive_ptr<c10::StorageImpl> alive = it->second.storage.lock();
      if (alive.get() == impl && it->second.base == base) {
        if (it->second.offered) return {};
        it->second.offered = true;
        return Adoptable{base, storage.nbytes()};
      }
      seen_.erase(it);
    }
    if (seen_.size() >= kCapacity) {
      std::erase_if(seen_, [](const auto& e) { return e.second.storage.expired(); });
      if (seen_.size() >= kCapacity) seen_.clear();
    }
    seen_.emplace(impl, Seen{storage.getWeakStorageImpl(), base, false});
    return {};
  }

 private:
  static constexpr size_t kCapacity = 1024;
  struct Seen {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    void* base;
    bool offered;
  };
  std::mutex mutex_;
  std::unordered_map<c10::StorageImpl*, Seen> seen_;
};

}  // namespace ddl
