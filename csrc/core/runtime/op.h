// Op: one operation in flight, as an algorithm sees it. It posts sends and receives to group
// ranks (the tag is built here from group, sequence, slot and source), and suspends the
// algorithm's coroutine until a condition on its requests holds. The engine resumes it; a failed
// request or the deadline ends the operation with an error that names the peers it waited on.
#pragma once

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "../base/clock.h"
#include "../base/task.h"
#include "../memory/memory.h"
#include "../transport/transport.h"
#include "call_print.h"
#include "work.h"

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
  // The ranks of the group known to be gone: found here, or named by another rank's notice, and
  // when each was first known (the runtime's clock).
  void noteGone(int rank, TimePoint when);
  std::vector<int> gone() const;
  std::optional<TimePoint> goneSince(int rank) const;

 private:
  mutable std::mutex mutex_;
  Failure first_;
  Status refusal_;
  std::map<int, TimePoint> gone_;
};

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
  // Where each rank is reached (set at creation), and the endpoints opened so far: a rank
  // connects to a peer when it first sends to it (peer()), so it holds endpoints to the peers
  // its operations talked to, not to every rank. peers[r] is -1 while not connected; both are
  // touched on the progress thread only.
  std::vector<std::string> addresses;
  mutable std::vector<PeerId> peers;
  // The endpoint to group rank r, opened now if it was not.
  PeerId peer(int r) const;
  std::string name;  // for messages, e.g. "group 3"
  // The group's shared-memory ring (shm/shared_ring.h), set up by the first allreduce that
  // uses it; touched on the progress thread only.
  std::shared_ptr<SharedRing> sharedRing;
  // The host's shared buffers (shm/shared_buffers.h) the direct allreduce looks tensors up in.
  std::shared_ptr<SharedBuffers> buffers;
  std::shared_ptr<GroupState> state = std::make_shared<GroupState>();
  // Its notices (group/notices.h), set up with the group; null for groups made by hand in tests.
  std::shared_ptr<GroupNotices> control;
};

class Op {
 public:
  Op(std::shared_ptr<const Group> group, uint32_t sequence, std::string name,
     std::chrono::milliseconds timeout, std::shared_ptr<Work> work);
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  ~Op();

  int rank() const { return group_->rank; }
  int size() const { return group_->size; }
  const Group& group() const { return *group_; }
  // Where the op's buffers live, and the copies, reductions and scratch that go with it.
  Memory& memory() const { return *memory_; }
  void setMemory(Memory& memory) { memory_ = &memory; }

  Request* send(int peer, uint64_t slot, const void* data, size_t bytes);
  // A message of exactly `bytes`; one of another size fails the op, naming the sender (the
  // ranks called the collective with different sizes or dtypes).
  Request* recv(int peer, uint64_t slot, void* data, size_t bytes);
  // Gives back a completed request the algorithm holds no more: a later send or receive of this
  // op reuses it, so that an op of thousands of messages holds about as many requests as it has
  // outstanding at once (a ring of thousands of steps: a handful, not one per message).
  void recycle(Request* req);
  // A message of at most `bytes` (request->receivedBytes says how many arrived).
  Request* recvUpTo(int peer, uint64_t slot, void* data, size_t bytes);
  // From whichever rank sends first; the sender is tag::source(request->senderTag).
  Request* recvAny(uint64_t slot, void* data, size_t bytes);
  // A point-to-point batch's messages (Communicator::pointToPoint): each under its own
  // transfer's sequence field (the low bits of its user tag) instead of the op's; the receive
  // takes at most `bytes`.
  Request* sendUnder(uint32_t sequence, int peer, uint64_t slot, const void* data, size_t bytes);
  Request* recvUnder(uint32_t sequence, int peer, uint64_t slot, void* data, size_t bytes);
  // One-sided (group/window.h): writes `bytes` at `offset` of the region `remote` of `peer`
  // (Transport::openRegion); flush completes once every put posted to `peer` has landed.
  Request* put(int peer, uint64_t remote, size_t offset, const void* data, size_t bytes);
  Request* flush(int peer);

