// Shared buffers: memory that ddl allocates for tensors (torch_ddl.empty_shared) as transport
// windows (transport.h), so that peer processes on the same host can map it. An allreduce whose
// every rank passes memory from here moves no bytes through staging: each rank reduces its share
// of the tensor straight out of its peers' buffers and writes the result into all of them
// (allreduce_direct.cc).
//
// Adopted memory: adopt() moves an ordinary allocation into shared memory in place. When the
// block holding a tensor is a mapping of its own (glibc serves every large malloc with one
// mmap, and frees it with munmap), its pages are copied into a memfd that is mapped over the
// same addresses, a bounded piece at a time: the same bytes at the same address, from then on
// mappable by peers (they open /proc/<pid>/fd/<fd>). Only a block that nothing else writes
// while it moves may be adopted: the torch glue offers a tensor's block only when the tensor
// being allreduced is its whole storage. Whoever holds a pointer into the block keeps a valid one.
// The block leaves the registry when it is no longer mapped there (freed): found out on lookup. A
// forked child gets private copies of every adopted block (pthread_atfork), as fork() promises for
// private memory.
//
// Thread-safe: buffers are allocated and freed on any thread (tensors die where Python drops
// them); windows are allocated and released on the progress thread. A buffer freed after its
// engine has gone releases nothing (the transport released every window when it closed).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ddl {

class Runtime;

class SharedBuffers {
 public:
  explicit SharedBuffers(Runtime* runtime) : runtime_(runtime) {}
  SharedBuffers(const SharedBuffers&) = delete;
  SharedBuffers& operator=(const SharedBuffers&) = delete;

  // A buffer of `bytes` (at least one byte is allocated). Blocks while the progress thread
  // allocates; throws Error when the transport has no shared memory to offer.
  void* allocate(size_t bytes);
  // Frees a buffer from allocate(); its window is released on the progress thread.
  void release(void* base);
  // Moves the allocation at [base, base + bytes) into shared memory in place (see above): true
  // when it is now (or already was) in a shared buffer, false when it is not a block of its own
  // from glibc's malloc, or the system offers no memfd. Blocks until the bytes are copied, which
  // happens `step` bytes at a time: the move never holds more than that much memory twice.
  // The caller owns the whole block while it moves: a write another thread makes to it then may
  // be lost (so [base, base + bytes) must be the whole allocation, nothing another thread uses).
  static constexpr size_t kAdoptStep = 64 << 20;
  bool adopt(void* base, size_t bytes, size_t step = kAdoptStep);
  // Maps a peer's adopted buffer from its key; nullptr (and why) when it cannot, e.g. the peer
  // is on another host or in another PID namespace. Unmap with unmapAdopted().
  static char* mapAdopted(const std::string& key, size_t* length, std::string* why);
  // The key mapAdopted() takes for the memfd `fd` of this process (its whole length); "" when
  // fstat fails.
  static std::string memfdKey(int fd);
  static void unmapAdopted(char* base, size_t length);

  struct Found {
    uint64_t serial = 0;  // unique per buffer for the life of the process (never reused)
    size_t offset = 0;    // of the data in the buffer
    std::string key;      // for a peer's Transport::mapWindow, or mapAdopted() if adopted
    bool adopted = false;
  };
  // The buffer holding [data, data + bytes), if any: one of this registry's, or a segment of
  // the process's SharedArena (shared_arena.h; found.adopted, as its key is a memfd's).
  bool find(const void* data, size_t bytes, Found* found);
  // Serials of buffers released after the first `*seen` releases; advances `*seen` past at most
  // `limit` of them. Peers that mapped those buffers can let them go.
  std::vector<uint64_t> releasedSince(size_t* seen, size_t limit);
  // Buffers released so far (a new group starts its releasedSince() here).
  size_t releasedSoFar() const;
  // Buffers allocated and not yet released; of them adopted ones.
  size_t live() const;
  size_t adopted() const;

  // The runtime is going away; later releases only forget the buffer.
  void detach();

 private:
  struct Buffer {
    size_t bytes;
    uint64_t window;  // 0: adopted
    uint64_t serial;
    std::string key;
    int fd = -1;       // adopted: the memfd,
    pid_t owner = 0;   // opened by this process (not a forked child),
    std::string name;  // and what /proc/self/map_files shows while it is mapped
  };
  // Whether an adopted buffer is still mapped at `base`; when not, it is dropped. Under mutex_.
  bool stillMapped(std::map<uintptr_t, Buffer>::iterator it);
  mutable std::mutex mutex_;
  Runtime* runtime_;
  std::map<uintptr_t, Buffer> buffers_;  // by base address
  std::vector<uint64_t> released_;
  uint64_t nextSerial_ = 1;
  uintptr_t pruneCursor_ = 0;
};

}  // namespace ddl
