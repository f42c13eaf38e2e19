#include "shared_buffers.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "../base/types.h"
#include "../runtime/runtime.h"
#include "shared_arena.h"

namespace ddl {
namespace {

// A peer's handle on an adopted buffer: where to find the memfd and how to recognise it.
struct AdoptedKey {
  char magic[8];
  char bootId[40];  // the same machine (PIDs are per machine)
  int64_t pid;
  int32_t fd;
  int32_t reserved;
  uint64_t inode;  // the same file (an fd number can be reused)
  uint64_t length;
};
constexpr char kMagic[8] = {'d', 'd', 'l', 'm', 'e', 'm', 'f', 'd'};

const std::string& bootId() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  return id;
}

// What /proc/self/map_files says is mapped at exactly [base, base + length): the name of the
// file, or "" (anonymous memory, several mappings, nothing).
std::string mappedAt(uintptr_t base, size_t length) {
  char path[80];
  char target[256];
  std::snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx",
                static_cast<unsigned long>(base), static_cast<unsigned long>(base + length));
  ssize_t n = readlink(path, target, sizeof(target));
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}

// The mapping holding `at`, from /proc/self/maps, if it is private anonymous read-write memory.
bool anonymousMapping(uintptr_t at, uintptr_t* start, uintptr_t* end) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long begin = 0, finish = 0, offset = 0, inode = 0;
    char perms[8] = {};
    char device[32] = {};
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %31s %lu %n", &begin, &finish, perms, &offset,
                    device, &inode, &consumed) < 6) {
      continue;
    }
    if (at < begin || at >= finish) continue;
    *start = begin;
    *end = finish;
    return std::strcmp(perms, "rw-p") == 0 && inode == 0 &&
           line.find_first_not_of(' ', static_cast<size_t>(consumed)) == std::string::npos;
  }
  return false;
}

// Adopted blocks of this process, for the fork handler. Never freed: the handler runs until exit.
struct Block {
  uintptr_t base;
  size_t length;
  int fd;
  std::string name;  // what mappedAt() says while it is mapped
};
std::mutex gBlocksMutex;
std::vector<Block>* gBlocks = new std::vector<Block>();

// In a forked child: every adopted block still mapped becomes private memory with the same
// bytes, and the child lets go of the memfds.
void privatizeInChild() {
  for (const Block& b : *gBlocks) {
    if (mappedAt(b.base, b.length) == b.name) {
      void* copy =
          mmap(nullptr, b.length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (copy != MAP_FAILED) {
        std::memcpy(copy, reinterpret_cast<void*>(b.base), b.length);
        if (mremap(copy, b.length, b.length, MREMAP_MAYMOVE | MREMAP_FIXED,
                   reinterpret_cast<void*>(b.base)) == MAP_FAILED) {
          munmap(copy, b.length);
        }
      }
    }
    close(b.fd);
  }
  gBlocks->clear();
  gBlocksMutex.unlock();
}

void watchForks() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork([] { gBlocksMutex.lock(); }, [] { gBlocksMutex.unlock(); }, privatizeInChild);
  });
}

void forgetBlock(uintptr_t base) {
  std::lock_guard<std::mutex> lock(gBlocksMutex);
  std::erase_if(*gBlocks, [base](const Block& b) { return b.base == base; });
}

}  // namespace

void* SharedBuffers::allocate(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  Runtime* runtime = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    runtime = runtime_;
  }
  if (runtime == nullptr) throw Error("ddl: shared buffer requested after the engine shut down");
  void* base = nullptr;
  std::string key;
  uint64_t window = 0;
  runtime->call([&] { window = runtime->transport().allocateWindow(bytes, &base, &key); });
  if (window == 0) {
    throw Error("ddl: cannot allocate a shared buffer of " + std::to_string(bytes) + " bytes (" +
                runtime->transportName() + " offers no shared memory: see UCX_TLS)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // The window may be mapped where an adopted block lived that glibc has freed since (which
  // the registry learns on lookup): that entry goes first, or it would hide the window.
  const auto at = reinterpret_cast<uintptr_t>(base);
  std::vector<uintptr_t> overlapping;
  for (auto it = buffers_.lower_bound(at + bytes); it != buffers_.begin();) {
    --it;
    if (it->first + it->second.bytes <= at) break;
    overlapping.push_back(it->first);
  }
  for (uintptr_t stale : overlapping) stillMapped(buffers_.find(stale));
  buffers_.emplace(at, Buffer{bytes, window, nextSerial_++, std::move(key), -1, 0, {}});
  return base;
}

void SharedBuffers::release(void* base) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.find(reinterpret_cast<uintptr_t>(base));
  if (it == buffers_.end()) return;
  uint64_t window = it->second.window;
  released_.push_back(it->second.serial);
  buffers_.erase(it);
  Runtime* r = runtime_;
  if (r != nullptr) Runtime::postIfAlive(r, [r, window] { r->transport().releaseWindow(window); });
}

