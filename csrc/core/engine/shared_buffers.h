// Shared buffers: memory that ddl allocates for tensors (torch_ddl.empty_shared) as transport
// windows (transport.h), so that peer processes on the same host can map it. An allreduce whose
// every rank passes memory from here moves no bytes through staging: each rank reduces its share
// of the tensor straight out of its peers' buffers and writes the result into all of them
// (allreduce_direct.cc).
//
// Thread-safe: buffers are allocated and freed on any thread (tensors die where Python drops
// them); windows are allocated and released on the progress thread. A buffer freed after its
// engine has gone releases nothing (the transport released every window when it closed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ddl {

class Engine;

class SharedBuffers {
 public:
  explicit SharedBuffers(Engine* engine) : engine_(engine) {}
  SharedBuffers(const SharedBuffers&) = delete;
  SharedBuffers& operator=(const SharedBuffers&) = delete;

  // A buffer of `bytes` (at least one byte is allocated). Blocks while the progress thread
  // allocates; throws Error when the transport has no shared memory to offer.
  void* allocate(size_t bytes);
  // Frees a buffer from allocate(); its window is released on the progress thread.
  void release(void* base);

  struct Found {
    uint64_t serial = 0;  // unique per buffer for the life of the process (never reused)
    size_t offset = 0;    // of the data in the buffer
    std::string key;      // the window's key, for a peer's Transport::mapWindow
  };
  // The buffer holding [data, data + bytes), if any.
  bool find(const void* data, size_t bytes, Found* found) const;
  // Serials of buffers released after the first `*seen` releases; advances `*seen` past at most
  // `limit` of them. Peers that mapped those buffers can let them go.
  std::vector<uint64_t> releasedSince(size_t* seen, size_t limit) const;
  // Buffers released so far (a new group starts its releasedSince() here).
  size_t releasedSoFar() const;
  // Buffers allocated and not yet released.
  size_t live() const;

  // Engine side: the engine is going away; later releases only forget the buffer.
  void detach();

 private:
  struct Buffer {
    size_t bytes;
    uint64_t window;
    uint64_t serial;
    std::string key;
  };
  mutable std::mutex mutex_;
  Engine* engine_;
  std::map<uintptr_t, Buffer> buffers_;  // by base address
  std::vector<uint64_t> released_;
  uint64_t nextSerial_ = 1;
};

}  // namespace ddl
