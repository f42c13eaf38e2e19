// Runtime: the run loop of one process (or of one simulated rank), and nothing else. It owns the
// transport and the ops in flight; callers submit ops from any thread and get a Work at once;
// each turn() moves the transport, starts what was submitted, resumes coroutines whose messages
// completed, and, once a housekeeping period of its clock has passed, ends ops past their
// deadline and ops whose peers are gone. It owns no thread: a driver turns it (runtime/driver.h,
// the progress thread of a real process; the simulator's event loop for a simulated rank), and
// every time it reads comes from the clock it is handed, so the same code runs in real and in
// virtual time.
//
// What an op's end means to the rest of its group (telling the other ranks, failing the group,
// notices that arrive) is not the runtime's business: a Supervisor does it (group/engine.h), told
// when an op starts and ends and given a share of every turn.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../base/clock.h"
#include "../base/config.h"
#include "../memory/memory.h"
#include "../transport/transport.h"
#include "heartbeat.h"
#include "liveness.h"
#include "op.h"
#include "stats.h"
#include "trace.h"

namespace ddl {

// Who ended an op (its Status says how).
enum class Ending : uint8_t {
  kOwn,            // its own course: success, or a failure it found (a mismatch, an error)
  kTimeout,        // its deadline passed here
  kLost,           // a peer of its group is gone (found here)
  kRemote,         // another rank's report
  kRemoteRefusal,  // another rank refused its arguments: no rank can have finished the op
  kRefused,        // its group was closed or had failed (here, or on another rank's word)
};

class Runtime {
 public:
  class Supervisor {
   public:
    virtual ~Supervisor() = default;
    // A submitted op is about to start: a failure to end it with at once (ok: run it).
    virtual Status admit(Op& op, Ending* ending) = 0;
    // `op` ends with `status` (ok or not): its requests are cancelled, its Work not yet
    // finished. `where` names it ("allreduce on group 3 (rank 0 of 4, op #7)"; failures only).
    virtual void ended(Op& op, const Status& status, Ending ending, const std::string& where) = 0;
    // Halfway to the deadline of an op still running.
    virtual void halfway(Op& op) = 0;
    // After the ops were stepped in a turn (cheap unless something arrived); true when it did
    // something.
    virtual bool afterSteps() = 0;
    // The runtime has nothing to do at once (before it sleeps, or settles): true when something
    // happened after all.
    virtual bool idle() = 0;
    // Every housekeeping period, before the deadlines and liveness are looked at.
    virtual void housekeep() = 0;
    // After liveness was looked at (peers that have been lost for the grace period).
    virtual void afterLiveness() = 0;
    // When the supervisor must be given a housekeeping turn although nothing arrives.
    virtual TimePoint nextHousekeeping() const = 0;
    // The loop has stopped (ops in flight were failed): let go of what is posted.
    virtual void stopped() = 0;
  };

  // `hostMemory`: what host-memory operations use for scratch, copies and reductions (null:
  // memoryFor(kHost); a simulator's memory that charges virtual time).
  Runtime(std::unique_ptr<Transport> transport, const Clock& clock, Memory* hostMemory,
          const Config& config);
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime();  // stop() must have been called

  void setSupervisor(Supervisor* supervisor) { supervisor_ = supervisor; }
  // Called when something was submitted or posted for the next turn (the driver's wake-up).
  void setWakeHook(std::function<void()> hook) { wakeHook_ = std::move(hook); }
  // A driver that turns the runtime on a thread of its own; call() from another thread then
  // hands its function to that thread. Without one the caller turns it, and call() runs inline.
  void setDriverThread(std::thread::id id) { driverThread_ = id; }
  // How a driver runs a call that may block outside the process (callOutside): `call` on a
  // thread of its own, `meanwhile` every `every` on the turning thread until it returns;
  // rethrows what `call` throws. Without one such calls run inline.
  using OutsideRunner =
      std::function<void(const std::function<void()>& call, const std::function<void()>& meanwhile,
                         std::chrono::milliseconds every)>;
  void setOutsideRunner(OutsideRunner runner) { outsideRunner_ = std::move(runner); }
  // Runs `call`, a request outside the process that may take long (a store's lookup of a
  // peer's address): where this thread turns the runtime and a driver runs such calls, the
  // beats due go on meanwhile (Heartbeat::sendDue), so that a store slow to answer, queued
  // behind thousands of requests, gets no live rank counted gone. Nothing else is turned
  // meanwhile: the call is made from inside an op. Rethrows what `call` throws.
  void callOutside(const std::function<void()>& call);