  class Until {
   public:
    Until(Op* op, std::function<bool()> predicate) : op_(op), predicate_(std::move(predicate)) {}
    // A failed op suspends at its next co_await (the engine then ends it), even where what it
    // waits for is done: what arrived may be what made it fail.
    bool await_ready() { return op_->failure_.ok() && predicate_(); }
    void await_suspend(std::coroutine_handle<> handle);
    void await_resume() { op_->seen_ = op_->completions_; }

   private:
    friend class Runtime;
    Op* op_;
    std::function<bool()> predicate_;
  };
  // Suspends until predicate() holds; it is evaluated when one of this op's requests completes.
  Until until(std::function<bool()> predicate) { return Until(this, std::move(predicate)); }
  Until all(std::vector<Request*> requests);
  // all(a, b, ...): no braced list inside co_await (GCC 12 miscompiles those in coroutines).
  template <typename... Requests>
  Until all(Request* first, Requests*... rest) {
    return all(std::vector<Request*>{first, rest...});
  }
  // Suspends until any request completes that had not when the coroutine last resumed.
  Until next();
  // Suspends until the runtime has turned once: for an op that computes on the turning thread
  // for long (a large reduction), so that heartbeats leave and other ops move meanwhile.
  Until yieldTurn();
  // The op has computed for kTurnSlice since the engine last resumed it: long work stops here
  // and yields its turn (peers count a rank whose heartbeats stop for
  // TORCH_DDL_HEARTBEAT_TIMEOUT_MS gone). Work of a step of its own (a ring pipeline's) calls
  // giveUpTurn() instead, and its op's next co_await next() yields.
  static constexpr std::chrono::milliseconds kTurnSlice{5};
  bool turnDue() const;
  void giveUpTurn() { turnGivenUp_ = true; }
  bool turnGivenUp() const { return turnGivenUp_; }
  // Looks at what the op waits for again at `at` (its runtime's clock), though nothing completed
  // by then: for a wait with a time limit of its own.
  void wakeAt(TimePoint at) { wakeAt_ = std::min(wakeAt_, at); }
  TimePoint nextWake() const { return wakeAt_; }

