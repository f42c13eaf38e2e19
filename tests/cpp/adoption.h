// For tests of SharedBuffers::adopt: ordinary glibc blocks that are mappings of their own, and
// the adopted memfds this process maps.
#pragma once

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace ddl::test {

// Mappings of adopted memfds in this process (its own blocks and the peers' it mapped).
inline size_t memfdMappings() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:torch_ddl.") != std::string::npos) ++n;
  }
  return n;
}

// A block of `bytes` that glibc mmapped for it, as torch's CPU allocator asks for one (64-byte
// alignment). Above M_MMAP_THRESHOLD glibc still serves a request from a free chunk or the
// arena's top when one is large enough (what earlier tests freed, which arena this thread
// has): those are held until glibc has to map a block of its own.
inline char* glibcBlock(size_t bytes) {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  std::vector<void*> held;
  char* block = nullptr;
  for (int attempt = 0; attempt < 64 && block == nullptr; ++attempt) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes) != 0) std::abort();
    size_t header = 0;  // the chunk's size field, right before the data: IS_MMAPPED is 2
    std::memcpy(&header, static_cast<char*>(p) - sizeof(size_t), sizeof(size_t));
    if ((header & 7) == 2) {
      block = static_cast<char*>(p);
    } else {
      held.push_back(p);
    }
  }
  for (void* p : held) std::free(p);
  if (block == nullptr) std::abort();
  return block;
}

}  // namespace ddl::test
