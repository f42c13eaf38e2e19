// SharedArena: blocks carved from shared segments, best fit, freed blocks joined; a segment
// found and mapped elsewhere through its key as a peer maps it; the memory of free segments but
// one given back; private again in a forked child.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../csrc/core/shm/shared_arena.h"
#include "../../csrc/core/shm/shared_buffers.h"

namespace ddl::test {
namespace {

TEST(Arena, ServesPagesFromOneSegmentAndReusesFreedOnes) {
  SharedArena arena;
  EXPECT_EQ(arena.allocate(0), nullptr);
  EXPECT_EQ(arena.allocate(SharedArena::kSegmentBytes + 1), nullptr);
  char* a = static_cast<char*>(arena.allocate(65536));
  char* b = static_cast<char*>(arena.allocate(1));
  char* c = static_cast<char*>(arena.allocate(4097));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % SharedArena::kPage, 0u);
  EXPECT_EQ(b, a + 65536);
  EXPECT_EQ(c, b + 4096);
  SharedArena::Usage u = arena.usage();
  EXPECT_EQ(u.segments, 1u);
  EXPECT_EQ(u.blocks, 3u);
  EXPECT_EQ(u.blockBytes, 65536u + 4096 + 8192);
  // b freed, then a: joined, so a block of both fits where they were.
  EXPECT_TRUE(arena.release(b));
  EXPECT_FALSE(arena.release(b));
  EXPECT_TRUE(arena.release(a));
  char* d = static_cast<char*>(arena.allocate(65536 + 4096));
  EXPECT_EQ(d, a);
  // Best fit: a page goes to the smallest free range that holds it.
  EXPECT_TRUE(arena.release(c));
  EXPECT_TRUE(arena.release(d));
  EXPECT_EQ(arena.usage().blocks, 0u);
  EXPECT_EQ(arena.usage().blockBytes, 0u);
  EXPECT_EQ(arena.allocate(SharedArena::kSegmentBytes), a);  // everything joined again
  EXPECT_EQ(arena.usage().segments, 1u);
  EXPECT_NE(arena.allocate(1), nullptr);  // a second segment
  EXPECT_EQ(arena.usage().segments, 2u);
}

TEST(Arena, RandomAllocationsNeverOverlapAndAllJoinAgain) {
  SharedArena arena;
  std::mt19937 rng(7);
  struct Live {
    char* p;
    size_t bytes;
    char fill;
  };
  std::vector<Live> live;
  for (int i = 0; i < 4000; ++i) {
    if (!live.empty() && rng() % 2 == 0) {
      const size_t k = rng() % live.size();
      const Live& l = live[k];
      for (size_t j = 0; j < l.bytes; j += 997) ASSERT_EQ(l.p[j], l.fill) << "block " << k;
      ASSERT_TRUE(arena.release(l.p));
      live.erase(live.begin() + static_cast<long>(k));
    } else {
      const size_t bytes = 1 + rng() % (3 << 20);
      char* p = static_cast<char*>(arena.allocate(bytes));
      ASSERT_NE(p, nullptr);
      const char fill = static_cast<char>(i);
      for (size_t j = 0; j < bytes; j += 997) p[j] = fill;
      live.push_back({p, bytes, fill});
    }
  }
  for (const Live& l : live) {
    for (size_t j = 0; j < l.bytes; j += 997) ASSERT_EQ(l.p[j], l.fill);
    ASSERT_TRUE(arena.release(l.p));
  }
  const size_t segments = arena.usage().segments;
  // Every segment is one free range again: a whole segment fits in each.
  for (size_t s = 0; s < segments; ++s)
    ASSERT_NE(arena.allocate(SharedArena::kSegmentBytes), nullptr);
  EXPECT_EQ(arena.usage().segments, segments);
}

TEST(Arena, APeerMapsASegmentThroughItsKey) {
  SharedArena arena;
  char* a = static_cast<char*>(arena.allocate(1 << 20));
  char* b = static_cast<char*>(arena.allocate(300000));
  ASSERT_NE(b, nullptr);
  SharedArena::Found found;
  EXPECT_FALSE(arena.find(&found, 4, &found));
  ASSERT_TRUE(arena.find(b + 8, 1000, &found));
  EXPECT_EQ(found.offset, static_cast<size_t>(b + 8 - a));
  EXPECT_NE(found.serial & SharedArena::kSerialBit, 0u);
  EXPECT_FALSE(arena.find(a, SharedArena::kSegmentBytes + 1, &found));
  size_t length = 0;
  std::string why;
  char* peer = SharedBuffers::mapAdopted(found.key, &length, &why);
  ASSERT_NE(peer, nullptr) << why;
  EXPECT_EQ(length, SharedArena::kSegmentBytes);
  b[8] = 42;
  EXPECT_EQ(peer[found.offset], 42);
  peer[found.offset + 1] = 43;
  EXPECT_EQ(b[9], 43);
  SharedBuffers::unmapAdopted(peer, length);
}

// Shared memory this process has mapped and touched (kB), from /proc/self/status.
long rssShmemKb() {
  FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "RssShmem: %ld kB", &kb) == 1) break;
  }
  if (f != nullptr) std::fclose(f);
  return kb;
}

