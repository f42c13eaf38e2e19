// SharedBuffers::adopt: an ordinary block of glibc's malloc moved into shared memory in place,
// mapped by a "peer" through its key, forgotten when freed, private again in a forked child.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "../../csrc/core/group/engine.h"
#include "../../csrc/core/shm/shared_buffers.h"
#include "../../csrc/core/transport/loopback/loopback.h"
#include "adoption.h"

namespace ddl::test {
namespace {

void fillPattern(char* p, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<char>(i * 131 + 7);
}

size_t firstMismatch(const char* p, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != static_cast<char>(i * 131 + 7)) return i;
  }
  return bytes;
}

constexpr size_t kBytes = (3 << 20) + 12345;

TEST(Adopt, MovesABlockInPlaceKeepingItsBytes) {
  SharedBuffers buffers(nullptr);
  char* p = glibcBlock(kBytes);
  fillPattern(p, kBytes);
  const size_t before = memfdMappings();
  ASSERT_TRUE(buffers.adopt(p, kBytes));
  EXPECT_EQ(memfdMappings(), before + 1);
  EXPECT_EQ(firstMismatch(p, kBytes), kBytes);
  EXPECT_TRUE(buffers.adopt(p, kBytes));  // already: nothing more
  EXPECT_EQ(memfdMappings(), before + 1);
  EXPECT_EQ(buffers.adopted(), 1u);

  // A view inside it is found; the key maps the same memory elsewhere, as a peer would.
  SharedBuffers::Found found;
  ASSERT_TRUE(buffers.find(p + 4096, 1000, &found));
  EXPECT_TRUE(found.adopted);
  size_t length = 0;
  std::string why;
  char* peer = SharedBuffers::mapAdopted(found.key, &length, &why);
  ASSERT_NE(peer, nullptr) << why;
  EXPECT_GE(length, kBytes);
  peer[found.offset] = 42;
  EXPECT_EQ(p[4096], 42);
  p[4097] = 43;
  EXPECT_EQ(peer[found.offset + 1], 43);
  SharedBuffers::unmapAdopted(peer, length);

  // Freed: glibc unmaps the block, the registry lets it go and reports it released.
  size_t seen = buffers.releasedSoFar();
  std::free(p);
  EXPECT_FALSE(buffers.find(p + 4096, 1000, &found));
  EXPECT_EQ(buffers.adopted(), 0u);
  EXPECT_EQ(memfdMappings(), before);
  std::vector<uint64_t> released = buffers.releasedSince(&seen, 10);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0], found.serial);
}

TEST(Adopt, MovesABlockPieceByPieceIntoOneMapping) {
  // Pieces of 1 MiB (and a last, shorter one): the bytes stay, and the block ends as one
  // mapping of one memfd that a peer maps whole.
  SharedBuffers buffers(nullptr);
  char* p = glibcBlock(kBytes);
  fillPattern(p, kBytes);
  const size_t before = memfdMappings();
  ASSERT_TRUE(buffers.adopt(p, kBytes, 1 << 20));
  EXPECT_EQ(memfdMappings(), before + 1);
  EXPECT_EQ(firstMismatch(p, kBytes), kBytes);
  SharedBuffers::Found found;
  ASSERT_TRUE(buffers.find(p, kBytes, &found));
  size_t length = 0;
  std::string why;
  char* peer = SharedBuffers::mapAdopted(found.key, &length, &why);
  ASSERT_NE(peer, nullptr) << why;
  EXPECT_EQ(firstMismatch(peer + found.offset, kBytes), kBytes);
  SharedBuffers::unmapAdopted(peer, length);
  std::free(p);
  EXPECT_FALSE(buffers.find(p, 1, &found));
  EXPECT_EQ(buffers.adopted(), 0u);
}

TEST(Adopt, FreedBlocksAreNoticedWhileReportingReleases) {
  SharedBuffers buffers(nullptr);
  char* a = glibcBlock(kBytes);
  char* b = glibcBlock(kBytes);
  ASSERT_TRUE(buffers.adopt(a, kBytes));
  ASSERT_TRUE(buffers.adopt(b, kBytes));
  size_t seen = buffers.releasedSoFar();
  std::free(a);
  std::free(b);
  EXPECT_EQ(buffers.releasedSince(&seen, 10).size(), 2u);
  EXPECT_EQ(buffers.adopted(), 0u);
}