  // Any thread. The op's task must be set; its Work finishes when the op ends. `wake`: false
  // when the driver need not be woken for it (its caller turns the runtime: driver.h).
  void submit(std::unique_ptr<Op> op, bool wake = true);
  // submit(), if `runtime` still exists; otherwise the op's Work fails.
  static void submitIfAlive(Runtime* runtime, std::unique_ptr<Op> op);
  // Runs fn on the turning thread and waits for it; rethrows what it throws.
  void call(const std::function<void()>& fn);
  // Runs fn on the turning thread later, if `runtime` still exists and runs (fn is dropped
  // otherwise). For cleanup from destructors that may outlive the runtime.
  static void postIfAlive(Runtime* runtime, std::function<void()> fn);
  bool stopping() const { return stopping_.load(); }
  // Something is waiting to be taken in by the next turn (submissions, calls, a stop).
  bool hasSubmissions();

  // The turning thread only.
  // One turn (transport progress, submissions, ops resumed, and every housekeeping period of the
  // clock deadlines and liveness); true when something happened (turn again). `takeWaited`
  // false: submissions whose callers are about to wait for them (Work::wakeDeferred), when they
  // are all there is to take in, are left to those callers.
  bool turn(bool takeWaited = true);
  // Turns until nothing more happens at this time (bounded), or until the clock passed `until`
  // (work that charges the clock, in the simulator: the caller turns it again once what arrived
  // meanwhile was delivered, as a running loop would see it). Whether nothing more happens.
  bool settle(TimePoint until = TimePoint::max());
  // Nothing happened in a turn: the supervisor's look before a driver sleeps (notices that
  // arrived and wait in the transport); true when something happened after all.
  bool idle() { return supervisor_->idle(); }
  // When the runtime must be turned although nothing arrives (an op's deadline or halfway point,
  // housekeeping while a peer is lost, the supervisor's timers); TimePoint::max() when never.
  TimePoint nextTimer() const;
  // Until when an op that polls (Op::poll) asks whoever turns to spin rather than sleep.
  TimePoint pollSpinsUntil() const;
  // Stops: fails the ops in flight and what was submitted, runs what was posted. Idempotent.
  void stop();
  // Any thread: asks the driver to stop turning (it then calls stop() on its thread).
  void requestStop();

  Transport& transport() { return *transport_; }
  // The endpoint to `address`, opened now if it was not (Transport::connect).
  PeerId connect(const std::string& address) { return transport_->connect(address); }
  const std::string& transportName() const { return transportName_; }
  const std::string& localAddress() const { return address_; }
  // A number no other group made here, or by another process, is given (group/notices.h: a
  // group's incarnation): this process's address and a count, mixed. Any thread.
  uint64_t newIncarnation();
  const Clock& clock() const { return clock_; }
  Memory& hostMemory() const { return *hostMemory_; }
  // The settings this runtime (and what runs on it) uses: the process's, read once, or a
  // simulated rank's own.
  const Config& config() const { return config_; }
  FlightRecorder& recorder() { return recorder_; }
  // What it counted of the ops it ended (stats.h). Any thread.
  const OpStats& stats() const { return stats_; }
  // An op that ran outside the runtime, on the thread holding its turn (group/quick.cc), from
  // `began` to `ended` (its clock): recorded and counted as any op it ended is, and as quick.
  void countQuick(const Group& group, const CallPrint& print, uint32_t sequence,
                  std::chrono::milliseconds timeout, TimePoint began, TimePoint ended);
  void countHanded() { stats_.countHanded(); }
  // File descriptors a sleeping driver waits on besides its own (watched peers that exit).
  std::vector<int> watchedFds() const { return watch_.fds(); }

  // Ops in flight (turning thread).
  using OpList = std::list<std::unique_ptr<Op>>;
  OpList& ops() { return active_; }
  // Ends `it` with `status` (ok: its own course) and finishes its Work.
  void finishOp(OpList::iterator it, Status status = Status(), Ending ending = Ending::kOwn);
  // Ends every op in flight for which `why` gives a failure.
  void endOps(const std::function<Status(const Op&)>& why, Ending ending);