// After a peak of three segments, all freed and left so: two go back to the system (a peer's
// mapping sees their pages gone, as zeros), one stays ready; a block fits first where memory
// was kept, and a block in a segment given back keeps it in use again. Segments freed and used
// again within the wait keep their memory.
TEST(Arena, FreeSegmentsButOneGiveTheirMemoryBack) {
  {
    SharedArena patient;  // the default wait: a second
    std::vector<void*> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(patient.allocate(SharedArena::kSegmentBytes));
    for (void* p : blocks) EXPECT_TRUE(patient.release(p));
    EXPECT_NE(patient.allocate(1), nullptr);
    EXPECT_EQ(patient.usage().givenBack, 0u);
  }
  SharedArena arena(std::chrono::milliseconds(0));
  constexpr size_t kSegment = SharedArena::kSegmentBytes;
  std::vector<char*> whole;
  for (int i = 0; i < 3; ++i) {
    whole.push_back(static_cast<char*>(arena.allocate(kSegment)));
    ASSERT_NE(whole.back(), nullptr);
    std::memset(whole.back(), 7, kSegment);
  }
  SharedArena::Found found;
  ASSERT_TRUE(arena.find(whole[0], kSegment, &found));
  size_t length = 0;
  std::string why;
  char* peer = SharedBuffers::mapAdopted(found.key, &length, &why);
  ASSERT_NE(peer, nullptr) << why;
  EXPECT_EQ(peer[kSegment - 1], 7);
  const long before = rssShmemKb();
  for (char* p : whole) EXPECT_TRUE(arena.release(p));
  SharedArena::Usage u = arena.usage();
  EXPECT_EQ(u.segments, 3u);
  EXPECT_EQ(u.givenBack, 2u);
  EXPECT_EQ(u.blocks, 0u);
  if (before >= 0) {  // the two segments' pages left this process (and the peer's mapping)
    EXPECT_LE(rssShmemKb(), before - 2 * static_cast<long>(kSegment / 1024) + 1024);
  }
  EXPECT_EQ(peer[0], 0);
  EXPECT_EQ(peer[kSegment - 1], 0);
  // The segment that kept its memory (the one freed last) serves first, then those given back,
  // in use again.
  EXPECT_EQ(arena.allocate(kSegment), whole[2]);
  char* again = static_cast<char*>(arena.allocate(kSegment));
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again, whole[2]);
  EXPECT_EQ(arena.usage().givenBack, 1u);
  EXPECT_EQ(again[4096], 0);  // fresh pages
  again[4096] = 9;
  EXPECT_TRUE(arena.release(again));  // whole[2] is in use: nothing else free keeps memory
  EXPECT_EQ(arena.usage().givenBack, 1u);
  SharedBuffers::unmapAdopted(peer, length);
}

TEST(Arena, AForkedChildWritesItsOwnCopy) {
  SharedArena arena;
  char* a = static_cast<char*>(arena.allocate(8192));
  ASSERT_NE(a, nullptr);
  std::memset(a, 5, 8192);
  int pipes[2];
  ASSERT_EQ(pipe(pipes), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    arena.privatizeAfterFork();
    SharedArena::Found found;
    const bool ok = a[100] == 5 && !arena.find(a, 8192, &found) && arena.allocate(4096) == nullptr;
    std::memset(a, 9, 8192);
    char done = ok ? 1 : 0;
    if (write(pipes[1], &done, 1) != 1) _exit(2);
    _exit(0);
  }
  char done = 0;
  ASSERT_EQ(read(pipes[0], &done, 1), 1);
  int status = 0;
  waitpid(child, &status, 0);
  close(pipes[0]);
  close(pipes[1]);
  EXPECT_EQ(done, 1) << "in the child: its bytes, not found as shared, no new block";
  EXPECT_EQ(a[100], 5) << "the child's writes reached the parent";
  EXPECT_TRUE(arena.release(a));
}

}  // namespace
}  // namespace ddl::test
