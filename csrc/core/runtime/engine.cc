#include "engine.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <set>

#include "../base/config.h"
#include "../base/tag.h"
#include "../base/types.h"
#include "trace.h"

namespace ddl {

namespace {

class SteadyClock : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
};

std::mutex gLiveMutex;
std::set<Engine*> gLive;  // engines constructed and not yet stopped
}  // namespace

const Clock& Clock::steady() {
  static const SteadyClock clock;
  return clock;
}

Engine::Engine(std::unique_ptr<Transport> transport, Drive drive, const Clock& clock,
               Memory* hostMemory)
    : transport_(std::move(transport)),
      sharedBuffers_(std::make_shared<SharedBuffers>(this)),
      address_(transport_->localAddress()),
      transportName_(transport_->name()),
      drive_(drive),
      clock_(clock),
      hostMemory_(hostMemory != nullptr ? hostMemory : &memoryFor(MemoryKind::kHost)),
      lastHousekeeping_(clock.now()) {
  if (drive_ == Drive::kThread) {
    eventFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (eventFd_ < 0) throw Error("ddl: eventfd failed");
    thread_ = std::thread([this] { run(); });
  }
  std::lock_guard<std::mutex> lock(gLiveMutex);
  gLive.insert(this);
}

Engine::~Engine() {
  sharedBuffers_->detach();
  stop();
  transport_.reset();  // before orphans_: a transport may still report on them while closing
  if (eventFd_ >= 0) close(eventFd_);
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    gLive.erase(this);
  }
  if (drive_ == Drive::kExternal) {
    if (stopping_.exchange(true)) return;
    drainAfterStop();
    return;
  }
  if (!thread_.joinable()) return;
  stopping_.store(true);
  wake();
  thread_.join();
}

void Engine::wake() {
  if (drive_ == Drive::kExternal) {
    if (wakeHook_) wakeHook_();
    return;
  }
  if (sleeping_.load()) {
    uint64_t one = 1;
    (void)!write(eventFd_, &one, sizeof(one));
  }
}

void Engine::submit(std::unique_ptr<Op> op) {
  if (stopping_.load()) {
    op->work->finish(Status(StatusKind::kClosed,
                            "ddl: " + op->name() + " submitted after the engine was shut down"));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    submitted_.push_back(std::move(op));
  }
  wake();
}

void Engine::submitIfAlive(Engine* engine, std::unique_ptr<Op> op) {
  std::lock_guard<std::mutex> live(gLiveMutex);
  if (gLive.count(engine) == 0) {
    op->work->finish(Status(StatusKind::kClosed,
                            "ddl: " + op->name() + " started after the engine was shut down"));
    return;
  }
  engine->submit(std::move(op));
}

void Engine::call(const std::function<void()>& fn) {
  // Driven from outside, the caller is on the thread that turns the loop.
  if (drive_ == Drive::kExternal || std::this_thread::get_id() == thread_.get_id()) return fn();
  std::promise<void> done;
  auto wrapped = [&] {
    try {
      fn();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  };
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    if (stopping_.load()) throw Error("ddl: the engine was shut down");
    calls_.push_back(wrapped);
  }
  wake();
  done.get_future().get();
}

void Engine::postIfAlive(Engine* engine, std::function<void()> fn) {
  std::lock_guard<std::mutex> live(gLiveMutex);
  if (gLive.count(engine) == 0) return;
  {
    std::lock_guard<std::mutex> lock(engine->submitMutex_);
    if (engine->stopping_.load()) return;
    engine->calls_.push_back(std::move(fn));
  }
  engine->wake();
}

size_t Engine::endpoints() {
  size_t count = 0;
  call([&] { count = transport_->endpoints(); });
  return count;
}

std::vector<std::string> Engine::transportDevices() {
  std::vector<std::string> devices;
  call([&] { devices = transport_->devices(); });
  return devices;
}

