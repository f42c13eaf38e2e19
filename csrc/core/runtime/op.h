// Op: one operation in flight, as an algorithm sees it. It posts sends and receives to group
// ranks (the tag is built here from group, sequence, slot and source), and suspends the
// algorithm's coroutine until a condition on its requests holds. The engine resumes it; a failed
// request or the deadline ends the operation with an error that names the peers it waited on.
#pragma once

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../base/clock.h"
#include "../base/task.h"
#include "../memory/memory.h"
#include "../transport/transport.h"
#include "call_print.h"
#include "group_state.h"
#include "waits.h"
#include "work.h"

namespace ddl {

// What an op holds that must be let go as the op ends, not when its coroutine frame goes: a frame
// whose requests the transport still holds outlives its op (an orphan: Runtime), and what it
// holds (a group's shared-memory turn: shm/shared_ring.h) would hold up the group's next ops.
class OpHold {
 public:
  // The op ended (endsCleanly and endedWith are set).
  virtual void opEnded() = 0;

 protected:
  ~OpHold() = default;
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
  // From whichever rank sends first; the sender is sourceOf(request).
  Request* recvAny(uint64_t slot, void* data, size_t bytes);
  // The group rank that sent what a completed receive took.
  int sourceOf(const Request* request) const;
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
    Until(Op* op, std::function<bool()> predicate, bool everyTurn = false)
        : op_(op), predicate_(std::move(predicate)), everyTurn_(everyTurn) {}
    // A failed op suspends at its next co_await (the engine then ends it), even where what it
    // waits for is done: what arrived may be what made it fail.
    bool await_ready() { return op_->failure_.ok() && predicate_(); }
    void await_suspend(std::coroutine_handle<> handle);
    void await_resume() { op_->seen_ = op_->completions_; }
    bool everyTurn() const { return everyTurn_; }

   private:
    friend class Runtime;
    Op* op_;
    std::function<bool()> predicate_;
    bool everyTurn_;
  };
  // Suspends until predicate() holds; it is evaluated when one of this op's requests completes.
  Until until(std::function<bool()> predicate) { return Until(this, std::move(predicate)); }
  // Suspends until predicate() holds; it is evaluated at every turn of the runtime: for state no
  // request of this op tracks (a peer's flag in shared memory, which wakes no one). Whoever turns
  // the runtime spins, without sleeping, until `spin` has passed (the time a peer may take to get
  // there: no wake-up can tell it sooner), then as it always does; the runtime then looks at least
  // every housekeeping period, also while its thread sleeps.
  Until poll(std::function<bool()> predicate, std::chrono::nanoseconds spin);
  TimePoint pollSpinsUntil() const { return polls() ? pollSpinsUntil_ : TimePoint::min(); }
  bool polls() const { return waiting_ != nullptr && waiting_->everyTurn(); }
  Until all(std::vector<Request*> requests);
  // all(a, b, ...): no braced list inside co_await (GCC 12 miscompiles those in coroutines).
  // One or two requests need no vector, and their predicate fits in std::function's own storage.
  Until all(Request* only) {
    return until([only] { return only->done; });
  }
  Until all(Request* first, Request* second) {
    return until([first, second] { return first->done && second->done; });
  }
  template <typename... Requests>
  Until all(Request* first, Request* second, Request* third, Requests*... rest) {
    return all(std::vector<Request*>{first, second, third, rest...});
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
  // What it has posted, done or not (runtime/waits.h tells whom it waits for from them).
  const std::vector<std::unique_ptr<Request>>& requests() const { return requests_; }
  // The ranks this op has sent to (in a ring, its next rank: the ones that may wait for it).
  std::set<int> sentTo() const;
  // Halfway to its deadline an op tells the others whom it waits for (Notices::reportWaits).
  TimePoint halfway() const { return deadline_ - timeout_ / 2; }
  WaitReports waitReports;
  // Set by an algorithm whose timeout deserves its own words (the engine's default is "Timed
  // out after N ms: " + pendingPeers(op), runtime/waits.h). Called on the progress thread while the
  // frame lives.
  std::function<std::string()> describeTimeout;
  // The peers the op waits on other than through its requests (flags in shared memory that it
  // polls), for waitsOf (waits.h); set by such an algorithm for as long as it polls.
  std::function<std::set<int>()> awaitedPeers;
  // Hands requests that are still posted to the caller (the engine orphans and cancels them).
  std::vector<std::unique_ptr<Request>> takePending();

  // Its call check (runtime/call_print.h): none for point-to-point ops.
  CallCheck& callCheck() { return callCheck_; }
  const CallCheck& callCheck() const { return callCheck_; }
  // Set as the op ends, when no rank can have finished it (another rank refused to start it).
  bool endsCleanly() const { return endsCleanly_; }
  // Set as the op ends: how (kOk when it succeeded); or as its coroutine raises an error
  // (raise), before what the coroutine holds is let go on the way out.
  StatusKind endedWith() const { return endedWith_; }
  // Throws `error` out of the op's coroutine, noting its kind first (a shared-memory turn the
  // coroutine holds reads it as it unwinds: shm/shared_ring.h).
  [[noreturn]] void raise(const Error& error) {
    endedWith_ = error.kind();
    throw error;
  }
  // What the op holds (one at a time; null: nothing): told as the op ends (OpHold).
  void hold(OpHold* held) { held_ = held; }
  const OpHold* held() const { return held_; }

 private:
  friend class Runtime;
  friend class CallCheck;  // posts the prints
  static void observe(Request* req);
  Request* newRequest(int peer, bool isSend);
  // A receive of this op's own sequence that takes exactly `expected` bytes (or up to `bytes`:
  // Request::kAnySize), asking `peer` for its call print first.
  Request* recvExpecting(int peer, uint64_t slot, void* data, size_t bytes, size_t expected);
  // Post a request made by newRequest under `sequence` (nothing leaves a failed op).
  Request* postSend(Request* req, uint32_t sequence, uint64_t slot, const void* data, size_t bytes);
  Request* postReceive(Request* req, uint32_t sequence, uint64_t slot, void* data, size_t bytes);
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
  TimePoint pollSpinsUntil_ = TimePoint::min();
  TimePoint resumedAt_;  // when the engine last resumed the coroutine (turnDue)
  bool turnGivenUp_ = false;
  std::coroutine_handle<> resumePoint_;
  Status failure_;
  bool endsCleanly_ = false;
  StatusKind endedWith_ = StatusKind::kOk;
  OpHold* held_ = nullptr;
  CallCheck callCheck_{*this};
};

}  // namespace ddl
