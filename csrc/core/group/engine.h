// Engine: one per process (and one per simulated rank in the unit tests and the simulator): the
// runtime that turns (runtime/runtime.h), what turns it, and what the groups of this process
// share over it: the group ids they hold, the host's shared buffers, the link figures probed so
// far, and each group's notices. As the runtime's Supervisor it decides what an op's end means
// to the rest of the group: a failure of this rank's making is told to the others down the
// group's notice tree (group/notices.h); a timeout or a lost peer fails the whole group; a
// notice from another rank ends the op it names, here, or waits for it to start.
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

class Engine : private Runtime::Supervisor {
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
  bool turn() { return runtime_.turn(); }
  int settle() { return runtime_.settle(); }
  TimePoint nextTimer() const { return runtime_.nextTimer(); }
  void setWakeHook(std::function<void()> hook) { runtime_.setWakeHook(std::move(hook)); }
  const Clock& clock() const { return runtime_.clock(); }
  Memory& hostMemory() const { return runtime_.hostMemory(); }

  // Any thread.
  void submit(std::unique_ptr<Op> op) { runtime_.submit(std::move(op)); }
  void call(const std::function<void()>& fn) { runtime_.call(fn); }
  const std::string& localAddress() const { return runtime_.localAddress(); }
  // Watches the peers of `group` whose identity (by group rank) shows them on this host
  // (runtime/liveness.h), connecting to them: once one exits, the ops of every group that has
  // it fail, now and later, naming it.
  void watch(const std::shared_ptr<const Group>& group,
             const std::vector<ProcessIdentity>& identities);
  // Group ids are agreed through the store and wrap (base/tag.h): a group claims its id on every
  // rank's engine, and a claim of an id a live group holds fails (false).
  bool claimGroupId(uint32_t id);
  // The ids live groups of this engine hold, by id (tag::kMaxGroups entries), and those of groups
  // destroyed in the last GroupNotices::kGraveLife: what their failed ops left behind is still
  // being discarded (notices.h), and a group derived meanwhile must not take their id. (A group
  // made through the store takes the id the store gives; its creation drops those leftovers'
  // discards, which would take its own messages.)
  std::vector<bool> heldGroupIds();
  void releaseGroupId(uint32_t id);
  // releaseGroupId, if `engine` still exists (a group may outlive the process engine).
  static void releaseGroupIdIfAlive(Engine* engine, uint32_t id);
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
  // Notices (notices.h). openControl posts the group's notice receive (blocks until done);
  // closeControl takes it down (from a destructor: `engine` may be gone).
  void openControl(const std::shared_ptr<Group>& group);
  static void closeControl(Engine* engine, std::shared_ptr<GroupNotices> control);
  // A rank that refused its arguments for op `sequence` of `group` tells the others, whose op
  // then fails with `text`. Returns at once.
  static void refuseOp(Engine* engine, std::shared_ptr<const Group> group, uint32_t sequence,
                       std::string text);
  size_t activeOps() const { return runtime_.activeOps(); }
  size_t orphanedOps() const { return runtime_.orphanedOps(); }

 private:
  // Runtime::Supervisor.
  Status admit(Op& op, Ending* ending) override;
  void ended(Op& op, const Status& status, Ending ending, const std::string& where) override;
  void halfway(Op& op) override;
  bool afterSteps() override;
  bool idle() override;
  void housekeep() override;
  void afterLiveness() override;
  TimePoint nextHousekeeping() const override;
  void stopped() override;

  // Once a peer has been lost for the grace period, every open group that has it fails and
  // spreads the news (floodNews), whether an op of it is in flight or not: ranks that never
  // connected to the dead one (a receive from it fails nowhere) learn it in log2(P) rounds.
  void announceLost();
  // The process at `address` is gone (`why`): every open group that has it notes the rank gone
  // and fails; its news is to be spread (in the words `heard` from another rank, if it was).
  void learnGone(const std::string& address, const std::string& why, const std::string& heard);
  // News: a rank that learns ranks are gone sends all it knows gone to its successors at
  // distances 1, 2, 4, ... (not to ranks gone), and passes news on when what it knows grew.
  // Every rank hears from log2(P) predecessors, so dead relays (a whole host, a rack) cut no
  // one off, where a tree's dead relay cuts off its subtree. A rank floods at most once per
  // kNewsPeriod (what grows meanwhile goes with the next): P log2(P) messages a flood, and a
  // few floods per rank however many ranks die at once.
  static constexpr std::chrono::milliseconds kNewsPeriod{50};
  void floodPendingNews();
  void floodNews(GroupNotices& control);
  // News from a rank this one counts gone: it is told so (it stalled, or sits on the other side
  // of a partition), at most once a second.
  void tellGone(GroupNotices& control, int rank);
  // Fails the ops in flight whose group was failed (set when a group fails).
  void failRefusedOps();

  // notices.cc. Starts receiving a notice that has arrived for the group, if one has and none
  // is being received (notices are not posted for: a receive under a mask costs every message).
  bool takeNotice(GroupNotices& control);
  static void onNotice(Request* req);
  // Applies what arrived, passes on what travels down a tree, cleans up sends and, every
  // housekeeping period, discards what failed ops left behind. True when something happened.
  bool serviceControls(bool housekeeping);
  void applyNotice(GroupNotices& control, const Notice& notice);
  void applyNews(GroupNotices& control, const Notice& notice);
  // Starts `notice` down its tree (from this rank, its root).
  void sendNotice(GroupNotices& control, const Notice& notice);
  // False when no endpoint to `to` can be made (nothing is sent).
  bool sendNoticeTo(GroupNotices& control, const Notice& notice, const std::string& bytes, int to);
  // Passes a notice of the tree on to this rank's children in it: the rank at distance v from
  // the root sends to the ranks at distance v + 2^k for every 2^k > v (below the group's size).
  // A notice reaches all P - 1 other ranks in P - 1 messages and log2(P) rounds, and whoever
  // starts one, a rank sends only to the ranks 2^k after it: log2(P) endpoints.
  // A child that is gone (the notice's `gone`, or a peer lost here) is passed around: this rank
  // sends to its children in its stead.
  void relayNotice(GroupNotices& control, const Notice& notice, const std::string& bytes);
  void relayBelow(GroupNotices& control, const Notice& notice, const std::string& bytes, int v);
  // Tells the op's other ranks whom it still waits for, halfway to its deadline (runtime/waits.h):
  // every rank in groups of up to kWaitReportsToAll ranks, else the ranks it sent to.
  static constexpr int kWaitReportsToAll = 64;
  void reportWaits(Op& op);
  void buryOp(GroupNotices& control, uint32_t sequence);
  static Ending endingOf(const Notice& notice);
  static Status reportOf(const Notice& notice);  // "rank 2 reports: ..."

  Runtime runtime_;
  std::unique_ptr<ThreadDriver> driver_;
  std::shared_ptr<SharedBuffers> sharedBuffers_;

  std::mutex idsMutex_;
  std::set<uint32_t> groupIds_;            // held by live groups
  std::map<uint32_t, TimePoint> cooling_;  // released, until then
  std::mutex linksMutex_;
  std::map<std::string, LinkCost> links_;  // probed
  std::atomic<uint64_t> nextWindowId_{0};

  // The turning thread only.
  std::set<uint64_t> endedAgreements_;
  std::vector<std::shared_ptr<GroupNotices>> controls_;
  bool noticesArrived_ = false;   // a notice receive completed
  bool refusalsPending_ = false;  // a group failed: fail its ops in flight
};

}  // namespace ddl