void Engine::watch(const std::shared_ptr<const Group>& group,
                   const std::vector<ProcessIdentity>& identities) {
  const ProcessIdentity me = ProcessIdentity::self();
  call([&] {
    for (int r = 0; r < group->size && r < static_cast<int>(identities.size()); ++r) {
      if (r != group->rank && me.sameMachineAndNamespace(identities[r]) &&
          identities[r].pid != me.pid) {
        watch_.watch(group->peer(r), identities[r]);
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
  std::lock_guard<std::mutex> lock(idsMutex_);
  for (uint32_t id : groupIds_) held[id % tag::kMaxGroups] = true;
  return held;
}

void Engine::releaseGroupId(uint32_t id) {
  std::lock_guard<std::mutex> lock(idsMutex_);
  groupIds_.erase(id);
}

void Engine::releaseGroupIdIfAlive(Engine* engine, uint32_t id) {
  std::lock_guard<std::mutex> live(gLiveMutex);
  if (gLive.count(engine) > 0) engine->releaseGroupId(id);
}

Status Engine::lostPeerOf(const Op& op) const {
  if (lost_.empty()) return Status();
  const TimePoint now = clock_.now();
  const Group& g = op.group();
  for (int r = 0; r < g.size; ++r) {
    if (r == g.rank || g.peers[r] < 0) continue;
    auto it = lost_.find(g.peers[r]);
    if (it != lost_.end() && now - it->second.since >= kLostGrace) {
      return Status(StatusKind::kPeerLost,
                    "rank " + std::to_string(r) + " is gone: " + it->second.why, {r});
    }
  }
  return Status();
}

bool Engine::checkLiveness() {
  bool found = false;
  for (auto& [peer, why] : watch_.poll()) {
    lost_.emplace(peer, Lost{why, clock_.now()});
    found = true;
  }
  for (auto& [peer, why] : transport_->lostPeers()) {
    lost_.emplace(peer, Lost{why, clock_.now()});
    found = true;
  }
  if (lost_.empty()) return found;
  for (auto it = active_.begin(); it != active_.end();) {
    auto current = it++;
    Status why = lostPeerOf(**current);
    if (!why.ok()) finishOp(current, std::move(why), Cause::kLost);
  }
  announceLost();
  return found;
}

void Engine::announceLost() {
  const TimePoint now = clock_.now();
  for (auto& [peer, lost] : lost_) {
    if (lost.announced || now - lost.since < kLostGrace) continue;
    lost.announced = true;
    for (const auto& control : controls_) {
      std::shared_ptr<const Group> alive = control->owner.lock();
      if (!control->open || !alive) continue;
      const Group& g = *alive;
      for (int r = 0; r < g.size; ++r) {
        if (r == g.rank || g.peers[r] != peer) continue;
        const std::string why = "rank " + std::to_string(r) + " is gone: " + lost.why;
        g.state->fail(Status(StatusKind::kPeerLost, g.name + ": " + why, {r}));
        refusalsPending_ = true;
        Notice notice;
        notice.sequence = static_cast<uint32_t>(std::max<int64_t>(control->started, 0));
        notice.scope = Notice::Scope::kGroup;
        notice.from = g.rank;
        notice.gone = r;
        notice.kind = StatusKind::kPeerLost;
        notice.text = why;
        sendNotice(*control, notice);
      }
    }
  }
}

bool Engine::drainSubmissions() {
  std::vector<std::unique_ptr<Op>> ops;
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    if (submitted_.empty() && calls_.empty()) return false;
    ops.swap(submitted_);
    calls.swap(calls_);
  }
  for (auto& fn : calls) fn();
  for (auto& op : ops) {
    op->startClock(clock_.now());
    if (op->work) op->work->markStarted();
    FlightRecorder::process().started(op->traceRecord);
    active_.push_back(std::move(op));
    activeCount_.fetch_add(1);
    auto it = std::prev(active_.end());
    Status refused = (*it)->group().state->refusal();
    if (!refused.ok()) {
      finishOp(it, std::move(refused), Cause::kRefused);
      continue;
    }
    Status lost = lostPeerOf(**it);
    if (!lost.ok()) {
      finishOp(it, std::move(lost), Cause::kLost);
      continue;
    }
    GroupControl* control = (*it)->group().control.get();
    if ((*it)->checksCall() && control != nullptr) {
      control->started = std::max<int64_t>(control->started, (*it)->sequence());
      auto early = control->early.find((*it)->sequence());
      if (early != control->early.end()) {
        Notice notice = std::move(early->second);
        control->early.erase(early);
        finishOp(it, reportOf(notice), causeOf(notice));
        continue;
      }
    }
    resume(**it);
    if ((*it)->task.done() || !(*it)->failure().ok()) finishOp(it);
  }
  return true;
}

void Engine::resume(Op& op) {
  op.memory().activate();
  op.seen_ = op.completions_;
  std::coroutine_handle<> point = op.resumePoint_ ? op.resumePoint_ : op.task.handle();
  op.resumePoint_ = {};
  op.waiting_ = nullptr;
  point.resume();
}

bool Engine::stepOps() {
  bool any = false;
  for (auto it = active_.begin(); it != active_.end();) {
    Op& op = **it;
    auto current = it++;
    if (!op.failure().ok()) {
      finishOp(current);
      any = true;
      continue;
    }
    if (op.completions_ == op.checked_ || op.waiting_ == nullptr) continue;
    op.checked_ = op.completions_;
    if (!op.waiting_->predicate_()) continue;
    resume(op);
    any = true;
    if (op.task.done() || !op.failure().ok()) finishOp(current);
  }
  return any;
}

namespace {

bool allDone(const std::vector<std::unique_ptr<Request>>& requests) {
  return std::all_of(requests.begin(), requests.end(), [](auto& r) { return r->done; });
}

}  // namespace

void Engine::closeGroup(const std::shared_ptr<const Group>& group, const Status& reason) {
  group->state->close(reason);
  call([&] {
    for (auto it = active_.begin(); it != active_.end();) {
      auto current = it++;
      if (&(*current)->group() == group.get()) finishOp(current, reason, Cause::kRefused);
    }
  });
}

void Engine::finishOp(std::list<std::unique_ptr<Op>>::iterator it, Status error, Cause cause) {
  std::unique_ptr<Op> op = std::move(*it);
  active_.erase(it);
  activeCount_.fetch_sub(1);
  if (error.ok() && !op->failure().ok()) error = op->failure();
  if (error.ok() && op->task.done()) {
    try {
      op->task.rethrow();
    } catch (const Error& e) {
      error = e.status();
    } catch (const std::exception& e) {
      error = Status(StatusKind::kOther, e.what());
    }
  }
  std::string where;  // the words are built for a failed op only
  if (!error.ok()) {
    where = op->name() + " on " + op->group().name + " (rank " + std::to_string(op->rank()) +
            " of " + std::to_string(op->size()) + ", op #" + std::to_string(op->sequence()) + ")";
  }
  // An op that another rank refused to start cannot have finished anywhere: what it shares may
  // be given up without doubt (shm/shared_ring.h).
  op->endsCleanly_ = cause == Cause::kNoticeRefusal;
  FlightRecorder::process().ended(op->traceRecord, error.detail,
                                  error.ok() ? "" : op->pendingPeers());
  if (!error.ok() && cause != Cause::kRefused) FlightRecorder::process().writeOnFailure();
  std::vector<std::unique_ptr<Request>> pending = op->takePending();
  for (auto& req : pending) transport_->cancel(req.get());
  std::shared_ptr<Work> work = op->work;
  std::shared_ptr<GroupState> group = op->group().state;
  if (!error.ok() && op->checksCall() && op->group().control != nullptr) {
    GroupControl& control = *op->group().control;
    // The others learn what ended it here; the messages they sent it are discarded.
    // (A lost peer is told by announceLost, to every group that has it.)
    const bool told = cause == Cause::kOwn || cause == Cause::kTimeout;
    if (told && control.open && op->size() > 1) {
      Notice notice;
      notice.sequence = op->sequence();
      notice.scope = cause == Cause::kTimeout ? Notice::Scope::kGroupTimeout
                     : cause == Cause::kLost  ? Notice::Scope::kGroup
                                              : Notice::Scope::kOp;
      notice.kind = error.kind;
      notice.from = op->rank();
      notice.text = error.detail;
      sendNotice(control, notice);
    }
    buryOp(control, op->sequence());
  }
  // A collective that timed out or lost a peer fails its group: the ranks no longer agree on
  // what was done (monitored barriers and point-to-point ops, which have no call check, leave it
  // usable, as their callers expect).
  const bool groupFails = op->checksCall() && (cause == Cause::kTimeout || cause == Cause::kLost);
  if (allDone(pending)) {
    op.reset();  // destroys the coroutine frame (and scratch buffers) before anyone is told
  } else {
    orphans_.push_back(Orphaned{std::move(pending), std::move(op)});
    orphanCount_.store(orphans_.size());
  }
  if (!error.ok()) {
    const bool remote =
        cause == Cause::kNotice || cause == Cause::kNoticeTimeout || cause == Cause::kNoticeRefusal;
    if (groupFails) {
      group->fail(error.withDetail(where + " " + error.detail));
      refusalsPending_ = true;
    }
    error.detail = "ddl: " + where + " " + error.detail;
    group->recordFailure(error, remote);
  }
  work->finish(std::move(error));
  // An op may wait on state another op releases (a group's shared windows): look again.
  for (auto& other : active_) other->checked_ = other->completions_ - 1;
}

void Engine::checkDeadlines() {
  const TimePoint now = clock_.now();
  for (auto it = active_.begin(); it != active_.end();) {
    auto current = it++;
    Op& op = **current;
    if (now < op.deadline()) {
      if (!op.waitsReported && now >= op.halfway()) reportWaits(op);
      continue;
    }
    std::string why = op.describeTimeout
                          ? op.describeTimeout()
                          : "Timed out after " + std::to_string(op.timeout().count()) +
                                " ms: " + op.pendingPeers();
    const std::set<int> awaited = op.waits().peers;
    finishOp(current,
             Status(StatusKind::kTimeout, why + op.waitChain(!op.describeTimeout),
                    std::vector<int>(awaited.begin(), awaited.end())),
             Cause::kTimeout);
  }
  std::erase_if(orphans_, [](const Orphaned& o) { return allDone(o.requests); });
  orphanCount_.store(orphans_.size());
}

namespace {

std::string joinRanks(const std::set<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

std::set<int> splitRanks(const std::string& text) {
  std::set<int> ranks;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    try {
      ranks.insert(std::stoi(text.substr(at, end - at)));
    } catch (const std::exception&) {
    }
    at = end + 1;
  }
  return ranks;
}

}  // namespace

void Engine::reportWaits(Op& op) {
  op.waitsReported = true;
  // With two ranks the one waited for is the other: nothing to follow.
  if (!op.checksCall() || op.size() <= 2 || op.group().control == nullptr) return;
  GroupControl& control = *op.group().control;
  if (!control.open) return;
  const Op::Waits waits = op.waits();
  Notice notice;
  notice.sequence = op.sequence();
  notice.scope = Notice::Scope::kWaiting;
  notice.from = op.rank();
  notice.text = joinRanks(waits.peers) + ";" + joinRanks(waits.notStarted);
  if (op.size() <= kWaitReportsToAll) {
    sendNotice(control, notice);
    return;
  }
  // A large group: only to the ranks this op sent to, the ones that may be waiting for it.
  notice.tree = false;
  const std::string bytes = notice.encode();
  for (int peer : op.sentTo()) sendNoticeTo(control, notice, bytes, peer);
}

void Engine::failRefusedOps() {
  refusalsPending_ = false;
  for (auto it = active_.begin(); it != active_.end();) {
    auto current = it++;
    Status refused = (*current)->group().state->refusal();
    if (!refused.ok()) finishOp(current, std::move(refused), Cause::kRefused);
  }
}

void Engine::openControl(const std::shared_ptr<Group>& group) {
  auto control = std::make_shared<GroupControl>();
  control->engine = this;
  control->group = group.get();
  control->owner = group;
  control->groupId = group->id;
  control->open = true;
  group->control = control;
  if (group->size < 2) return;
  call([&] { controls_.push_back(control); });
}

void Engine::closeControl(Engine* engine, std::shared_ptr<GroupControl> control) {
  if (!control) return;
  postIfAlive(engine, [engine, control] {
    control->open = false;
    control->early.clear();
    if (control->receive && !control->receive->done) {
      engine->transport_->cancel(control->receive.get());
    }
  });
}

void Engine::refuseOp(Engine* engine, std::shared_ptr<const Group> group, uint32_t sequence,
                      std::string text) {
  if (group->size < 2 || !group->control) return;
  postIfAlive(engine, [engine, group, sequence, text = std::move(text)] {
    GroupControl& control = *group->control;
    if (!control.open) return;
    control.started = std::max<int64_t>(control.started, sequence);
    Notice notice;
    notice.sequence = sequence;
    notice.scope = Notice::Scope::kRefusal;
    notice.kind = StatusKind::kInvalidArgument;
    notice.from = group->rank;
    notice.text = text;
    engine->sendNotice(control, notice);
    engine->buryOp(control, sequence);
  });
}

bool Engine::takeNotice(GroupControl& control) {
  if (control.receive && !control.receive->done) return false;  // one at a time
  auto receive = std::make_unique<Request>();
  receive->owner = &control;
  receive->observer = &Engine::onNotice;
  const uint64_t t =
      tag::make(control.groupId, 0, tag::slot(tag::kControlPhase, tag::kNoticeStep), 0);
  if (!transport_->receiveArrived(t, tag::kGroupAndSlot, control.buffer.data(),
                                  control.buffer.size(), receive.get())) {
    return false;
  }
  control.receive = std::move(receive);
  return true;
}

void Engine::onNotice(Request* req) {
  auto* control = static_cast<GroupControl*>(req->owner);
  control->received = true;
  if (!req->failed()) {
    std::optional<Notice> notice = Notice::decode(control->buffer.data(), req->receivedBytes);
    if (notice) control->arrived.push_back(std::move(*notice));
  }
  control->engine->noticesArrived_ = true;
}

void Engine::sendNotice(GroupControl& control, const Notice& notice) {
  relayNotice(control, notice, notice.encode());
}

void Engine::relayNotice(GroupControl& control, const Notice& notice, const std::string& bytes) {
  const Group& group = *control.group;
  const int n = group.size;
  if (notice.from < 0 || notice.from >= n) return;
  relayBelow(control, notice, bytes, (group.rank - notice.from + n) % n);
}

void Engine::relayBelow(GroupControl& control, const Notice& notice, const std::string& bytes,
                        int v) {
  const Group& group = *control.group;
  const int n = group.size;
  for (int step = 1; v + step < n; step <<= 1) {
    if (step <= v) continue;
    const int child = (notice.from + v + step) % n;
    const PeerId peer = group.peers[child];
    if (child == notice.gone || (peer >= 0 && lost_.count(peer) > 0) ||
        !sendNoticeTo(control, notice, bytes, child)) {
      relayBelow(control, notice, bytes, v + step);
    }
  }
}

bool Engine::sendNoticeTo(GroupControl& control, const Notice& notice, const std::string& bytes,
                          int to) {
  const Group& group = *control.group;
  PeerId peer;
  try {
    peer = group.peer(to);
  } catch (const Error&) {
    return false;  // no endpoint can be made: a peer that is gone (its process, or its host)
  }
  GroupControl::Sent& sent = control.sent.emplace_back();
  sent.bytes = bytes;
  sent.request = std::make_unique<Request>();
  sent.request->peer = to;
  sent.request->isSend = true;
  const uint64_t slot = tag::slot(tag::kControlPhase, tag::kNoticeStep);
  transport_->send(peer,
                   tag::make(group.id, notice.sequence, slot, static_cast<uint32_t>(group.rank)),
                   sent.bytes.data(), sent.bytes.size(), sent.request.get());
  return true;
}

void Engine::buryOp(GroupControl& control, uint32_t sequence) {
  if (control.graves.size() >= GroupControl::kMaxGraves) control.graves.pop_front();
  control.graves.push_back({sequence, clock_.now() + std::chrono::seconds(10)});
}

Engine::Cause Engine::causeOf(const Notice& notice) {
  switch (notice.scope) {
    case Notice::Scope::kGroupTimeout:
      return Cause::kNoticeTimeout;
    case Notice::Scope::kRefusal:
      return Cause::kNoticeRefusal;
    default:
      return Cause::kNotice;
  }
}

Status Engine::reportOf(const Notice& notice) {
  std::vector<int> ranks;
  if (notice.gone >= 0) ranks.push_back(notice.gone);
  return Status(notice.kind, "rank " + std::to_string(notice.from) + " reports: " + notice.text,
                std::move(ranks));
}

void Engine::applyNotice(GroupControl& control, const Notice& notice) {
  Status report = reportOf(notice);
  const bool timedOut = notice.scope == Notice::Scope::kGroupTimeout;
  auto op = std::find_if(active_.begin(), active_.end(), [&](const auto& o) {
    return &o->group() == control.group && o->checksCall() && o->sequence() == notice.sequence;
  });
  const bool inFlight = op != active_.end();
  if (notice.scope == Notice::Scope::kWaiting) {  // only for ops in flight here
    if (inFlight) {
      const size_t split = notice.text.find(';');
      Op::Waits& waits = (*op)->reportedWaits[notice.from];
      waits.peers = splitRanks(notice.text.substr(0, split));
      if (split != std::string::npos) waits.notStarted = splitRanks(notice.text.substr(split + 1));
    }
    return;
  }
  if (notice.scope == Notice::Scope::kGroup || (timedOut && !inFlight)) {
    control.group->state->fail(
        report.withDetail(control.group->name + ", op #" + std::to_string(notice.sequence) + ": " +
                          report.detail),
        true);
    refusalsPending_ = true;
  }
  if (inFlight) {
    // A rank that timed out here is alive and in the op; this rank, in it too, waits for its
    // own deadline (about as near) and names whom it still waits for itself.
    if (!timedOut) finishOp(op, std::move(report), causeOf(notice));
    return;
  }
  if (static_cast<int64_t>(notice.sequence) > control.started) {
    control.early[notice.sequence] = notice;
    if (control.early.size() > GroupControl::kMaxEarly) control.early.erase(control.early.begin());
  }
}

bool Engine::serviceControls() {
  noticesArrived_ = false;
  bool any = false;
  const TimePoint now = clock_.now();
  for (size_t i = 0; i < controls_.size();) {
    std::shared_ptr<GroupControl> control = controls_[i];
    // Held while its notices are applied and passed on; gone: closed.
    std::shared_ptr<const Group> alive = control->owner.lock();
    if (!alive) control->open = false;
    // Notices wait in the transport until taken here (every millisecond, and when one that was
    // being received completes): taken before the graves below are swept.
    while (true) {
      if (control->received) {
        std::vector<Notice> arrived;
        arrived.swap(control->arrived);
        control->received = false;
        if (control->open) {
          for (const Notice& notice : arrived) {
            if (notice.tree) relayNotice(*control, notice, notice.encode());
            applyNotice(*control, notice);
          }
        }
        any = true;
      }
      if (!control->open || !takeNotice(*control)) break;
    }
    control->sent.remove_if([](const GroupControl::Sent& s) { return s.request->done; });
    // What failed ops left behind, while a later op could not yet take it for its own (the tag's
    // sequence field wraps).
    while (!control->graves.empty() &&
           (now > control->graves.front().until ||
            control->started - control->graves.front().sequence >= (int64_t{1} << 15))) {
      control->graves.pop_front();
    }
    for (const GroupControl::Grave& grave : control->graves) {
      transport_->discard(tag::make(control->groupId, grave.sequence, 0, 0),
                          tag::kGroupAndSequence);
    }
    if (!control->open && (!control->receive || control->receive->done) && control->sent.empty()) {
      controls_.erase(controls_.begin() + static_cast<long>(i));
      continue;
    }
    ++i;
  }
  return any;
}

TimePoint Engine::nextTimer() const {
  TimePoint next = TimePoint::max();
  for (const auto& op : active_) {
    next = std::min(next, op->waitsReported ? op->deadline() : op->halfway());
  }
  if (!lost_.empty() && !active_.empty()) {
    next = std::min(next, clock_.now() + std::chrono::milliseconds(10));
  }
  for (const auto& [peer, lost] : lost_) {
    if (!lost.announced) next = std::min(next, lost.since + kLostGrace);
  }
  // What happened since the last housekeeping (a peer the transport found gone, among others)
  // is looked at one period later, as a running loop would.
  if (activeSinceHousekeeping_) next = std::min(next, lastHousekeeping_ + kHousekeeping);
  if (!orphans_.empty()) next = std::min(next, clock_.now() + std::chrono::seconds(1));
  for (const auto& control : controls_) {
    if (!control->graves.empty()) next = std::min(next, control->graves.front().until);
  }
  // Deadlines are checked once a housekeeping period has passed since the last check.
  if (next != TimePoint::max()) {
    next = std::max(next, lastHousekeeping_ + kHousekeeping + std::chrono::nanoseconds(1));
  }
  return next;
}

void Engine::sleep() {
  sleeping_.store(true);
  bool pending;
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    pending = !submitted_.empty() || !calls_.empty() || stopping_.load();
  }
  if (!pending && transport_->arm()) {
    int timeoutMs = -1;
    const TimePoint next = nextTimer();
    if (next != TimePoint::max()) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - clock_.now());
      timeoutMs = static_cast<int>(std::clamp<long>(wait.count() + 1, 0, 1000));
    }
    std::vector<pollfd> fds = {{eventFd_, POLLIN, 0}};
    if (transport_->wakeFd() >= 0) {
      fds.push_back({transport_->wakeFd(), POLLIN, 0});
    } else if (timeoutMs < 0) {
      timeoutMs = 1;
    }
    for (int fd : watch_.fds()) fds.push_back({fd, POLLIN, 0});  // a watched peer exits
    poll(fds.data(), fds.size(), timeoutMs);
  }
  sleeping_.store(false);
  uint64_t counter;
  (void)!read(eventFd_, &counter, sizeof(counter));
}

