// Engine: one per process (and one per simulated rank in the unit tests and the simulator). It
// owns the transport and the run loop, the only code that touches the transport. Callers submit
// operations from any thread and get a Work at once; each turn of the loop starts them, resumes
// their coroutines as their messages complete, enforces deadlines and finishes their Work.
//
// Who turns the loop is the engine's owner's choice: in a real process a progress thread of the
// engine's own does (after the last activity it polls for TORCH_DDL_SPIN_US, then arms the
// transport and sleeps in poll(2) on the transport's wake-up fd and its own eventfd, written by
// submit, until nextTimer(): an idle engine costs no CPU); in a simulated cluster the
// simulator's one event loop does (Drive::kExternal: turn() when a message arrives or the wake
// hook fires, at nextTimer() otherwise). Every time the engine reads comes from the clock it is
// handed, so the same code runs in real and in virtual time.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../base/clock.h"
#include "../shm/shared_buffers.h"
#include "../transport/transport.h"
#include "liveness.h"
#include "op.h"

namespace ddl {

class Engine {
 public:
  enum class Drive { kThread, kExternal };
  // `hostMemory`: what host-memory operations use for scratch, copies and reductions (null:
  // memoryFor(kHost); a simulator's memory that charges virtual time).
  explicit Engine(std::unique_ptr<Transport> transport, Drive drive = Drive::kThread,
                  const Clock& clock = Clock::steady(), Memory* hostMemory = nullptr);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();  // stops the progress thread; ops still in flight fail

  // Drive::kExternal: one turn of the run loop (transport progress, submissions, ops resumed,
  // notices, and every millisecond of the clock deadlines and liveness); true when something
  // happened (turn again). Call it on the one thread that calls everything else of this engine.
  bool turn();
  // Turns until nothing more happens at this time (bounded); the number of turns.
  int settle();
  // When the engine must be turned although nothing arrives (an op's deadline or halfway point,
  // housekeeping while a peer is lost); TimePoint::max() when never.
  TimePoint nextTimer() const;
  // Drive::kExternal: called when something was submitted or posted for the next turn.
  void setWakeHook(std::function<void()> hook) { wakeHook_ = std::move(hook); }
  const Clock& clock() const { return clock_; }
  Memory& hostMemory() const { return *hostMemory_; }

  // The process engine over UCX, created on first use.
  static Engine& process();
  // Stops the process engine if it was started (called at interpreter exit).
  static void shutdownProcess();

  std::string localAddress() const { return address_; }
  // Watches the peers of `group` whose identity (by group rank) shows them on this host
  // (liveness.h), connecting to them: once one exits, the ops of every group that has it fail,
  // now and later, naming it. Blocks until set up.
  void watch(const std::shared_ptr<const Group>& group,
             const std::vector<ProcessIdentity>& identities);
  // Group ids are agreed through the store and wrap (tag.h): a group claims its id on every
  // rank's engine, and a claim of an id a live group holds fails (false). Any thread.
  bool claimGroupId(uint32_t id);
  // The ids live groups of this engine hold, by id (tag::kMaxGroups entries).
  std::vector<bool> heldGroupIds();
  void releaseGroupId(uint32_t id);
  // releaseGroupId, if `engine` still exists (a group may outlive the process engine).
  static void releaseGroupIdIfAlive(Engine* engine, uint32_t id);

  // Thread-safe. The op's task must be set; its Work finishes when the op ends.
  void submit(std::unique_ptr<Op> op);
  // submit(), if `engine` still exists; otherwise the op's Work fails.
  static void submitIfAlive(Engine* engine, std::unique_ptr<Op> op);
  // Runs fn on the progress thread and waits for it; rethrows what it throws.
  void call(const std::function<void()>& fn);
  // Runs fn on the progress thread later, if `engine` still exists and runs (fn is dropped
  // otherwise). For cleanup from destructors that may outlive the engine.
  static void postIfAlive(Engine* engine, std::function<void()> fn);

  // Memory for tensors that peers on this host can map (any thread).
  const std::shared_ptr<SharedBuffers>& sharedBuffers() const { return sharedBuffers_; }

  // Progress thread only.
  Transport& transport() { return *transport_; }
  std::string transportName() const { return transportName_; }
  // Asks the transport on the progress thread (diagnostics only: it may open every device).
  std::vector<std::string> transportDevices();
  // Endpoints the transport has opened (to the peers this process's ops have sent to).
  size_t endpoints();
  // Closes `group` (GroupState::close) and fails its ops in flight at once with `reason`; ops
  // submitted later fail as they start. Any thread; returns once done.
  void closeGroup(const std::shared_ptr<const Group>& group, const Status& reason);
  // Call checks and notices (control.h). openControl posts the group's notice receive (blocks
  // until done); closeControl takes it down (from a destructor: `engine` may be gone).
  void openControl(const std::shared_ptr<Group>& group);
  static void closeControl(Engine* engine, std::shared_ptr<GroupControl> control);
  // A rank that refused its arguments for op `sequence` of `group` tells the others, whose op
  // then fails with `text`. Any thread; returns at once.
  static void refuseOp(Engine* engine, std::shared_ptr<const Group> group, uint32_t sequence,
                       std::string text);
  // Diagnostics: ops in flight; failed ops kept until the transport lets go of their requests.
  size_t activeOps() const { return activeCount_.load(); }
  size_t orphanedOps() const { return orphanCount_.load(); }

