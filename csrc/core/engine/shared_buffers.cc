#include "shared_buffers.h"

#include <algorithm>

#include "../types.h"
#include "engine.h"

namespace ddl {

void* SharedBuffers::allocate(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  Engine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    engine = engine_;
  }
  if (engine == nullptr) throw Error("ddl: shared buffer requested after the engine shut down");
  void* base = nullptr;
  std::string key;
  uint64_t window = 0;
  engine->call([&] { window = engine->transport().allocateWindow(bytes, &base, &key); });
  if (window == 0) {
    throw Error("ddl: cannot allocate a shared buffer of " + std::to_string(bytes) + " bytes (" +
                engine->transportName() + " offers no shared memory: see UCX_TLS)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.emplace(reinterpret_cast<uintptr_t>(base),
                   Buffer{bytes, window, nextSerial_++, std::move(key)});
  return base;
}

void SharedBuffers::release(void* base) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.find(reinterpret_cast<uintptr_t>(base));
  if (it == buffers_.end()) return;
  uint64_t window = it->second.window;
  released_.push_back(it->second.serial);
  buffers_.erase(it);
  Engine* e = engine_;
  if (e != nullptr) Engine::postIfAlive(e, [e, window] { e->transport().releaseWindow(window); });
}

bool SharedBuffers::find(const void* data, size_t bytes, Found* found) const {
  const auto at = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.upper_bound(at);
  if (it == buffers_.begin()) return false;
  --it;
  const size_t offset = at - it->first;
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) return false;
  found->serial = it->second.serial;
  found->offset = offset;
  found->key = it->second.key;
  return true;
}

std::vector<uint64_t> SharedBuffers::releasedSince(size_t* seen, size_t limit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t from = std::min(*seen, released_.size());
  const size_t to = std::min(released_.size(), from + limit);
  *seen = to;
  return std::vector<uint64_t>(released_.begin() + from, released_.begin() + to);
}

size_t SharedBuffers::releasedSoFar() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return released_.size();
}

size_t SharedBuffers::live() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffers_.size();
}

void SharedBuffers::detach() {
  std::lock_guard<std::mutex> lock(mutex_);
  engine_ = nullptr;
}

}  // namespace ddl