bool Engine::housekeep() {
  if (!controls_.empty()) serviceControls();
  const bool found = checkLiveness();
  checkDeadlines();
  return found;
}

bool Engine::turn() {
  bool busy = transport_->progress();
  busy |= drainSubmissions();
  busy |= stepOps();
  if (noticesArrived_) busy |= serviceControls();
  if (refusalsPending_) failRefusedOps();
  const TimePoint now = clock_.now();
  if (now - lastHousekeeping_ > kHousekeeping) {
    busy |= housekeep();
    lastHousekeeping_ = now;
    activeSinceHousekeeping_ = false;
  } else if (busy) {
    activeSinceHousekeeping_ = true;
  }
  return busy;
}

int Engine::settle() {
  int turns = 0;
  constexpr int kMaxTurns = 1 << 16;
  while (turns < kMaxTurns && !stopping_.load()) {
    ++turns;
    if (turn()) continue;
    if (!controls_.empty() && serviceControls()) continue;  // no notice is left untaken
    break;
  }
  return turns;
}

void Engine::run() {
  auto lastActivity = clock_.now();
  while (true) {
    const bool busy = turn();
    const TimePoint now = clock_.now();
    if (stopping_.load()) break;
    if (busy) {
      lastActivity = now;
      continue;
    }
    if (now - lastActivity < std::chrono::microseconds(config().spinMicros)) {
      sched_yield();
      continue;
    }
    if (!controls_.empty() && serviceControls()) continue;  // no notice is left untaken
    sleep();
    lastActivity = clock_.now();
  }
  drainAfterStop();
}

void Engine::drainAfterStop() {
  while (!active_.empty()) {
    finishOp(active_.begin(), Status(StatusKind::kClosed, "aborted: the engine was shut down"),
             Cause::kRefused);
  }
  for (auto& control : controls_) {
    control->open = false;
    if (control->receive && !control->receive->done) transport_->cancel(control->receive.get());
  }
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    for (auto& op : submitted_) {
      op->work->finish(Status(StatusKind::kClosed, "ddl: the engine was shut down"));
    }
    submitted_.clear();
    calls.swap(calls_);
  }
  for (auto& fn : calls) fn();
}

}  // namespace ddl
