// Window: one-sided communication over a group (c10d's Window, torch 2.14+). Every rank registers
// memory of its own (collectively: the same layout everywhere); any rank then writes into a
// peer's memory at an offset (put) with nothing posted on the peer, and tells it so with a signal
// that the peer waits for (waitSignal). A signal is seen after every put the sender made to that
// peer before it: a peer that returns from waitSignal reads what those puts wrote.
//
// How a put travels:
// - a peer on this host whose memory is shared (a torch_ddl.empty_shared tensor, or a block of its
//   own that was moved into shared memory in place: SharedBuffers) is mapped here, and a put is
//   one copy into the mapping, made by the caller;
// - any other peer is reached through the transport's puts (Transport::put: CMA or shared memory
//   within a host, TCP or RDMA across hosts), made on the progress thread; before a signal to it
//   the puts posted so far are flushed (they have landed when the signal leaves).
// A signal is an 8-byte message under the window's own tag (base/tag.h: kWindowPhase with the
// group's id as its step, the agreements' group id, the low 16 bits of the window's number),
// received by waitSignal as any message is: each signal is waited for once, and signals not yet
// waited for queue, in order (they count, as torch's signal pads do: a signal that comes after a
// wait timed out is taken by the next wait, which then returns after the put that signal
// covers). It carries the window's number: one of another window under the same tag is
// dropped.
//
// A window's number is agreed as it is made (the highest of the ranks' next numbers, from a
// counter of the process's that only grows): windows of one group never share one, and windows
// of two groups share no tag. Its id is the number and the group's id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "communicator.h"

namespace ddl {

// What a rank registers.
struct WindowMemory {
  void* data = nullptr;
  size_t bytes = 0;
  // How the caller describes it ("float32 [4, 8]"): every rank must register the same.
  std::string layout;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  // Host memory that is a block of its own, which may be moved into shared memory in place
  // (SharedBuffers::adopt) so that peers on this host can map it.
  Adoptable adoptable;
  // Why this rank cannot register what it was given (the caller's checks): every rank then
  // throws, naming it, instead of this rank alone.
  std::string refusal;
};

// What each rank tells the others as it registers (window.cc): its memory, how to reach it, and
// whether it could register at all. decodeWindowOffer is false unless the bytes are one whole
// offer.
struct WindowOffer {
  struct Header {
    uint64_t bytes;
    uint64_t offset;  // of the data in its shared buffer
    uint32_t layoutBytes;
    uint32_t shareBytes;   // the shared buffer's key (SharedBuffers::Found)
    uint32_t regionBytes;  // the region's key (Transport::registerRegion)
    uint32_t flags;
  };
  static constexpr uint32_t kAdopted = 1;      // the share key is for SharedBuffers::mapAdopted
  static constexpr uint32_t kHeldAlready = 2;  // this rank's window already holds memory
  static constexpr uint32_t kRefused = 4;      // this rank refused its memory (layout: why)
  Header header{};
  std::string layout, share, region;
};
std::string encodeWindowOffer(const WindowOffer& offer);
bool decodeWindowOffer(const char* data, size_t bytes, WindowOffer* offer);

class Window {
 public:
  // Collective over the ranks of `comm` (which it keeps alive). Throws when the agreement fails.
  static std::shared_ptr<Window> create(Communicator& comm);
  ~Window();  // lets go of what it maps and registers (on the progress thread)
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  // The same in steps, for a caller that turns the engine itself (the simulator's event loop,
  // where a blocking wait would never end): each start...() begins the window's collective and
  // returns at once; once its work is done, finish...() does the rest and throws what the
  // blocking form would. create, attach and detach are these steps, waited for.
  struct Creating {
    Communicator* comm = nullptr;
    std::shared_ptr<int64_t> number;  // this rank's next, then the agreed one
    std::shared_ptr<Work> work;
  };
  static Creating startCreate(Communicator& comm);
  static std::shared_ptr<Window> finishCreate(const Creating& creating);
  struct Attaching {
    WindowMemory given;
    uint64_t region = 0;  // this rank's registration, closed where the attach fails
    std::string offer;    // what this rank tells the others
    std::shared_ptr<VaryingBlocks> blocks;
    std::shared_ptr<Work> work;  // the offers' all_gather
  };
  std::unique_ptr<Attaching> startAttach(const WindowMemory& mine);
  void finishAttach(Attaching& attaching);
  struct Detaching {
    std::vector<int> remote;     // peers whose puts are flushed first
    std::shared_ptr<Work> work;  // the flush, then the barrier
    bool barrier = false;
    Status failure;  // the first
  };
  std::unique_ptr<Detaching> startDetach();
  // The work to wait for before the next step (null: none is left).
  static std::shared_ptr<Work> pending(const Detaching& detaching);
  // Once pending() is done: starts the barrier after the flush (false), or ends (true, having
  // let the memory go; throws when the flush or the barrier failed).
  bool stepDetach(Detaching& detaching);