 private:
  void run();
  // Work done every housekeeping period of the clock (deadlines, liveness, notices).
  bool housekeep();
  // Fails what is left once the loop has stopped.
  void drainAfterStop();
  bool drainSubmissions();
  bool stepOps();
  void checkDeadlines();
  // Peers that exited: fails the ops that need them (after kLostGrace, in which data they sent
  // before exiting may still land). True when a peer was found gone.
  bool checkLiveness();
  // Why `op` cannot go on ("rank 2 is gone: ..."), or ok while every peer of its group lives.
  Status lostPeerOf(const Op& op) const;
  // Why an op ends: its own course (success, or a failure of its own making: a mismatch, an
  // error of its algorithm), its deadline, a lost peer, another rank's notice, or a closed or
  // failed group. Failures of the first three kinds are told to the other ranks.
  enum class Cause { kOwn, kTimeout, kLost, kNotice, kNoticeTimeout, kNoticeRefusal, kRefused };
  static Cause causeOf(const Notice& notice);
  static Status reportOf(const Notice& notice);  // "rank 2 reports: ..."
  void finishOp(std::list<std::unique_ptr<Op>>::iterator it, Status error = Status(),
                Cause cause = Cause::kOwn);
  // Notices: posts `control`'s receive; applies what arrived; cleans up sends; discards what
  // failed ops left behind. True when something happened.
  // Starts receiving a notice that has arrived for the group, if one has and none is being
  // received (notices are not posted for: a receive under a mask costs every message).
  bool takeNotice(GroupControl& control);
  static void onNotice(Request* req);
  bool serviceControls();
  void applyNotice(GroupControl& control, const Notice& notice);
  // Starts `notice` down its tree (from this rank, its root), or sends it to `to` alone.
  void sendNotice(GroupControl& control, const Notice& notice);
  // False when no endpoint to `to` can be made (nothing is sent).
  bool sendNoticeTo(GroupControl& control, const Notice& notice, const std::string& bytes, int to);
  // Passes a notice of the tree on to this rank's children in it: the rank at distance v from
  // the root sends to the ranks at distance v + 2^k for every 2^k > v (below the group's size).
  // A notice reaches all P - 1 other ranks in P - 1 messages and log2(P) rounds, and whoever
  // starts one, a rank sends only to the ranks 2^k after it: log2(P) endpoints.
  // A child that is gone (the notice's `gone`, or a peer lost here) is passed around: this rank
  // sends to its children in its stead.
  void relayNotice(GroupControl& control, const Notice& notice, const std::string& bytes);
  void relayBelow(GroupControl& control, const Notice& notice, const std::string& bytes, int v);
  // Tells the op's other ranks whom it still waits for, halfway to its deadline (op.h): every
  // rank in groups of up to kWaitReportsToAll ranks, else the ranks it sent to.
  static constexpr int kWaitReportsToAll = 64;
  void reportWaits(Op& op);
  void buryOp(GroupControl& control, uint32_t sequence);
  // Fails the ops in flight whose group was failed (set by finishOp and notices).
  void failRefusedOps();
  void resume(Op& op);
  void sleep();
  void wake();
  void stop();

  std::unique_ptr<Transport> transport_;
  std::shared_ptr<SharedBuffers> sharedBuffers_;
  std::string address_;
  std::string transportName_;
  int eventFd_ = -1;

  std::mutex idsMutex_;
  std::set<uint32_t> groupIds_;  // held by live groups
  std::mutex submitMutex_;
  std::vector<std::unique_ptr<Op>> submitted_;
  std::vector<std::function<void()>> calls_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> activeCount_{0};
  std::atomic<size_t> orphanCount_{0};

  // Progress thread only.
  std::list<std::unique_ptr<Op>> active_;
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
  struct Lost {
    std::string why;
    TimePoint since;
    bool announced = false;  // its groups failed here and were told (announceLost)
  };
  // Once a peer has been lost for kLostGrace, every open group that has it fails and says so
  // down its notice tree, whether an op of it is in flight or not: ranks that never connected
  // to the dead one (a receive from it fails nowhere) learn it in log2(P) rounds.
  void announceLost();
  std::map<PeerId, Lost> lost_;
  std::vector<std::shared_ptr<GroupControl>> controls_;
  bool noticesArrived_ = false;   // a notice receive completed
  bool refusalsPending_ = false;  // a group failed: fail its ops in flight
  static constexpr std::chrono::milliseconds kLostGrace{50};
  static constexpr std::chrono::milliseconds kHousekeeping{1};
  const Drive drive_;
  const Clock& clock_;
  Memory* const hostMemory_;
  TimePoint lastHousekeeping_{};
  bool activeSinceHousekeeping_ = false;  // a turn did something after the last housekeeping
  std::function<void()> wakeHook_;
  std::thread thread_;
};

}  // namespace ddl