bool SharedBuffers::find(const void* data, size_t bytes, Found* found) {
  const auto at = reinterpret_cast<uintptr_t>(data);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = buffers_.upper_bound(at);
    if (it != buffers_.begin()) {
      --it;
      const size_t offset = at - it->first;
      if (offset <= it->second.bytes && bytes <= it->second.bytes - offset && stillMapped(it)) {
        found->serial = it->second.serial;
        found->offset = offset;
        found->key = it->second.key;
        found->adopted = it->second.window == 0;
        return true;
      }
    }
  }
  SharedArena::Found segment;
  if (!SharedArena::process().find(data, bytes, &segment)) return false;
  found->serial = segment.serial;
  found->offset = segment.offset;
  found->key = std::move(segment.key);
  found->adopted = true;
  return true;
}

bool SharedBuffers::stillMapped(std::map<uintptr_t, Buffer>::iterator it) {
  Buffer& b = it->second;
  if (b.window != 0) return true;
  if (mappedAt(it->first, b.bytes) == b.name) return true;
  // Freed (glibc unmapped the block): peers may let go of the memfd.
  if (b.owner == getpid()) close(b.fd);
  forgetBlock(it->first);
  released_.push_back(b.serial);
  buffers_.erase(it);
  return false;
}

namespace {

constexpr size_t kPage = 4096;

// The block glibc mapped for the allocation at `at` of `bytes`, if it is one: its page-aligned
// [*blockStart, *blockStart + *blockLength).
bool glibcBlock(uintptr_t at, size_t bytes, uintptr_t* blockStart, size_t* blockLength) {
  // A block of its own: glibc serves a large malloc with an mmap of its own (neighbouring
  // mappings may merge with it in /proc/self/maps, glibc's bookkeeping still names its bounds)
  // and heads it with a chunk header right before the data: the lead from the mapping's start
  // (prev_size) and the chunk's size with IS_MMAPPED and no other flag. The bounds must be
  // page-aligned, inside one private anonymous mapping, and fit the data closely.
  uintptr_t mapStart = 0, mapEnd = 0;
  if (bytes == 0 || !anonymousMapping(at, &mapStart, &mapEnd) ||
      at < mapStart + 2 * sizeof(size_t)) {
    return false;
  }
  size_t lead = 0, size = 0;
  std::memcpy(&lead, reinterpret_cast<void*>(at - 2 * sizeof(size_t)), sizeof(size_t));
  std::memcpy(&size, reinterpret_cast<void*>(at - sizeof(size_t)), sizeof(size_t));
  constexpr size_t kFlags = 7, kMmapped = 2;
  const uintptr_t chunk = at - 2 * sizeof(size_t);
  const uintptr_t start = chunk - lead;
  const size_t total = lead + (size & ~kFlags);
  if ((size & kFlags) != kMmapped || lead >= kPage || lead % 16 != 0 || start % kPage != 0 ||
      total % kPage != 0 || start < mapStart || total > mapEnd - start || bytes > total ||
      at + bytes > start + total || start + total - (at + bytes) > 2 * kPage) {
    return false;
  }
  *blockStart = start;
  *blockLength = total;
  return true;
}

// Moves [start, start + length) into the file `fd` in place, `step` bytes at a time.
bool moveIntoFile(int fd, uintptr_t start, size_t length, size_t step) {
  // Piece by piece, so that at most one piece is held twice: each piece of the memfd is filled
  // from the private pages and then mapped in their place in one step (the private pages are
  // freed there). If a piece fails, the pieces already moved stay file-backed with the same
  // bytes (the mapping keeps the file alive until glibc unmaps the block): not adopted, nothing
  // lost.
  step = std::max(kPage, step / kPage * kPage);
  for (size_t done = 0; done < length;) {
    const size_t n = std::min(step, length - done);
    void* piece = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                       static_cast<off_t>(done));
    if (piece == MAP_FAILED) return false;
    std::memcpy(piece, reinterpret_cast<void*>(start + done), n);
    if (mremap(piece, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(start + done)) ==
        MAP_FAILED) {
      munmap(piece, n);
      return false;
    }
    done += n;
  }
  // One mapping of the whole file over the pieces (the same pages, so the same bytes), for
  // /proc/self/map_files and for peers.
  if (mappedAt(start, length).empty() &&
      mmap(reinterpret_cast<void*>(start), length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
           fd, 0) == MAP_FAILED) {
    return false;
  }
  return true;
}

}  // namespace

