#include "shared_arena.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "shared_buffers.h"

namespace ddl {

SharedArena& SharedArena::process() {
  static SharedArena* arena = [] {
    auto* a = new SharedArena();
    pthread_atfork(forkPrepare, forkParent, forkChild);
    return a;
  }();
  return *arena;
}

void SharedArena::forkPrepare() { process().mutex_.lock(); }
void SharedArena::forkParent() { process().mutex_.unlock(); }
void SharedArena::forkChild() {
  SharedArena& arena = process();
  arena.privatizeLocked();
  arena.mutex_.unlock();
}

SharedArena::~SharedArena() {
  for (const Segment& s : segments_) {
    munmap(reinterpret_cast<void*>(s.base), s.length);
    if (s.fd >= 0) close(s.fd);
  }
}

int SharedArena::addSegment() {
  const size_t index = segments_.size();
  const std::string name =
      "torch_ddl.arena." + std::to_string(getpid()) + "." + std::to_string(index);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return -1;
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(kSegmentBytes)) == 0) {
    base = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  std::string key = base == MAP_FAILED ? std::string() : SharedBuffers::memfdKey(fd);
  if (key.empty()) {
    if (base != MAP_FAILED) munmap(base, kSegmentBytes);
    close(fd);
    return -1;
  }
  Segment s;
  s.base = reinterpret_cast<uintptr_t>(base);
  s.length = kSegmentBytes;
  s.fd = fd;
  s.serial = kSerialBit | index;
  s.key = std::move(key);
  segments_.push_back(std::move(s));
  segmentAt_[segments_.back().base] = index;
  addFree(index, 0, kSegmentBytes);
  segments_.back().freeSince = std::chrono::steady_clock::now();
  ++keptFree_;
  return static_cast<int>(index);
}

void SharedArena::addFree(size_t segment, size_t offset, size_t length) {
  segments_[segment].freeRanges[offset] = length;
  bySize_.emplace(length, std::make_pair(segment, offset));
}

void SharedArena::removeFree(size_t segment, size_t offset, size_t length) {
  segments_[segment].freeRanges.erase(offset);
  auto [first, last] = bySize_.equal_range(length);
  for (auto it = first; it != last; ++it) {
    if (it->second == std::make_pair(segment, offset)) {
      bySize_.erase(it);
      return;
    }
  }
}

void* SharedArena::allocate(size_t bytes) {
  if (bytes == 0 || bytes > kSegmentBytes) return nullptr;
  const size_t need = (bytes + kPage - 1) / kPage * kPage;
  std::lock_guard<std::mutex> lock(mutex_);
  if (forked_) return nullptr;
  giveBackSpares();
  auto best = bySize_.lower_bound(need);
  if (best == bySize_.end()) {
    if (addSegment() < 0) return nullptr;
    best = bySize_.lower_bound(need);
  }
  // Of free ranges as long (whole segments), one that kept its memory: a tensor allocated and
  // freed over and over then never waits for its pages.
  for (auto same = best; same != bySize_.end() && same->first == best->first; ++same) {
    if (!segments_[same->second.first].givenBack) {
      best = same;
      break;
    }
  }
  const size_t length = best->first;
  const auto [segment, offset] = best->second;
  removeFree(segment, offset, length);
  if (length > need) addFree(segment, offset + need, length - need);
  Segment& s = segments_[segment];
  if (length == s.length && !s.givenBack) --keptFree_;  // it was wholly free
  s.highWater = std::max(s.highWater, offset + need);
  s.givenBack = false;
  s.freeSince = {};
  const uintptr_t at = s.base + offset;
  blocks_.emplace(at, Block{segment, need});
  blockBytes_ += need;
  return reinterpret_cast<void*>(at);
}