  // Engine side.
  Task task;
  uint64_t traceRecord = 0;  // its flight recorder entry (trace.h)
  std::shared_ptr<Work> work;
  const std::string& name() const { return name_; }
  uint32_t sequence() const { return sequence_; }
  TimePoint deadline() const { return deadline_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The deadline counts from when the engine starts the op (a device op may wait for its stream).
  void startClock(TimePoint now) { deadline_ = now + timeout_; }
  // A request failed: the first failure (ok while all is well).
  const Status& failure() const { return failure_; }
  // Describes who this op still waits for, e.g. "no data from rank 2; rank 3 has not received".
  std::string pendingPeers() const;
  // Whom this op still waits for: peers it has posted requests to, and of them the previous
  // rank if its call print, sent as it starts, has not arrived (it has not started the op).
  struct Waits {
    std::set<int> peers;
    std::set<int> notStarted;
  };
  Waits waits() const;
  // The ranks this op has sent to (in a ring, its next rank: the ones that may wait for it).
  std::set<int> sentTo() const;
  // Halfway to its deadline an op of more than two ranks that is still running tells the others
  // whom it waits for (Engine::reportWaits); a rank that times out follows those reports from
  // the ranks it waits for to the rank at the end of the wait: "; ..." or "" (none to add).
  // notStartedSaid: the words so far (pendingPeers) already say which peers have not started.
  TimePoint halfway() const { return deadline_ - timeout_ / 2; }
  bool waitsReported = false;
  std::map<int, Waits> reportedWaits;  // by the reporting rank
  std::string waitChain(bool notStartedSaid) const;
  // Set by an algorithm whose timeout deserves its own words (the engine's default is "Timed
  // out after N ms: " + pendingPeers()). Called on the progress thread while the frame lives.
  std::function<std::string()> describeTimeout;
  // Hands requests that are still posted to the caller (the engine orphans and cancels them).
  std::vector<std::unique_ptr<Request>> takePending();

  // Call checks (call_print.h). A collective carries a print of its call; its ranks check it
  // around the ring and tell each other when it fails. Point-to-point ops carry none.
  void setPrint(const CallPrint& print);
  bool checksCall() const { return print_.collective != Collective::kNone; }
  const CallPrint& print() const { return print_; }
  // Set as the op ends, when no rank can have finished it (another rank refused to start it).
  bool endsCleanly() const { return endsCleanly_; }
  // Sends this rank's print to the next rank and asks for the previous rank's. Besides, every
  // peer this op sends to gets the print before its first message, and every peer it receives
  // from is asked for its print before the first receive is posted: a print arrives before that
  // peer's data, so no data of a rank that called something else is ever used. A print that
  // differs fails the op at once.
  void startCallCheck();
  // Whether every print sent and asked for so far is done (the op completes once they are).
  bool callCheckDone() const;
  // A small allreduce at two ranks carries its data in the print (one message each way instead
  // of two): set before the op starts; the bytes are read when it starts.
  static constexpr size_t kInlineMax = 1024;
  void setInline(const void* data, size_t bytes);
  bool inlined() const { return inlineBytes_ > 0; }
  // The print asked from `peer` (nullptr if none), and the data it carried once it arrived.
  Request* printFrom(int peer) const;
  const char* inlinePayload(int peer) const;

 private:
  friend class Runtime;
  static void observe(Request* req);
  Request* newRequest(int peer, bool isSend);
  Request* postRecv(int peer, uint64_t slot, void* data, size_t bytes, size_t expected);
  // Post a request made by newRequest (nothing leaves a failed op).
  Request* postSend(Request* req, uint64_t slot, const void* data, size_t bytes);
  Request* postReceive(Request* req, uint64_t slot, void* data, size_t bytes);
  Request* postSendUnder(uint32_t sequence, Request* req, uint64_t slot, const void* data,
                         size_t bytes);
  Request* postReceiveUnder(uint32_t sequence, Request* req, uint64_t slot, void* data,
                            size_t bytes);
  bool refuseAfterFailure(Request* req);
  // The endpoint to req->peer, for a request about to be posted; false (the request failed)
  // when the op has failed or no endpoint can be made.
  bool ready(Request* req, PeerId* id);

  std::shared_ptr<const Group> group_;
  uint32_t sequence_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  TimePoint deadline_;  // set as the engine starts the op
  Memory* memory_ = &memoryFor(MemoryKind::kHost);
  std::vector<std::unique_ptr<Request>> requests_;
  std::vector<Request*> recycled_;  // done, given back, to reuse
  std::set<int> recycledSentTo_;    // the peers of recycled sends (sentTo())
  uint64_t completions_ = 0;
  uint64_t seen_ = 0;     // completions_ when the coroutine last resumed
  uint64_t checked_ = 0;  // completions_ when the engine last evaluated the waiting predicate
  Until* waiting_ = nullptr;
  TimePoint wakeAt_ = TimePoint::max();
  TimePoint resumedAt_;  // when the engine last resumed the coroutine (turnDue)
  bool turnGivenUp_ = false;
  std::coroutine_handle<> resumePoint_;
  Status failure_;
  void sendPrint(int peer);
  void askPrint(int peer);
  bool isStartPrint(const Request& req) const;
  bool endsCleanly_ = false;
  CallPrint print_;  // collective kNone: no call check
  bool callCheckStarted_ = false;
  // Which peers were sent this op's print and asked for theirs: bits of the masks in groups of
  // up to 64 ranks, kPrintSent | kPrintAsked by peer in larger ones.
  static constexpr uint8_t kPrintSent = 1, kPrintAsked = 2;
  uint64_t printsSentMask_ = 0, printsAskedMask_ = 0;
  std::vector<uint8_t> printFlags_;
  bool markPrint(int peer, uint8_t bit);  // sets it; whether it was set
  struct PrintIn {
    alignas(8) char bytes[sizeof(CallPrint) + kInlineMax];
    Request* request;
  };
  std::vector<std::unique_ptr<PrintIn>> printsIn_;    // one per peer asked
  std::unordered_map<int, PrintIn*> printsInByPeer_;  // the same, by peer, in large groups
  const PrintIn* printIn(int peer) const;
  const void* inlineData_ = nullptr;
  size_t inlineBytes_ = 0;
  std::vector<char> printOut_;  // the print and its data, when it carries data
  std::vector<Request*> printRequests_;
};

}  // namespace ddl