TEST(Adopt, AWindowMappedWhereAFreedBlockLivedIsFound) {
  // The loopback's windows are heap memory: one of a freed block's size is mapped where the
  // block was (the hole it left), as a UCX window may be.
  LoopbackFabric fabric;
  Engine engine(fabric.join());
  SharedBuffers& buffers = *engine.sharedBuffers();
  char* block = glibcBlock(kBytes);
  ASSERT_TRUE(buffers.adopt(block, kBytes));
  std::free(block);
  void* window = buffers.allocate(kBytes);
  const char* w = static_cast<char*>(window);
  if (w + kBytes <= block || block + kBytes <= w) {
    buffers.release(window);
    GTEST_SKIP() << "the window was mapped elsewhere: " << window << ", the block was at "
                 << static_cast<void*>(block);
  }
  SharedBuffers::Found found;
  ASSERT_TRUE(buffers.find(window, kBytes, &found));
  EXPECT_FALSE(found.adopted);
  EXPECT_EQ(buffers.live(), 1u);
  buffers.release(window);
}

TEST(Adopt, LeavesAloneWhatIsNotABlockOfItsOwn) {
  SharedBuffers buffers(nullptr);
  const size_t before = memfdMappings();
  // A small block from the heap, an interior pointer of a large block, the stack, a plain
  // mmap without glibc's header, a file mapping.
  char* small = static_cast<char*>(std::malloc(4096));
  char* large = glibcBlock(kBytes);
  char onStack[8192];
  void* anonymous =
      mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anonymous, MAP_FAILED);
  fillPattern(large, kBytes);
  EXPECT_FALSE(buffers.adopt(small, 4096));
  EXPECT_FALSE(buffers.adopt(large + 64, kBytes - 64));
  EXPECT_FALSE(buffers.adopt(onStack + 64, 4096));
  EXPECT_FALSE(buffers.adopt(static_cast<char*>(anonymous) + 64, 4096));
  EXPECT_FALSE(buffers.adopt(large, kBytes + (1 << 20)));  // longer than the block
  EXPECT_FALSE(buffers.adopt(large, 0));
  EXPECT_EQ(memfdMappings(), before);
  EXPECT_EQ(firstMismatch(large, kBytes), kBytes);
  munmap(anonymous, kBytes);
  std::free(large);
  std::free(small);
}

TEST(Adopt, KeysFromElsewhereDoNotMap) {
  SharedBuffers buffers(nullptr);
  char* p = glibcBlock(kBytes);
  ASSERT_TRUE(buffers.adopt(p, kBytes));
  SharedBuffers::Found found;
  ASSERT_TRUE(buffers.find(p, kBytes, &found));
  size_t length = 0;
  std::string why;
  std::string otherMachine = found.key;
  otherMachine[8] ^= 1;  // the boot id
  EXPECT_EQ(SharedBuffers::mapAdopted(otherMachine, &length, &why), nullptr);
  EXPECT_NE(why.find("another machine"), std::string::npos) << why;
  std::string otherFile = found.key;
  otherFile[otherFile.size() - 16] ^= 1;  // the inode
  EXPECT_EQ(SharedBuffers::mapAdopted(otherFile, &length, &why), nullptr);
  EXPECT_NE(why.find("is not its buffer"), std::string::npos) << why;
  EXPECT_EQ(SharedBuffers::mapAdopted("short", &length, &why), nullptr);
  std::free(p);
}

TEST(Adopt, AForkedChildGetsAPrivateCopy) {
  SharedBuffers buffers(nullptr);
  char* p = glibcBlock(kBytes);
  fillPattern(p, kBytes);
  ASSERT_TRUE(buffers.adopt(p, kBytes));
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The same bytes, no longer shared with the parent: writes stay here.
    int status = firstMismatch(p, kBytes) == kBytes && memfdMappings() == 0 ? 0 : 1;
    std::memset(p, 0, kBytes);
    _exit(status);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child saw other bytes";
  EXPECT_EQ(firstMismatch(p, kBytes), kBytes);
  std::free(p);
}

}  // namespace
}  // namespace ddl::test