bool SharedBuffers::adopt(void* data, size_t bytes, size_t step) {
  const auto at = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.upper_bound(at);
  if (it != buffers_.begin()) {
    --it;
    if (at - it->first <= it->second.bytes && bytes <= it->second.bytes - (at - it->first) &&
        stillMapped(it)) {
      return true;
    }
  }
  SharedArena::Found segment;
  if (SharedArena::process().find(data, bytes, &segment)) return true;
  uintptr_t start = 0;
  size_t length = 0;
  if (!glibcBlock(at, bytes, &start, &length)) return false;
  const uint64_t serial = nextSerial_++;
  const std::string memfdName =
      "torch_ddl." + std::to_string(getpid()) + "." + std::to_string(serial);
  int fd = memfd_create(memfdName.c_str(), MFD_CLOEXEC);
  if (fd < 0) return false;
  std::string key;
  if (ftruncate(fd, static_cast<off_t>(length)) != 0 || (key = memfdKey(fd)).empty() ||
      !moveIntoFile(fd, start, length, step)) {
    close(fd);
    return false;
  }
  const std::string name = mappedAt(start, length);
  buffers_.emplace(start, Buffer{length, 0, serial, std::move(key), fd, getpid(), name});
  watchForks();
  std::lock_guard<std::mutex> blocks(gBlocksMutex);
  gBlocks->push_back(Block{start, length, fd, name});
  return true;
}

std::string SharedBuffers::memfdKey(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return std::string();
  AdoptedKey key{};
  std::memcpy(key.magic, kMagic, sizeof(kMagic));
  std::snprintf(key.bootId, sizeof(key.bootId), "%s", bootId().c_str());
  key.pid = getpid();
  key.fd = fd;
  key.inode = st.st_ino;
  key.length = static_cast<uint64_t>(st.st_size);
  return std::string(reinterpret_cast<const char*>(&key), sizeof(key));
}

char* SharedBuffers::mapAdopted(const std::string& keyBytes, size_t* length, std::string* why) {
  AdoptedKey key{};
  if (keyBytes.size() != sizeof(key)) {
    *why = "malformed key";
    return nullptr;
  }
  std::memcpy(&key, keyBytes.data(), sizeof(key));
  key.bootId[sizeof(key.bootId) - 1] = '\0';
  if (std::memcmp(key.magic, kMagic, sizeof(kMagic)) != 0 || key.bootId != bootId()) {
    *why = "it is on another machine";
    return nullptr;
  }
  const std::string path = "/proc/" + std::to_string(key.pid) + "/fd/" + std::to_string(key.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot open " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_ino == key.inode &&
      static_cast<uint64_t>(st.st_size) == key.length) {
    // Not populated: this runs on the turning thread, and a large block's pages would take it
    // for long (its first reduction faults them in, letting the runtime turn meanwhile).
    base = mmap(nullptr, key.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) *why = std::string("mmap: ") + std::strerror(errno);
  } else {
    *why = path + " is not its buffer (another PID namespace?)";
  }
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  *length = key.length;
  return static_cast<char*>(base);
}

void SharedBuffers::unmapAdopted(char* base, size_t length) { munmap(base, length); }

std::vector<uint64_t> SharedBuffers::releasedSince(size_t* seen, size_t limit) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A few adopted buffers per call are checked for having been freed, round the registry.
  for (int checked = 0; checked < 4 && !buffers_.empty(); ++checked) {
    auto it = buffers_.upper_bound(pruneCursor_);
    if (it == buffers_.end()) it = buffers_.begin();
    pruneCursor_ = it->first;
    stillMapped(it);
  }
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

size_t SharedBuffers::adopted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(std::count_if(buffers_.begin(), buffers_.end(),
                                           [](const auto& b) { return b.second.window == 0; }));
}

void SharedBuffers::detach() {
  std::lock_guard<std::mutex> lock(mutex_);
  runtime_ = nullptr;
}

}  // namespace ddl