  // Peers found gone (turning thread), by address: what was seen, and since when. A peer is a
  // process: once gone, it is gone for every group that has it.
  struct Lost {
    std::string why;
    TimePoint since;
  };
  const std::map<std::string, Lost>& lost() const { return lost_; }
  bool isLost(const std::string& address) const { return lost_.count(address) > 0; }
  // Counts the process at `address` gone (found here, or another rank's word); true when it was
  // not known before. `told`: the groups are told by whoever counts it (another rank's news);
  // otherwise it is due for telling once the grace period has passed (dueToTell).
  bool markLost(const std::string& address, const std::string& why, bool told = false);
  // The peers found gone here whose grace period has passed and whose groups were not told yet,
  // each once: (address, what was seen).
  std::vector<std::pair<std::string, std::string>> dueToTell();
  // Why `op` cannot go on ("rank 2 is gone: ..."): a peer of its group lost for the grace
  // period; ok while every peer lives.
  Status lostPeerOf(const Op& op) const;
  // Whether a peer lost at `since` has been lost long enough for its ops to fail (data it sent
  // before exiting may still land within the grace period).
  static constexpr std::chrono::milliseconds kLostGrace{50};
  // Watches `identity` (a process on this host) as `peer`: its exit counts as lost at once.
  void watch(PeerId peer, const ProcessIdentity& identity) { watch_.watch(peer, identity); }
  // The heartbeats (heartbeat.h): which peers this process beats and watches.
  Heartbeat& heartbeat() { return heartbeat_; }

  // Diagnostics: ops in flight; failed ops kept until the transport lets go of their requests.
  size_t activeOps() const { return activeCount_.load(); }
  size_t orphanedOps() const { return orphanCount_.load(); }

 private:
  bool drainSubmissions(bool takeWaited);
  bool stepOps();
  bool checkDeadlines();  // true when an op asked to be woken now
  bool checkLiveness();
  void resume(Op& op, TimePoint now);
  bool housekeep();
  void wake();

  // Before the transport: destroyed after it, which may still complete their requests.
  Heartbeat heartbeat_;
  std::unique_ptr<Transport> transport_;
  std::string address_;
  std::atomic<uint64_t> incarnations_{0};
  std::string transportName_;
  Supervisor* supervisor_ = nullptr;
  const Clock& clock_;
  Memory* const hostMemory_;
  const Config config_;
  FlightRecorder recorder_;
  OpStats stats_;

  std::mutex submitMutex_;
  std::vector<std::unique_ptr<Op>> submitted_;
  std::vector<std::function<void()>> calls_;
  // Entries of submitted_ and calls_ (written under submitMutex_): read without the lock by
  // hasSubmissions() and by turns, before a turn takes the lock. Sequentially consistent, as a
  // submitter's look at the driver's sleeping flag after it, and the driver's at it after that
  // flag, require (Turn::wake, ThreadDriver::sleep).
  std::atomic<size_t> queued_{0};
  std::atomic<bool> stopping_{false};
  bool drained_ = false;  // stop() has run
  std::atomic<size_t> activeCount_{0};
  std::atomic<size_t> orphanCount_{0};
  std::function<void()> wakeHook_;
  OutsideRunner outsideRunner_;
  std::atomic<std::thread::id> driverThread_{};  // default: none, calls run inline

  // Turning thread only.
  OpList active_;
  OpList spare_;  // the nodes of ops that ended, for the next ops: none is allocated per op
  std::vector<std::unique_ptr<Op>> draining_;  // submitted_'s last capacity, for the next swap
  // An op that failed while the transport still held some of its requests (a receive it had
  // matched cannot always be cancelled). Its coroutine frame, with the scratch those requests may
  // write into, lives until every one of them completes; its Work has already failed.
  // The op is destroyed first (members go in reverse order, and a list never moves one): its
  // frame's links still point at these requests when it is destroyed.
  struct Orphaned {
    std::vector<std::unique_ptr<Request>> requests;
    std::unique_ptr<Op> op;
  };
  std::list<Orphaned> orphans_;
  PeerWatch watch_;
  std::map<std::string, Lost> lost_;
  std::deque<std::string> untold_;  // lost here, in the order found, groups not told yet
  static constexpr std::chrono::milliseconds kHousekeeping{1};
  TimePoint lastHousekeeping_{};
  bool activeSinceHousekeeping_ = false;  // a turn did something after the last housekeeping
};

}  // namespace ddl
