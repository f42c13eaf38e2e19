// What an op belongs to: its group's membership as the runtime needs it (Group), and what became
// of the group (GroupState), shared by the communicator and its ops.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "../base/clock.h"
#include "../base/status.h"
#include "../transport/transport.h"
#include "call_print.h"
#include "peer_directory.h"

namespace ddl {

class Runtime;
struct GroupNotices;
class SharedBuffers;
struct SharedRing;

// What became of a group (any thread; the engine records, the torch glue asks): its first
// failed op, and whether it was closed (abort(), shutdown()) or failed (a timeout or a lost peer,
// here or on another rank), after which every op fails at once.
class GroupState {
 public:
  struct Failure {
    Status status;        // ok while no op has failed
    bool remote = false;  // another rank's report ended it
  };
  void recordFailure(const Status& status, bool remote = false);
  Failure firstFailure() const;
  void close(const Status& reason);
  // The group cannot go on: records the failure and refuses later ops, naming it.
  void fail(const Status& status, bool remote = false);
  Status refusal() const;  // why ops fail at once (ok while the group is usable)
  // Under one lock: whether ops are not refused, and (then) lastMismatch().
  bool usable(std::optional<uint32_t>* lastMismatch) const;
  // The ranks of the group known to be gone: found here, or named by another rank's notice, and
  // when each was first known (the runtime's clock). `witness`: the rank that counted it gone
  // from what it saw itself, where news told of it (-1: this rank, or not known).
  void noteGone(int rank, TimePoint when, int witness = -1);
  std::vector<int> gone() const;
  // For each of gone(), its witness (`self` where this rank counted it gone itself).
  std::vector<int> witnesses(int self) const;
  std::optional<TimePoint> goneSince(int rank) const;
  // The latest collective of the group (by op number, which wraps) known here to have ended
  // because the ranks called different things: ended so here (found, or told by the rank that
  // found it), or reported so by another rank after it ended well here. An op that fails by a
  // mismatch fails on every rank that has not ended it well, so it is the latest on every rank
  // once it has ended everywhere, whatever older news is still on its way
  // (shm/shared_ring.h: what the windows' resync goes by).
  void countMismatch(uint32_t sequence);
  std::optional<uint32_t> lastMismatch() const;

 private:
  mutable std::mutex mutex_;
  Failure first_;
  Status refusal_;
  std::map<int, TimePoint> gone_;
  std::map<int, int> witnesses_;  // of the gone ranks news told of, where known
  std::optional<uint32_t> lastMismatch_;
};

// Whether op `a` of a group came before op `b` (op numbers wrap at 2^32).
inline bool opBefore(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }

// A communicator's membership as the runtime needs it: shared by the communicator and its ops, so
// an op outlives a group destroyed while it is in flight. What the group code hands its ops
// (shared memory, notices) travels with it; the runtime does not look inside.
struct Group {
  Runtime* runtime = nullptr;
  int rank = 0;
  int size = 1;
  uint32_t id = 0;
  // Which group of this id it is, the same on every rank (0: none, a group made by hand): the
  // id is taken again once a group is destroyed, and what its ranks send (notices) carries this,
  // so that a late word of the old group is never taken for the new one's.
  uint64_t incarnation = 0;
  // Where the ranks are reached (peer_directory.h: the peers this rank was told of at creation,
  // and those it looked up since), and the endpoints opened so far: a rank connects to a peer
  // when it first sends to it (peer()), so it holds endpoints to the peers its operations
  // talked to, not to every rank. The endpoints are touched on the progress thread only.
  std::shared_ptr<PeerDirectory> directory = std::make_shared<PeerDirectory>();
  mutable std::unordered_map<int, PeerId> peers;
  // The endpoint to group rank r, opened now if it was not (its address looked up if it must
  // be); throws ddl::Error where the rank cannot be reached.
  PeerId peer(int r) const;
  // The endpoint to group rank r if one is open, else -1.
  PeerId openPeer(int r) const;
  std::string name;  // for messages, e.g. "group 3"
  // Whom this rank's call print goes to as an op starts, and whose it asks for (call_print.h).
  PrintRing printRing;
  // The group's shared-memory ring (shm/shared_ring.h), set up by the first allreduce that
  // uses it; touched on the progress thread only.
  std::shared_ptr<SharedRing> sharedRing;
  // The host's shared buffers (shm/shared_buffers.h) the direct allreduce looks tensors up in.
  std::shared_ptr<SharedBuffers> buffers;
  std::shared_ptr<GroupState> state = std::make_shared<GroupState>();
  // Its notices (group/notices.h), set up with the group; null for groups made by hand in tests.
  std::shared_ptr<GroupNotices> notices;
  // Its ops that exist (made, not yet destroyed: numbered and waiting to start, in flight, or
  // failed and held for the transport): while there are none, a caller may run a one-step
  // allreduce on its own thread (Communicator::allreduce). A copy of a group (another group
  // built from it) starts with none.
  struct Count {
    std::atomic<int> n{0};
    Count() = default;
    Count(const Count&) {}
    Count& operator=(const Count&) { return *this; }
  };
  mutable Count opsAlive;
};

}  // namespace ddl
