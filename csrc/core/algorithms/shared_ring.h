// A group's shared-memory ring: each rank allocates an inbox window of `slots` slots of
// `slotBytes` (transport.h, shared windows) and maps the inbox of the next rank of the ring as its
// outbox. allreduce_shared.cc moves every byte through these windows in user space; messages
// carry only which slot holds what, and which slot is free again.
//
// Lifetime: created empty with the group; the first allreduce that wants it sets it up (status
// kReady, or kUnavailable when some rank cannot map its neighbour, e.g. another host). One op
// uses the windows at a time: ops take tickets in the order they start, which is the same on
// every rank, and wait for their turn. An op that fails while holding or awaiting a turn leaves
// the ring kBroken: later allreduces on the group fail at once with the reason. The windows are
// released on the progress thread when the group is gone, and so are the peers' shared buffers
// that the direct allreduce mapped.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace ddl {

class Engine;

struct SharedRing {
  enum class Status { kUnknown, kReady, kUnavailable, kBroken };

  explicit SharedRing(Engine* e) : engine(e) {}
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;
  ~SharedRing();

  // The turn after `serving`, skipping tickets whose ops were abandoned.
  void advance();

  Engine* engine;
  Status status = Status::kUnknown;
  std::string broken;  // why, when kBroken
  uint64_t inboxWindow = 0;
  uint64_t outboxWindow = 0;
  char* inbox = nullptr;   // this rank's window: the previous rank writes, this rank reads
  char* outbox = nullptr;  // the next rank's inbox, mapped here
  size_t slotBytes = 0;
  size_t slots = 0;
  uint64_t tickets = 0;  // handed out so far
  uint64_t serving = 0;  // the ticket whose op may use the windows
  std::set<uint64_t> abandoned;

  // Peers' shared buffers mapped by the direct allreduce (allreduce_direct.cc), by (group rank,
  // serial), and how far this group has reported this process's released buffers.
  struct Mapped {
    uint64_t window;  // 0: an adopted buffer, mapped with SharedBuffers::mapAdopted
    char* base;
    size_t length;
  };
  std::map<std::pair<int, uint64_t>, Mapped> peerBuffers;
  size_t releasedSeen = 0;
  // Buffers of this rank that every peer has mapped (offers of others ask for a check).
  std::set<uint64_t> offered;
  // Whether the last round of offers found every tensor in a shared buffer (the same on every
  // rank: all see all offers, and rounds happen in turn order).
  bool lastAllShared = true;
};

}  // namespace ddl