bool SharedArena::release(void* p) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  if (it == blocks_.end()) return false;
  const size_t segment = it->second.segment;
  size_t offset = it->first - segments_[segment].base;
  size_t length = it->second.length;
  blockBytes_ -= length;
  blocks_.erase(it);
  // Joined with its free neighbours on either side.
  std::map<size_t, size_t>& free = segments_[segment].freeRanges;
  auto next = free.lower_bound(offset);
  if (next != free.end() && next->first == offset + length) {
    const size_t nextLength = next->second;
    removeFree(segment, offset + length, nextLength);
    length += nextLength;
  }
  auto after = free.lower_bound(offset);
  if (after != free.begin()) {
    auto before = std::prev(after);
    if (before->first + before->second == offset) {
      const size_t beforeOffset = before->first, beforeLength = before->second;
      removeFree(segment, beforeOffset, beforeLength);
      offset = beforeOffset;
      length += beforeLength;
    }
  }
  addFree(segment, offset, length);
  if (length == segments_[segment].length) {
    segments_[segment].freeSince = std::chrono::steady_clock::now();
    ++keptFree_;
  }
  giveBackSpares();
  return true;
}

void SharedArena::giveBackSpares() {
  if (keptFree_ < 2 || forked_) return;  // a child's segments are private memory already
  const auto now = std::chrono::steady_clock::now();
  size_t last = segments_.size();  // the one freed last of those keeping their memory
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    if (s.wholeFree() && !s.givenBack &&
        (last == segments_.size() || s.freeSince > segments_[last].freeSince)) {
      last = i;
    }
  }
  for (size_t i = 0; i < segments_.size(); ++i) {
    Segment& s = segments_[i];
    if (i == last || !s.wholeFree() || s.givenBack || now - s.freeSince < giveBackAfter_) {
      continue;
    }
    // Under the lock: no block can be carved from it meanwhile and lose its bytes.
    if (s.highWater > 0 && fallocate(s.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                     static_cast<off_t>(s.highWater)) != 0) {
      continue;  // kept (a kernel without holes in memfds)
    }
    s.highWater = 0;
    s.givenBack = true;
    --keptFree_;
  }
}

bool SharedArena::find(const void* data, size_t bytes, Found* found) const {
  const auto at = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  if (segmentAt_.empty() || forked_) return false;
  auto it = segmentAt_.upper_bound(at);
  if (it == segmentAt_.begin()) return false;
  --it;
  const Segment& s = segments_[it->second];
  const size_t offset = at - s.base;
  if (offset >= s.length || bytes > s.length - offset) return false;
  found->serial = s.serial;
  found->offset = offset;
  found->key = s.key;
  return true;
}

SharedArena::Usage SharedArena::usage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Usage u;
  u.segments = segments_.size();
  for (const Segment& s : segments_) u.segmentBytes += s.length;
  u.blocks = blocks_.size();
  u.blockBytes = blockBytes_;
  for (const Segment& s : segments_) u.givenBack += s.givenBack ? 1 : 0;
  return u;
}

void SharedArena::privatizeAfterFork() {
  std::lock_guard<std::mutex> lock(mutex_);
  privatizeLocked();
}

void SharedArena::privatizeLocked() {
  // The part ever handed out is copied into private memory mapped over it; the rest, which
  // holds no tensor's bytes, becomes fresh private memory (no copy of pages never touched).
  for (Segment& s : segments_) {
    void* base = reinterpret_cast<void*>(s.base);
    if (s.highWater > 0) {
      void* copy =
          mmap(nullptr, s.highWater, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (copy != MAP_FAILED) {
        std::memcpy(copy, base, s.highWater);
        if (mremap(copy, s.highWater, s.highWater, MREMAP_MAYMOVE | MREMAP_FIXED, base) ==
            MAP_FAILED) {
          munmap(copy, s.highWater);
        }
      }
    }
    if (s.highWater < s.length) {
      mmap(reinterpret_cast<char*>(base) + s.highWater, s.length - s.highWater,
           PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    }
    close(s.fd);
    s.fd = -1;
  }
  forked_ = true;
}

}  // namespace ddl
