// Engine: one per process (and one per simulated rank in the unit tests and the simulator): the
// runtime that turns (runtime/runtime.h), what turns it, and what the groups of this process
// share over it: the group ids they hold, the host's shared buffers, the link figures probed so
// far, and the notices (group/notices.h: what an op's end means to the rest of its group, the
// runtime's Supervisor).
//
// Drive::kThread: a ThreadDriver (runtime/driver.h) turns the runtime on the progress thread.
// Drive::kExternal: the owner turns it (the simulator's event loop: turn() when a message
// arrives or the wake hook fires, at nextTimer() otherwise).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "../runtime/driver.h"
#include "../runtime/runtime.h"
#include "../shm/shared_buffers.h"
#include "../topology/allreduce_plan.h"
#include "notices.h"

namespace ddl {

class Engine {
 public:
  enum class Drive { kThread, kExternal };
  // `hostMemory`: see Runtime. `settings`: the configuration this engine's groups use (default:
  // the process's, read from the environment once).
  explicit Engine(std::unique_ptr<Transport> transport, Drive drive = Drive::kThread,
                  const Clock& clock = Clock::steady(), Memory* hostMemory = nullptr,
                  const Config* settings = nullptr);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();  // stops the runtime; ops still in flight fail

  Runtime& runtime() { return runtime_; }
  const Config& config() const { return runtime_.config(); }
  // The process engine over UCX, created on first use.
  static Engine& process();
  // Stops the process engine if it was started (called at interpreter exit).
  static void shutdownProcess();

  // Drive::kExternal (the runtime's, see there).
  bool turn();
  bool settle(TimePoint until = TimePoint::max());
  TimePoint nextTimer() const { return runtime_.nextTimer(); }
  void setWakeHook(std::function<void()> hook) { runtime_.setWakeHook(std::move(hook)); }
  const Clock& clock() const { return runtime_.clock(); }
  Memory& hostMemory() const { return runtime_.hostMemory(); }

  // Any thread.
  // `waited`: the caller waits for the op's Work at once (CallOptions::waited).
  void submit(std::unique_ptr<Op> op, bool waited = false) {
    if (driver_) return driver_->submit(std::move(op), waited);
    runtime_.submit(std::move(op));
  }
  void call(const std::function<void()>& fn) { runtime_.call(fn); }
  // Runs `body` on this thread holding the runtime's turn (a body that does not turn the
  // runtime): where a progress thread turns it, if the turn is free now
  // (ThreadDriver::holdingTurn); where the owner does (Drive::kExternal), if it lets callers
  // hold it (letCallersHoldTurn) and is not turning it now. False when it did not run.
  bool holdingTurn(FunctionRef<void(Runtime&)> body);
  // Drive::kExternal: callers may hold the turn between the owner's turns (the simulator, whose
  // calls come between its events, as a real caller's come between the thread's turns).
  void letCallersHoldTurn() { callersHold_ = true; }
  // How long a caller holding the turn may spin, waiting for its peers (group/quick.cc): the
  // configuration's spin where a thread drives; none where the owner does (a simulated caller's
  // clock stands still while it spins: it looks once, and hands what is left to an op).
  std::chrono::microseconds callerSpin() const;
  const std::string& localAddress() const { return runtime_.localAddress(); }
  // Watches the peers of `group` whose identity (by group rank) shows them on this host
  // (runtime/liveness.h), connecting to them: once one exits, the ops of every group that has
  // it fail, now and later, naming it.
  void watch(const std::shared_ptr<const Group>& group, const Identities& identities);
  // Group ids are agreed through the store and wrap (base/tag.h): a group claims its id on every
  // rank's engine, and a claim of an id a live group holds fails (false). A wide group (`wide`
  // bits: tag::wideBits) claims its id's whole block, and while it lives the ids its agreements
  // carry (the agreements' block) are held too.
  bool claimGroupId(uint32_t id, int wide = 0);
  // The ids live groups of this engine hold, by id (tag::kMaxGroups entries), and those of groups
  // destroyed in the last GroupNotices::kGraveLife: what their failed ops left behind is still
  // being discarded (notices.h), and a group derived meanwhile must not take their id. (A group
  // made through the store takes the id the store gives; its creation drops those leftovers'
  // discards, which would take its own messages.)
  std::vector<bool> heldGroupIds();
  // Holds the ids the agreement of a reconfigure into a wide group (`wide` bits) carries while it
  // runs, as a wide group holds them while it lives: false, with the id in *taken, where a group
  // of this engine holds one of them or was destroyed holding it (heldGroupIds).
  bool holdAgreementIds(int wide, uint32_t* taken);
  void releaseAgreementIds(int wide);
  void releaseGroupId(uint32_t id, int wide = 0);
  // releaseGroupId, if `engine` still exists (a group may outlive the process engine).
  static void releaseGroupIdIfAlive(Engine* engine, uint32_t id, int wide = 0);
  // Memory for tensors that peers on this host can map.
  const std::shared_ptr<SharedBuffers>& sharedBuffers() const { return sharedBuffers_; }
  // Link figures this process measured, by what was measured (group/link_probe.h): later groups
  // over the same hosts use them instead of measuring again.
  std::optional<LinkCost> recallLink(const std::string& what);
  // Agreements that ended here (group/agreement.h): their late words are dropped. The turning
  // thread only.
  std::set<uint64_t>& endedAgreements() { return endedAgreements_; }
  void rememberLink(const std::string& what, const LinkCost& cost);
  // One-sided windows' numbers (group/window.h): one this process takes for a window it makes
  // (no other window made here takes it), and one agreed (the numbers of later windows are
  // higher).
  uint64_t takeWindowNumber() { return nextWindowId_.fetch_add(1); }
  void tookWindowId(uint64_t id);

  // The transport's name; the devices it can use (asks the progress thread: it may open every
  // device); the endpoints it has opened.
  const std::string& transportName() const { return runtime_.transportName(); }
  std::vector<std::string> transportDevices();
  size_t endpoints();
  // Closes `group` (GroupState::close) and fails its ops in flight at once with `reason`; ops
  // submitted later fail as they start. Returns once done.
  void closeGroup(const std::shared_ptr<const Group>& group, const Status& reason);
  // The groups' notices (notices.h): a group opens its own as it is made.
  Notices& notices() { return notices_; }
  size_t activeOps() const { return runtime_.activeOps(); }
  size_t orphanedOps() const { return runtime_.orphanedOps(); }

 private:
  Runtime runtime_;
  Notices notices_{runtime_};
  std::unique_ptr<ThreadDriver> driver_;
  bool callersHold_ = false;  // Drive::kExternal (letCallersHoldTurn)
  bool turning_ = false;      // Drive::kExternal: the owner turns the runtime now
  std::shared_ptr<SharedBuffers> sharedBuffers_;

  std::mutex idsMutex_;
  std::set<uint32_t> groupIds_;            // held by live groups
  std::map<uint32_t, TimePoint> cooling_;  // released, until then
  std::multiset<int> wides_;               // the wide bits of each live wide group
  std::mutex linksMutex_;
  std::map<std::string, LinkCost> links_;  // probed
  std::atomic<uint64_t> nextWindowId_{0};

  // The turning thread only.
  std::set<uint64_t> endedAgreements_;
};

}  // namespace ddl