  uint64_t id() const { return id_; }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  const Communicator& communicator() const { return *comm_; }

  // Collective: every rank registers `mine`. Throws on every rank, having kept nothing, when a
  // rank refused what it was given, a rank's layout differs from rank 0's (naming each such rank
  // and its layout), or the window already holds memory somewhere.
  void attach(const WindowMemory& mine);
  // Collective: waits for this rank's puts to land, then for every rank to get here (no peer
  // puts into this rank's memory after this returns), and lets the memory go. When either
  // fails, it throws and keeps the memory registered (a peer may still put into it): call it
  // again, or destroy the group.
  void detach();
  bool attached() const;

  // Writes `bytes` of `data` at byte `offset` of `peer`'s memory. Throws before anything moves
  // when the window holds no memory, or the bytes do not fit there.
  std::shared_ptr<Work> put(const void* data, size_t bytes, int peer, size_t offset,
                            CallOptions options = {});
  std::shared_ptr<Work> signal(int peer, CallOptions options = {});
  // Done once a signal from `peer` arrived (one per call).
  std::shared_ptr<Work> waitSignal(int peer, CallOptions options = {});

  // `peer`'s memory mapped into this process, or null with why it is not (on another host, or
  // not in shared memory). The mapping lives as long as what is returned, also after detach()
  // (what is written there then reaches nobody). For rank() it is the memory this rank
  // registered, which the caller owns (the torch glue hands out its tensor instead).
  std::shared_ptr<char> mapped(int peer, std::string* why) const;
  // The bytes `peer` registered.
  size_t bytesOf(int peer) const;
  // How `peer`'s puts travel from here: "mapped", "put" (the transport's), "self".
  std::string route(int peer) const;

 private:
  Window(std::shared_ptr<Communicator> comm, uint64_t number);
  // A peer's shared memory mapped here: the transport's mapping (Transport::mapWindow), or the
  // mapping of its adopted block; let go when the last holder lets go.
  struct Mapping {
    Runtime* runtime = nullptr;
    uint64_t window = 0;
    char* adoptedBase = nullptr;
    size_t length = 0;
    ~Mapping();
  };
  struct Peer {
    size_t bytes = 0;
    char* mapped = nullptr;  // its memory, mapped here
    std::shared_ptr<Mapping> mapping;
    uint64_t remote = 0;   // its region, opened for puts (Transport::openRegion)
    std::string unmapped;  // why it is not mapped
  };
  std::string where(const char* name) const;
  void checkPeer(const char* name, int peer) const;
  void unregister(uint64_t region);  // closes this rank's registration (0: none)
  void startBarrier(Detaching& detaching);
  // Maps or opens every peer's memory from their offers (progress thread).
  void reach(const std::vector<std::string>& offers);
  // Lets go of the peers' memory and this rank's registration (progress thread).
  void release();
  static void releaseOn(Runtime& runtime, std::vector<Peer> peers, uint64_t region);

  // A signal: the window's number.
  struct Token {
    uint64_t window = 0;
  };
  static Task signalTask(Op& op, int peer, uint32_t sequence, uint64_t slot, Token token,
                         bool flush);
  static Task waitSignalTask(Op& op, int peer, uint32_t sequence, uint64_t slot, Token expected);

  std::shared_ptr<Communicator> comm_;
  uint64_t number_;
  uint64_t id_;
  uint32_t signalSequence_;       // the tag's sequence field: the number's low bits
  uint64_t signalSlot_;           // kWindowPhase, the group's id as the step
  std::shared_ptr<Group> group_;  // the window's ops: this group's ranks, the window's tags
  // Puts into mapped memory copy under a shared lock: the memory is let go under the lock alone.
  mutable std::shared_mutex mutex_;
  bool attached_ = false;
  bool detaching_ = false;  // puts are refused: the ones posted before are being flushed
  WindowMemory mine_;
  uint64_t region_ = 0;  // this rank's registration (Transport::registerRegion)
  std::vector<Peer> peers_;
};

}  // namespace ddl
