// One-sided windows (group/window.h) over the loopback: puts and signals against what a
// send/recv of the same data delivers, through the transport's puts and through mapped shared
// memory; refusals before anything moves; a wait that times out names its peer.
#include "../../csrc/core/group/window.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "harness.h"

namespace ddl::test {
namespace {

using std::chrono::milliseconds;

// Memory for one rank's window: plain heap memory (reached through the transport's puts), or
// the host's shared buffers (mapped by the peers).
struct Memory {
  Memory(Communicator& comm, size_t bytes, bool shared) : buffers(comm.engine().sharedBuffers()) {
    if (shared) {
      data = static_cast<float*>(buffers->allocate(bytes));
    } else {
      heap.resize(bytes / sizeof(float));
      data = heap.data();
    }
    isShared = shared;
  }
  ~Memory() {
    if (isShared) buffers->release(data);
  }
  std::shared_ptr<SharedBuffers> buffers;
  std::vector<float> heap;
  float* data = nullptr;
  bool isShared = false;
};

WindowMemory describe(void* data, size_t count) {
  WindowMemory m;
  m.data = data;
  m.bytes = count * sizeof(float);
  m.layout = "float32 [" + std::to_string(count) + "]";
  return m;
}

// Each rank puts its block into every other rank's window at the block's place, signals, and
// waits for every peer's signal: each window then holds what an allgather of the blocks would.
// The same blocks sent with send/recv are the reference.
void putsMatchSendRecv(int size, bool shared, size_t block) {
  runRanks(size, [&](Communicator& comm) {
    const int me = comm.rank();
    const size_t n = block * static_cast<size_t>(size);
    Memory target(comm, n * sizeof(float), shared);
    std::fill(target.data, target.data + n, -1.0f);
    std::vector<float> mine(block);
    for (size_t i = 0; i < block; ++i) mine[i] = static_cast<float>(me * 1000 + i) + 0.5f;
    std::memcpy(target.data + me * block, mine.data(), block * sizeof(float));

    std::shared_ptr<Window> window = Window::create(comm);
    window->attach(describe(target.data, n));
    for (int p = 0; p < size; ++p) {
      if (p == me) continue;
      EXPECT_EQ(window->route(p), shared ? "mapped" : "put");
      check(window->put(mine.data(), block * sizeof(float), p, me * block * sizeof(float)));
      check(window->signal(p));
    }
    for (int p = 0; p < size; ++p) {
      if (p != me) check(window->waitSignal(p));
    }
    // The reference: the same blocks through send/recv.
    std::vector<float> reference(n, -1.0f);
    std::memcpy(reference.data() + me * block, mine.data(), block * sizeof(float));
    std::vector<std::shared_ptr<Work>> works;
    for (int p = 0; p < size; ++p) {
      if (p == me) continue;
      works.push_back(comm.send(mine.data(), block * sizeof(float), p, 7));
      works.push_back(comm.recv(reference.data() + p * block, block * sizeof(float), p, 7));
    }
    for (auto& w : works) check(w);
    EXPECT_EQ(0, std::memcmp(reference.data(), target.data, n * sizeof(float)));
    window->detach();
    EXPECT_FALSE(window->attached());
  });
}

TEST(Window, PutsAndSignalsMatchSendRecvThroughTheTransport) {
  for (int size : {2, 3, 4}) putsMatchSendRecv(size, false, 1031);
}

TEST(Window, PutsAndSignalsMatchSendRecvThroughMappedMemory) {
  for (int size : {2, 3, 4}) putsMatchSendRecv(size, true, 1031);
}

TEST(Window, SignalsQueueAndEachWaitTakesOne) {
  runRanks(2, [](Communicator& comm) {
    std::vector<float> data(16, 0.0f);
    std::shared_ptr<Window> window = Window::create(comm);
    window->attach(describe(data.data(), data.size()));
    const int peer = 1 - comm.rank();
    if (comm.rank() == 0) {
      // Three rounds: each put lands before the signal that follows it is seen.
      for (int round = 1; round <= 3; ++round) {
        std::vector<float> value(16, static_cast<float>(round));
        check(window->put(value.data(), value.size() * sizeof(float), peer, 0));
        check(window->signal(peer));
        check(window->waitSignal(peer));  // rank 1 has read it
      }
    } else {
      for (int round = 1; round <= 3; ++round) {
        check(window->waitSignal(peer));
        EXPECT_EQ(data[0], static_cast<float>(round));
        EXPECT_EQ(data[15], static_cast<float>(round));
        check(window->signal(peer));
      }
    }
    window->detach();
  });
}

TEST(Window, DifferentLayoutsAreRefusedOnEveryRank) {
  std::atomic<int> refused{0};
  runRanks(3, [&](Communicator& comm) {
    std::vector<float> data(8 + (comm.rank() == 2 ? 1 : 0));
    std::shared_ptr<Window> window = Window::create(comm);
    try {
      window->attach(describe(data.data(), data.size()));
      ADD_FAILURE() << "rank " << comm.rank() << " registered";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 float32 [9]"), std::string::npos) << e.what();
      EXPECT_EQ(e.kind(), StatusKind::kInvalidArgument);
      ++refused;
    }
    EXPECT_FALSE(window->attached());
    // The group goes on: the window registers once the layouts agree.
    std::vector<float> same(8);
    window->attach(describe(same.data(), same.size()));
    window->detach();
  });
  EXPECT_EQ(refused.load(), 3);
}

TEST(Window, ARankThatRefusesWhatItWasGivenMakesEveryRankThrow) {
  std::atomic<int> refused{0};
  runRanks(3, [&](Communicator& comm) {
    std::vector<float> data(8);
    std::shared_ptr<Window> window = Window::create(comm);
    WindowMemory m = describe(data.data(), data.size());
    if (comm.rank() == 1) m.refusal = "the tensor is not contiguous";
    try {
      window->attach(m);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("refused; rank 1: the tensor is not contiguous"),
                std::string::npos)
          << e.what();
      ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 3);
}

TEST(Window, APeersSharedMemoryIsMappedAndOutlivesDetach) {
  runRanks(3, [](Communicator& comm) {
    const size_t n = 64;
    Memory target(comm, n * sizeof(float), true);
    std::fill(target.data, target.data + n, static_cast<float>(comm.rank()));
    std::shared_ptr<Window> window = Window::create(comm);
    window->attach(describe(target.data, n));
    check(comm.barrier());
    std::vector<std::shared_ptr<char>> views;
    for (int p = 0; p < comm.size(); ++p) {
      std::string why;
      views.push_back(window->mapped(p, &why));
      ASSERT_TRUE(views.back()) << why;
      EXPECT_EQ(reinterpret_cast<float*>(views.back().get())[n - 1], static_cast<float>(p));
    }
    check(comm.barrier());
    window->detach();
    std::string why;
    EXPECT_FALSE(window->mapped(0, &why));
    EXPECT_NE(why.find("holds no tensor"), std::string::npos);
    // What was mapped stays readable while held.
    for (int p = 0; p < comm.size(); ++p) {
      EXPECT_EQ(reinterpret_cast<float*>(views[p].get())[0], static_cast<float>(p));
    }
    check(comm.barrier());  // every rank read before any frees its memory
  });
}

TEST(Window, PutsThatDoNotFitAreRefusedBeforeAnythingMoves) {
  runRanks(2, [](Communicator& comm) {
    std::vector<float> data(8, 3.0f);
    std::shared_ptr<Window> window = Window::create(comm);
    const int peer = 1 - comm.rank();
    std::vector<float> value(4, 9.0f);
    EXPECT_THROW(window->put(value.data(), 16, peer, 0), Error);  // nothing registered yet
    window->attach(describe(data.data(), data.size()));
    try {
      window->put(value.data(), 16, peer, 20);
      ADD_FAILURE() << "put past the end";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("16 bytes at byte 20 do not fit in the 32 bytes"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(window->put(value.data(), 16, 2, 0), Error);
    EXPECT_THROW(window->signal(comm.rank()), Error);
    window->detach();
    EXPECT_EQ(data, std::vector<float>(8, 3.0f));
  });
}

TEST(Window, AWaitForASignalThatNeverComesTimesOutNamingThePeer) {
  runRanks(2, [](Communicator& comm) {
    std::shared_ptr<Window> window = Window::create(comm);
    if (comm.rank() == 0) {
      CallOptions options;
      options.timeout = milliseconds(200);
      std::shared_ptr<Work> work = window->waitSignal(1, options);
      work->wait();
      ASSERT_TRUE(work->failed());
      EXPECT_EQ(work->status().kind, StatusKind::kTimeout);
      EXPECT_NE(work->error().find("waiting for a signal from rank 1"), std::string::npos)
          << work->error();
    }
    // A timed-out wait leaves the group usable (as a point-to-point receive does).
    check(comm.barrier());
  });
}

TEST(Window, ClosingTheGroupEndsAWaitInFlight) {
  runRanks(2, [](Communicator& comm) {
    std::shared_ptr<Window> window = Window::create(comm);
    check(comm.barrier());
    if (comm.rank() == 0) {
      std::shared_ptr<Work> work = window->waitSignal(1);
      comm.close("aborted: abort() was called on this group");
      ASSERT_TRUE(work->wait(milliseconds(5000)));
      EXPECT_EQ(work->status().kind, StatusKind::kClosed);
      EXPECT_NE(work->error().find("aborted"), std::string::npos) << work->error();
      // Later ops are refused at once.
      std::shared_ptr<Work> later = window->signal(1);
      ASSERT_TRUE(later->wait(milliseconds(5000)));
      EXPECT_TRUE(later->failed());
    }
  });
}

TEST(Window, WindowsOfOneGroupKeepTheirSignalsApart) {
  runRanks(2, [](Communicator& comm) {
    std::shared_ptr<Window> a = Window::create(comm);
    std::shared_ptr<Window> b = Window::create(comm);
    EXPECT_NE(a->id(), b->id());
    const int peer = 1 - comm.rank();
    if (comm.rank() == 0) {
      check(b->signal(peer));
      check(a->signal(peer));
    } else {
      // The signal on b does not satisfy a wait on a, whatever the order they arrive in.
      check(a->waitSignal(peer));
      check(b->waitSignal(peer));
    }
  });
}

}  // namespace
}  // namespace ddl::test
