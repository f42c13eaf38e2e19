#include "engine.h"

#include <algorithm>

#include "../base/tag.h"
#include "../base/types.h"

namespace ddl {

namespace {
std::mutex gEnginesMutex;
std::set<Engine*> gEngines;  // engines constructed and not yet destroyed
}  // namespace

Engine::Engine(std::unique_ptr<Transport> transport, Drive drive, const Clock& clock,
               Memory* hostMemory, const Config* settings)
    : runtime_(std::move(transport), clock, hostMemory, settings ? *settings : ddl::config()),
      sharedBuffers_(std::make_shared<SharedBuffers>(&runtime_)) {
  runtime_.setSupervisor(this);
  if (drive == Drive::kThread) driver_ = std::make_unique<ThreadDriver>(runtime_);
  std::lock_guard<std::mutex> lock(gEnginesMutex);
  gEngines.insert(this);
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(gEnginesMutex);
    gEngines.erase(this);
  }
  sharedBuffers_->detach();
  driver_.reset();  // the thread stops the runtime on its way out
  runtime_.stop();
}

size_t Engine::endpoints() {
  size_t count = 0;
  call([&] { count = runtime_.transport().endpoints(); });
  return count;
}

std::vector<std::string> Engine::transportDevices() {
  std::vector<std::string> devices;
  call([&] { devices = runtime_.transport().devices(); });
  return devices;
}

void Engine::watch(const std::shared_ptr<const Group>& group,
                   const std::vector<ProcessIdentity>& identities) {
  const ProcessIdentity me = ProcessIdentity::self();
  call([&] {
    for (int r = 0; r < group->size && r < static_cast<int>(identities.size()); ++r) {
      if (r != group->rank && me.sameMachineAndNamespace(identities[r]) &&
          identities[r].pid != me.pid) {
        runtime_.watch(group->peer(r), identities[r]);
      }
    }
  });
}

bool Engine::claimGroupId(uint32_t id) {
  std::lock_guard<std::mutex> lock(idsMutex_);
  return groupIds_.insert(id).second;
}

std::vector<bool> Engine::heldGroupIds() {
  std::vector<bool> held(tag::kMaxGroups, false);
  const TimePoint now = runtime_.clock().now();
  std::lock_guard<std::mutex> lock(idsMutex_);
  for (uint32_t id : groupIds_) held[id % tag::kMaxGroups] = true;
  std::erase_if(cooling_, [now](const auto& c) { return c.second <= now; });
  for (const auto& [id, until] : cooling_) held[id % tag::kMaxGroups] = true;
  return held;
}

void Engine::releaseGroupId(uint32_t id) {
  const TimePoint until = runtime_.clock().now() + GroupNotices::kGraveLife;
  std::lock_guard<std::mutex> lock(idsMutex_);
  groupIds_.erase(id);
  cooling_[id] = until;
}

void Engine::releaseGroupIdIfAlive(Engine* engine, uint32_t id) {
  std::lock_guard<std::mutex> live(gEnginesMutex);
  if (gEngines.count(engine) > 0) engine->releaseGroupId(id);
}

std::optional<LinkCost> Engine::recallLink(const std::string& what) {
  std::lock_guard<std::mutex> lock(linksMutex_);
  auto found = links_.find(what);
  if (found == links_.end()) return std::nullopt;
  return found->second;
}

void Engine::tookWindowId(uint64_t id) {
  uint64_t next = nextWindowId_.load();
  while (next <= id && !nextWindowId_.compare_exchange_weak(next, id + 1)) {
  }
}

void Engine::rememberLink(const std::string& what, const LinkCost& cost) {
  std::lock_guard<std::mutex> lock(linksMutex_);
  links_[what] = cost;
}

void Engine::closeGroup(const std::shared_ptr<const Group>& group, const Status& reason) {
  group->state->close(reason);
  call([&] {
    // Its windows' ops too (group/window.h): they share its state.
    runtime_.endOps(
        [&](const Op& op) { return op.group().state == group->state ? reason : Status(); },
        Ending::kRefused);
  });
}

// --- What an op's end means to its group (Runtime::Supervisor) ---------------------------------

Status Engine::admit(Op& op, Ending* ending) {
  Status refused = op.group().state->refusal();
  if (!refused.ok()) {
    *ending = Ending::kRefused;
    return refused;
  }
  Status lost = runtime_.lostPeerOf(op);
  if (!lost.ok()) {
    *ending = Ending::kLost;
    return lost;
  }
  GroupNotices* control = op.group().notices.get();
  if (op.callCheck().on() && control != nullptr) {
    control->markStarted(op.sequence());
    auto early = control->early.find(op.sequence());
    if (early != control->early.end()) {
      Notice notice = std::move(early->second);
      control->early.erase(early);
      *ending = endingOf(notice);
      return reportOf(notice);
    }
  }
  return Status();
}

