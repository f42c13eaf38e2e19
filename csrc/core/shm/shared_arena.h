// Shared arena: memory for CPU tensors that the ranks of one host can map, served to torch as
// its CPU allocator (TORCH_DDL_SHARED_ALLOCATOR=1, csrc/torch/shared_allocator.cpp) for every
// allocation of at least TORCH_DDL_DIRECT_MIN_BYTES. An allreduce whose tensor comes from here
// on every rank takes the direct path (algorithms/allreduce_direct.cc) at its first call, as an
// empty_shared tensor does, with no adoption (shared_buffers.h) and no mapping per tensor.
//
// Blocks are carved, whole pages each, out of 64 MiB memfd segments mapped shared, best fit,
// and a freed block joins its free neighbours. A peer maps a segment once (SharedBuffers::
// mapAdopted, the segment's key) and reaches every block in it at its offset. Segments are kept
// for the life of the process, as a caching allocator keeps its memory, but not all their pages:
// a segment that has stayed wholly free for `giveBackAfter` (a second), while another wholly
// free one keeps its memory, gives its memory back to the system at the arena's next allocation
// or release (a hole punched in its memfd, which every mapping of it, the peers' too, sees at
// once; nothing lived there, and its pages come back zeroed as they are next touched). So a
// training step's tensors find their pages again at the next step, and after a peak the arena
// shrinks to what its live blocks need, in whole segments, and one free segment ready for the
// next; a segment a small live block holds keeps its pages. A request larger than a segment, or
// one the
// system cannot back with a memfd, is not served here (the caller falls back on its own
// allocator); so are requests made by a forked child, whose segments became private copies of
// their used part at the fork, as fork() promises for private memory.
//
// Thread-safe: tensors are allocated and freed on any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace ddl {

class SharedArena {
 public:
  static constexpr size_t kSegmentBytes = 64 << 20;
  static constexpr size_t kPage = 4096;
  // Segments' serials (SharedBuffers::Found::serial) have this bit set, so that they never meet
  // a SharedBuffers serial.
  static constexpr uint64_t kSerialBit = uint64_t{1} << 63;

  // The process's arena (never destroyed: tensors may be freed during interpreter exit).
  static SharedArena& process();

  static constexpr std::chrono::milliseconds kGiveBackAfter{1000};
  explicit SharedArena(std::chrono::milliseconds giveBackAfter = kGiveBackAfter)
      : giveBackAfter_(giveBackAfter) {}
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  // A block of at least `bytes` (page-aligned), or nullptr where the arena does not serve it
  // (see above).
  void* allocate(size_t bytes);
  // Returns a block from allocate(); false (nothing done) when `p` is not one.
  bool release(void* p);

  struct Found {
    uint64_t serial = 0;
    size_t offset = 0;  // of the data in its segment
    std::string key;    // for SharedBuffers::mapAdopted
  };
  // The segment holding [data, data + bytes), if it is one of this process's shared segments.
  bool find(const void* data, size_t bytes, Found* found) const;

  struct Usage {
    size_t segments = 0;
    size_t segmentBytes = 0;
    size_t blocks = 0;      // allocated and not yet released
    size_t blockBytes = 0;  // their bytes, in whole pages
    size_t givenBack = 0;   // segments whose memory went back to the system (not used since)
  };
  Usage usage() const;

  // In a forked child: each segment's used part becomes private memory with the same bytes.
  // The fork handler of process() calls it; tests call it on an arena of their own.
  void privatizeAfterFork();

 private:
  struct Segment {
    uintptr_t base = 0;
    size_t length = 0;
    int fd = -1;
    uint64_t serial = 0;
    std::string key;
    size_t highWater = 0;  // bytes from the base handed out since the memory was given back
    std::map<size_t, size_t> freeRanges;                // offset -> length
    bool givenBack = false;                             // wholly free, its memory given back
    std::chrono::steady_clock::time_point freeSince{};  // wholly free since (else the epoch)
    bool wholeFree() const {
      return freeRanges.size() == 1 && freeRanges.begin()->second == length;
    }
  };
  // Under mutex_: gives back the memory of the wholly free segments that stayed so for
  // giveBackAfter_, all but the one freed last of those that keep their memory.
  void giveBackSpares();
  const std::chrono::milliseconds giveBackAfter_;
  size_t keptFree_ = 0;  // wholly free segments that keep their memory
  // Under mutex_: a new segment (its index), or -1.
  int addSegment();
  void addFree(size_t segment, size_t offset, size_t length);
  void removeFree(size_t segment, size_t offset, size_t length);

  mutable std::mutex mutex_;
  bool forked_ = false;
  std::vector<Segment> segments_;
  std::map<uintptr_t, size_t> segmentAt_;                    // base -> index
  std::multimap<size_t, std::pair<size_t, size_t>> bySize_;  // length -> (segment, offset)
  struct Block {
    size_t segment;
    size_t length;
  };
  std::unordered_map<uintptr_t, Block> blocks_;
  size_t blockBytes_ = 0;

  // Under mutex_.
  void privatizeLocked();
  static void forkPrepare();
  static void forkParent();
  static void forkChild();
};

}  // namespace ddl
