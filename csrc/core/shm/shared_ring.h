// Shared-memory rings of a group. A ring of slot windows (SlotWindows): each member allocates an
// inbox window of `slots` slots of `slotBytes` (transport.h, shared windows) and maps the inbox of
// the next member as its outbox. A ring pipeline over a SlotLink (slot_link.h) moves every byte
// through these windows in user space; messages carry only which slot holds what, and which slot
// is free again. A group has one over all its ranks in rank order (the shared-memory ring of an
// allreduce on one host), and one per ring of the host level of its multi-dimensional plans
// (allreduce_multidim.cc), keyed by the plan.
//
// Lifetime: created empty with the group; the first allreduce that wants a ring sets it up
// (ready, or unavailable when some member cannot map its neighbour, e.g. on another host). One
// op uses the windows at a time: ops take tickets in the order they start, which is the same on
// every rank, and wait for their turn. An op that fails while holding or awaiting a turn leaves
// the group's rings kBroken: later allreduces that want them fail at once with the reason. But
// where the ranks called different things (a mismatch, which fails its op on every rank), the
// windows are mended instead: the next allreduce that wants them first holds a round over the
// ranks that share them (resyncAfterMismatch) once each has ended the failed op, in which they
// agree again on what is set up and on the staging count, before anything shared is touched. The
// windows are released on the progress thread when the group is gone, and so are the peers' shared
// buffers that the direct allreduce mapped.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "../base/tag.h"
#include "../base/task.h"
#include "../runtime/op.h"

namespace ddl {

class Runtime;

struct SlotWindows {
  bool ready = false;  // set up, every member mapped its next one's inbox
  // The ring's verdict was heard that it cannot be set up: no member will use it, so an op cut
  // short after that leaves the ranks agreeing.
  bool refused = false;
  uint64_t inboxWindow = 0;
  uint64_t outboxWindow = 0;
  char* inbox = nullptr;   // this rank's window: the previous member writes, this rank reads
  char* outbox = nullptr;  // the next member's inbox, mapped here
  size_t slotBytes = 0;
  size_t slots = 0;
};

// The staged allreduce's buffers (algorithms/allreduce_staged.cc): each member allocates a window
// of a header (its flags, each on a cache line of its own) and two halves of `halfBytes`, and
// maps every other member's. All or nothing (ready), like the ring's.
struct StageWindows {
  static constexpr size_t kHeaderBytes = 4096;
  bool setUp = false;  // tried: ready, or refused everywhere
  bool ready = false;
  size_t halfBytes = 0;
  uint64_t sequence = 0;          // stagings so far, the same on every member
  std::vector<uint64_t> windows;  // by group rank: own allocated, peers' mapped (0: none)
  std::vector<char*> bases;       // by group rank
};

struct SharedRing {
  enum class State { kUnknown, kReady, kUnavailable, kBroken };

  explicit SharedRing(Runtime* r) : runtime(r) {}
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;
  ~SharedRing();

  // The turn after `serving`, skipping tickets whose ops were abandoned.
  void advance();

  Runtime* runtime;
  State state = State::kUnknown;
  std::string broken;   // why, when kBroken
  SlotWindows windows;  // over every rank, in rank order
  // Rings of the host level of multi-dimensional plans, by key (allreduce_multidim.cc); each
  // set up once, ready or not.
  std::map<std::string, SlotWindows> levelRings;
  StageWindows stage;    // over every rank; set up by the first staged allreduce
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
  // The op whose resync last mended the windows: mismatches of the ops before it are mended
  // (none: never resynced).
  std::optional<uint32_t> resyncedAt;
};

// The op's turn at the windows: taken when the op starts, given up when it ends, however it
// ends: as the op ends (OpHold), or as the turn goes before it, whichever comes first (a failed
// op's frame may outlive the op while the transport still holds its requests, and must not hold
// the group's next ops up). Ending without release() (a failure, a timeout) breaks the ring for
// later ops, unless the op was in a clean stretch (setClean: before it touched anything shared,
// e.g. while it waited for its turn, or where every rank waits for all the others before any of
// them touches shared memory, as in the direct path's round of offers) or ended cleanly
// (Op::endsCleanly: another rank refused to start it, so none can have finished it), or ended by
// a mismatch where the op's path mends the windows after one (mendsAfterMismatch).
class SharedRingTurn : public OpHold {
 public:
  SharedRingTurn(SharedRing& ring, Op& op);
  // The turn of `ticket`, taken from ring.tickets by a caller that held the runtime's turn.
  SharedRingTurn(SharedRing& ring, Op& op, uint64_t ticket);
  SharedRingTurn(const SharedRingTurn&) = delete;
  SharedRingTurn& operator=(const SharedRingTurn&) = delete;
  ~SharedRingTurn();
  bool ready() const {
    return ring_.serving == ticket_ || ring_.state == SharedRing::State::kBroken;
  }
  void release();
  void setClean(bool clean) { clean_ = clean; }
  // The op resyncs the group's windows after a mismatch before it touches them
  // (resyncAfterMismatch): one that ends by a mismatch leaves them to the next such op.
  void mendsAfterMismatch() { mends_ = true; }
  void opEnded() override;