void Engine::ended(Op& op, const Status& error, Ending ending, const std::string& where) {
  if (error.ok()) return;
  if (op.callCheck().on() && op.group().notices != nullptr) {
    GroupNotices& control = *op.group().notices;
    // The others learn what ended it here; the messages they sent it are discarded. (A lost
    // peer is told by the news, to every group that has it; a timeout another rank reported
    // reached every rank already.)
    const bool heard = std::find(control.timeoutsHeard.begin(), control.timeoutsHeard.end(),
                                 op.sequence()) != control.timeoutsHeard.end();
    const bool told = ending == Ending::kOwn || (ending == Ending::kTimeout && !heard);
    if (told && control.open && op.size() > 1) {
      Notice notice = control.notice(
          ending == Ending::kTimeout ? Notice::Type::kGroupTimeout : Notice::Type::kOp,
          op.sequence());
      notice.kind = error.kind;
      notice.text = error.detail;
      sendNotice(control, notice);
    }
    buryOp(control, op.sequence());
  }
  // A collective that timed out or lost a peer fails its group: the ranks no longer agree on
  // what was done (monitored barriers and point-to-point ops, which have no call check, leave it
  // usable, as their callers expect).
  const std::shared_ptr<GroupState>& group = op.group().state;
  if (ending == Ending::kLost) {
    for (int r : error.ranks) group->noteGone(r, runtime_.clock().now());
  }
  if (op.callCheck().on() && (ending == Ending::kTimeout || ending == Ending::kLost)) {
    group->fail(error.withDetail(where + " " + error.detail));
    refusalsPending_ = true;
  }
  const bool remote = ending == Ending::kRemote || ending == Ending::kRemoteRefusal;
  group->recordFailure(error.withDetail("ddl: " + where + " " + error.detail), remote);
}

void Engine::halfway(Op& op) { reportWaits(op); }

bool Engine::afterSteps() {
  bool busy = false;
  if (noticesArrived_) busy |= serviceControls(false);
  if (refusalsPending_) failRefusedOps();
  return busy;
}

bool Engine::idle() { return !controls_.empty() && serviceControls(false); }

void Engine::housekeep() {
  if (!controls_.empty()) serviceControls(true);
  floodPendingNews();
}

void Engine::afterLiveness() { announceLost(); }

TimePoint Engine::nextHousekeeping() const {
  TimePoint next = TimePoint::max();
  for (const auto& control : controls_) {
    if (!control->graves.empty()) next = std::min(next, control->graves.front().until);
    if (control->newsPending) next = std::min(next, control->lastFlood + kNewsPeriod);
  }
  return next;
}

void Engine::stopped() {
  for (auto& control : controls_) {
    control->open = false;
    if (control->receive && !control->receive->done) {
      runtime_.transport().cancel(control->receive.get());
    }
  }
}

void Engine::failRefusedOps() {
  refusalsPending_ = false;
  runtime_.endOps([](const Op& op) { return op.group().state->refusal(); }, Ending::kRefused);
}

void Engine::announceLost() {
  for (const auto& [address, why] : runtime_.dueToTell()) learnGone(address, why, "");
  floodPendingNews();
}

void Engine::learnGone(const std::string& address, const std::string& why,
                       const std::string& heard) {
  const TimePoint now = runtime_.clock().now();
  for (const auto& control : controls_) {
    std::shared_ptr<const Group> alive = control->owner.lock();
    if (!control->open || !alive) continue;
    const Group& g = *alive;
    for (int r = 0; r < g.size; ++r) {
      if (r == g.rank || g.addresses[r] != address || !control->newsOf.insert(r).second) continue;
      const std::string words = "rank " + std::to_string(r) + " is gone: " + why;
      g.state->noteGone(r, now);
      g.state->fail(Status(StatusKind::kPeerLost, g.name + ": " + words, {r}));
      refusalsPending_ = true;
      if (control->newsWhy.empty()) control->newsWhy = heard.empty() ? words : heard;
      control->newsPending = true;
    }
  }
}

void Engine::floodPendingNews() {
  const TimePoint now = runtime_.clock().now();
  for (const auto& control : controls_) {
    if (!control->newsPending || !control->open) continue;
    if (control->lastFlood != TimePoint::min() && now - control->lastFlood < kNewsPeriod) continue;
    floodNews(*control);
  }
}

}  // namespace ddl