 private:
  // Gives the turn up (once), breaking the ring where the op ended unclean.
  void end();
  SharedRing& ring_;
  Op& op_;
  bool holds_ = true;  // the op still points at it (OpHold)
  bool clean_ = true;  // nothing shared touched yet
  bool mends_ = false;
  uint64_t ticket_;
  std::string what_;
  bool released_ = false;
};

// Sets up `windows` for the ring of group ranks `order` (this rank among them), inboxes of `slots`
// slots of `slotBytes`: every member allocates its inbox and sends the key to the previous one,
// which maps it; the first member collects whether everyone could and tells everyone. All or
// nothing (windows.ready). Messages in tag steps [firstStep, firstStep + 3) of the shared phase.
// Holding the turn.
Task setUpSlotWindows(Op& op, SlotWindows& windows, std::vector<int> order, size_t slotBytes,
                      size_t slots, uint32_t firstStep);

// Sets up `stage` over every rank of the op's group, halves of `halfBytes`: every member allocates
// its window and sends the key to every other, which maps it; the first member collects whether
// everyone could and tells everyone. All or nothing (stage.ready). Messages in tag steps
// [firstStep, firstStep + 3) of the shared phase. Holding the turn.
Task setUpStageWindows(Op& op, StageWindows& stage, size_t halfBytes, uint32_t firstStep);

// Whether an op that wants the group's one-host windows must first resync them: the latest
// mismatched op it started knowing of (GroupState::lastMismatch; its call print carries it, so
// that ranks that knew of different ones fail it as a mismatch instead of deciding differently)
// is not before the last resync. News of a mismatch older than that resync, arriving late, asks
// for none: the resync mended the windows after it.
bool resyncDue(const Op& op, const SharedRing& ring);
// The same for `lastMismatch` known (the one-step allreduce's decision, which sends no print).
bool resyncDue(std::optional<uint32_t> lastMismatch, const SharedRing& ring);

// The round after a mismatch among `members` (the ranks that share memory with this one: every
// rank of a one-host group, this rank's host in a multi-dimensional plan, the first of them
// collecting), holding the turn, before anything shared is touched; every member's failed op
// has ended once it is over, so nothing of it writes any more. Each member first lets go of
// windows whose setup the mismatch cut short (allocated or mapped, no verdict heard: the first
// member of a group-wide setup sends its verdict only once every rank's call print agreed with
// its own, so a mismatch cuts every rank's setup short before it) and of its host rings (whose
// verdicts cover only their members). Then the first member collects what each holds (the ring
// and the staging buffers: set up, refused or not; the staging count) and tells everyone: the
// count becomes the highest (flags only rise, so every one is below the next staging), windows
// the members do not all hold alike are let go everywhere (the next op sets them up again), and
// the direct path asks its offers again. Messages in tag steps kResyncStep and kResyncStep + 1
// of the shared phase.
inline constexpr uint32_t kResyncStep = tag::kMaxSteps - 5;
Task resyncAfterMismatch(Op& op, SharedRing& ring, const std::vector<int>& members);

}  // namespace ddl
