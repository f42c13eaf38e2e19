#include "runtime.h"

#include <algorithm>
#include <future>
#include <set>

#include "../base/types.h"

namespace ddl {

namespace {

std::mutex gLiveMutex;
std::set<Runtime*> gLive;  // runtimes constructed and not yet stopped

bool allDone(const std::vector<std::unique_ptr<Request>>& requests) {
  return std::all_of(requests.begin(), requests.end(), [](auto& r) { return r->done; });
}

// The wall clock's time at `clock`'s zero, for the flight recorder's times.
std::chrono::nanoseconds wallOffset(const Clock& clock) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::system_clock::now().time_since_epoch() - clock.now().time_since_epoch());
}

}  // namespace

Runtime::Runtime(std::unique_ptr<Transport> transport, const Clock& clock, Memory* hostMemory,
                 const Config& config)
    : heartbeat_(std::chrono::milliseconds(config.heartbeatMillis),
                 std::chrono::milliseconds(config.heartbeatTimeoutMillis)),
      transport_(std::move(transport)),
      address_(transport_->localAddress()),
      transportName_(transport_->name()),
      clock_(clock),
      hostMemory_(hostMemory != nullptr ? hostMemory : &memoryFor(MemoryKind::kHost)),
      config_(config),
      recorder_(config.traceEntries, config.traceFile),
      lastHousekeeping_(clock.now()) {
  heartbeat_.setSelf(address_);
  recorder_.setWallOffset(wallOffset(clock));
  std::lock_guard<std::mutex> lock(gLiveMutex);
  gLive.insert(this);
}

Runtime::~Runtime() {
  stop();
  transport_.reset();  // before orphans_: a transport may still report on them while closing
}

bool Runtime::markLost(const std::string& address, const std::string& why, bool told) {
  if (address.empty() || !lost_.emplace(address, Lost{why, clock_.now()}).second) return false;
  if (!told) untold_.push_back(address);
  return true;
}

std::vector<std::pair<std::string, std::string>> Runtime::dueToTell() {
  std::vector<std::pair<std::string, std::string>> due;
  const TimePoint now = clock_.now();
  while (!untold_.empty()) {
    const Lost& lost = lost_.at(untold_.front());
    if (now - lost.since < kLostGrace) break;
    due.emplace_back(untold_.front(), lost.why);
    untold_.pop_front();
  }
  return due;
}

void Runtime::wake() {
  if (wakeHook_) wakeHook_();
}

void Runtime::submit(std::unique_ptr<Op> op, bool wakeDriver) {
  if (stopping_.load()) {
    op->work->finish(Status(StatusKind::kClosed,
                            "ddl: " + op->name() + " submitted after the engine was shut down"));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    submitted_.push_back(std::move(op));
    queued_.fetch_add(1);
  }
  if (wakeDriver) wake();
}

void Runtime::submitIfAlive(Runtime* runtime, std::unique_ptr<Op> op) {
  std::lock_guard<std::mutex> live(gLiveMutex);
  if (gLive.count(runtime) == 0) {
    op->work->finish(Status(StatusKind::kClosed,
                            "ddl: " + op->name() + " started after the engine was shut down"));
    return;
  }
  runtime->submit(std::move(op));
}

void Runtime::call(const std::function<void()>& fn) {
  // Without a driver thread, the caller is the one that turns the runtime.
  if (driverThread_ == std::thread::id() || std::this_thread::get_id() == driverThread_) {
    return fn();
  }
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
    if (stopping_.load()) throw Error("ddl: the engine was shut down", StatusKind::kClosed);
    calls_.push_back(wrapped);
    queued_.fetch_add(1);
  }
  wake();
  done.get_future().get();
}

void Runtime::callOutside(const std::function<void()>& call) {
  const std::thread::id turning = driverThread_.load();
  const bool turns = turning == std::thread::id() || turning == std::this_thread::get_id();
  if (!outsideRunner_ || !heartbeat_.on() || !turns) return call();
  const auto every = std::max(heartbeat_.period() / 4, std::chrono::milliseconds(1));
  outsideRunner_(
      call,
      [this] {
        heartbeat_.sendDue(*transport_, clock_.now(), [this](const auto& a) { return isLost(a); });
      },
      every);
}

void Runtime::postIfAlive(Runtime* runtime, std::function<void()> fn) {
  std::lock_guard<std::mutex> live(gLiveMutex);
  if (gLive.count(runtime) == 0) return;
  {
    std::lock_guard<std::mutex> lock(runtime->submitMutex_);
    if (runtime->stopping_.load()) return;
    runtime->calls_.push_back(std::move(fn));
    runtime->queued_.fetch_add(1);
  }
  runtime->wake();
}

bool Runtime::hasSubmissions() { return queued_.load() > 0 || stopping_.load(); }

Status Runtime::lostPeerOf(const Op& op) const {
  if (lost_.empty()) return Status();
  const TimePoint now = clock_.now();
  const Group& g = op.group();
  // The lowest rank of the group this rank knows the address of that has been lost for the
  // grace period.
  int first = -1;
  const Lost* why = nullptr;
  for (const auto& [address, lost] : lost_) {
    if (now - lost.since < kLostGrace) continue;
    const int r = g.directory->rankAt(address);
    if (r < 0 || r == g.rank || (first >= 0 && r > first)) continue;
    first = r;
    why = &lost;
  }
  if (first < 0) return Status();
  return Status(StatusKind::kPeerLost, "rank " + std::to_string(first) + " is gone: " + why->why,
                {first});
}

bool Runtime::checkLiveness() {
  bool found = false;
  auto lostEndpoint = [&](PeerId peer, const std::string& why) {
    if (peer >= 0) found |= markLost(transport_->addressOf(peer), why);
  };
  for (auto& [peer, why] : watch_.poll()) lostEndpoint(peer, why);
  for (auto& [peer, why] : transport_->lostPeers()) lostEndpoint(peer, why);
  for (auto& [address, why] :
       heartbeat_.tick(*transport_, clock_.now(), [this](const auto& a) { return isLost(a); })) {
    found |= markLost(address, why);
  }
  if (lost_.empty()) return found;
  for (auto it = active_.begin(); it != active_.end();) {
    auto current = it++;
    Status why = lostPeerOf(**current);
    if (!why.ok()) finishOp(current, std::move(why), Ending::kLost);
  }
  supervisor_->afterLiveness();
  return found;
}

bool Runtime::drainSubmissions(bool takeWaited) {
  // The two vectors trade places each turn, so that neither is allocated per op (one that a call
  // made in this turn drained again would find draining_ empty, and allocate).
  // Most turns find nothing (a waiting caller's, an idle thread's): they take no lock.
  if (queued_.load() == 0) return false;
  std::vector<std::unique_ptr<Op>> ops = std::move(draining_);
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    const auto waited = [](const std::unique_ptr<Op>& op) {
      return op->work != nullptr && op->work->wakeDeferred();
    };
    if (calls_.empty() &&
        (takeWaited ? submitted_.empty()
                    : std::all_of(submitted_.begin(), submitted_.end(), waited))) {
      draining_ = std::move(ops);
      return false;
    }
    ops.swap(submitted_);
    calls.swap(calls_);
    queued_.store(0);
  }
  for (auto& fn : calls) fn();
  for (auto& op : ops) {
    const TimePoint now = clock_.now();  // the one read of an op's start
    op->startClock(now);
    if (op->work) op->work->markStarted(now);
    recorder_.started(op->traceRecord, now);
    if (spare_.empty()) {
      active_.emplace_back();
    } else {
      active_.splice(active_.end(), spare_, spare_.begin());
    }
    active_.back() = std::move(op);
    activeCount_.fetch_add(1);
    auto it = std::prev(active_.end());
    Ending ending = Ending::kRefused;
    Status refused = supervisor_->admit(**it, &ending);
    if (!refused.ok()) {
      finishOp(it, std::move(refused), ending);
      continue;
    }
    resume(**it, now);
    if ((*it)->task.done() || !(*it)->failure().ok()) finishOp(it);
  }
  ops.clear();
  draining_ = std::move(ops);
  return true;
}

void Runtime::resume(Op& op, TimePoint now) {
  op.memory().activate();
  op.seen_ = op.completions_;
  std::coroutine_handle<> point = op.resumePoint_ ? op.resumePoint_ : op.task.handle();
  op.resumePoint_ = {};
  op.waiting_ = nullptr;
  op.resumedAt_ = now;
  point.resume();
}

bool Runtime::stepOps() {
  bool any = false;
  for (auto it = active_.begin(); it != active_.end();) {
    Op& op = **it;
    auto current = it++;
    if (!op.failure().ok()) {
      finishOp(current);
      any = true;
      continue;
    }
    if (op.waiting_ == nullptr || (op.completions_ == op.checked_ && !op.polls())) continue;
    op.checked_ = op.completions_;
    if (!op.waiting_->predicate_()) continue;
    resume(op, clock_.now());
    any = true;
    if (op.task.done() || !op.failure().ok()) finishOp(current);
  }
  return any;
}

void Runtime::endOps(const std::function<Status(const Op&)>& why, Ending ending) {
  for (auto it = active_.begin(); it != active_.end();) {
    auto current = it++;
    Status failure = why(**current);
    if (!failure.ok()) finishOp(current, std::move(failure), ending);
  }
}

void Runtime::finishOp(OpList::iterator it, Status error, Ending ending) {
  std::unique_ptr<Op> op = std::move(*it);
  spare_.splice(spare_.end(), active_, it);
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
  op->endsCleanly_ = ending == Ending::kRemoteRefusal;
  op->endedWith_ = error.kind;
  // Counted before anything the op holds is let go (a shared-memory turn: shm/shared_ring.h).
  if (error.kind == StatusKind::kMismatch && op->callCheck().on() && op->group().state) {
    op->group().state->countMismatch(op->sequence());
  }
  // What it holds is let go now, though its frame may outlive it (an orphan, below).
  if (OpHold* held = std::exchange(op->held_, nullptr)) held->opEnded();
  const TimePoint now = clock_.now();  // the one read of an op's end
  recorder_.ended(op->traceRecord, now, error.detail, error.ok() ? "" : pendingPeers(*op));
  {
    const double ran =
        op->deadline() == TimePoint{} ? 0.0 : secondsBetween(op->deadline() - op->timeout(), now);
    const Group& g = op->group();
    stats_.ended(g.id, g.name, g.rank, g.size, op->name(), op->sequence(),
                 op->callCheck().print().bytes(), ran, error.kind, now, error.detail);
  }
  if (!error.ok() && ending != Ending::kRefused) recorder_.writeOnFailure();
  std::vector<std::unique_ptr<Request>> pending = op->takePending();
  for (auto& req : pending) transport_->cancel(req.get());
  std::shared_ptr<Work> work = op->work;
  supervisor_->ended(*op, error, ending, where);
  if (allDone(pending)) {
    op.reset();  // destroys the coroutine frame (and scratch buffers) before anyone is told
  } else {
    orphans_.push_back(Orphaned{std::move(pending), std::move(op)});
    orphanCount_.store(orphans_.size());
  }
  if (!error.ok()) error.detail = "ddl: " + where + " " + error.detail;
  work->finish(std::move(error), now);
  // An op may wait on state another op releases (a group's shared windows): look again.
  for (auto& other : active_) other->checked_ = other->completions_ - 1;
}

void Runtime::countQuick(const Group& group, const CallPrint& print, uint32_t sequence,
                         std::chrono::milliseconds timeout, TimePoint began, TimePoint ended) {
  const char* name = collectiveName(print.collective);
  recorder_.completed(group.id, sequence, name, print, timeout, began, ended);
  stats_.countQuick();
  stats_.ended(group.id, group.name, group.rank, group.size, name, sequence, print.bytes(),
               secondsBetween(began, ended), StatusKind::kOk, ended);
}

bool Runtime::checkDeadlines() {
  bool woken = false;
  const TimePoint now = clock_.now();
  for (auto it = active_.begin(); it != active_.end();) {
    auto current = it++;
    Op& op = **current;
    if (op.wakeAt_ <= now) {  // what it waits for is looked at again in the next turn
      op.wakeAt_ = TimePoint::max();
      op.checked_ = op.completions_ - 1;
      woken = true;
    }
    if (now < op.deadline()) {
      if (!op.waitReports.sent && now >= op.halfway()) {
        op.waitReports.sent = true;
        supervisor_->halfway(op);
      }
      continue;
    }
    std::string why = op.describeTimeout
                          ? op.describeTimeout()
                          : "Timed out after " + std::to_string(op.timeout().count()) +
                                " ms: " + pendingPeers(op);
    const std::set<int> awaited = waitsOf(op).peers;
    finishOp(current,
             Status(StatusKind::kTimeout, why + waitChain(op, !op.describeTimeout),
                    std::vector<int>(awaited.begin(), awaited.end())),
             Ending::kTimeout);
  }
  std::erase_if(orphans_, [](const Orphaned& o) { return allDone(o.requests); });
  orphanCount_.store(orphans_.size());
  return woken;
}

TimePoint Runtime::pollSpinsUntil() const {
  TimePoint until = TimePoint::min();
  for (const auto& op : active_) until = std::max(until, op->pollSpinsUntil());
  return until;
}

TimePoint Runtime::nextTimer() const {
  TimePoint next = TimePoint::max();
  for (const auto& op : active_) {
    next = std::min(next, op->waitReports.sent ? op->deadline() : op->halfway());
    next = std::min(next, op->wakeAt_);
    if (op->polls()) next = std::min(next, clock_.now() + kHousekeeping);
  }
  if (!lost_.empty() && !active_.empty()) {
    next = std::min(next, clock_.now() + std::chrono::milliseconds(10));
  }
  if (!untold_.empty()) next = std::min(next, lost_.at(untold_.front()).since + kLostGrace);
  // What happened since the last housekeeping (a peer the transport found gone, among others)
  // is looked at one period later, as a running loop would.
  if (activeSinceHousekeeping_) next = std::min(next, lastHousekeeping_ + kHousekeeping);
  if (!orphans_.empty()) next = std::min(next, clock_.now() + std::chrono::seconds(1));
  next = std::min(next, supervisor_->nextHousekeeping());
  next = std::min(next, heartbeat_.next());
  // Deadlines are checked once a housekeeping period has passed since the last check.
  if (next != TimePoint::max()) {
    next = std::max(next, lastHousekeeping_ + kHousekeeping + std::chrono::nanoseconds(1));
  }
  return next;
}

bool Runtime::housekeep() {
  // As the wall clock is adjusted. A simulated rank's virtual time keeps the offset it started
  // with, so that its entries' times follow that time.
  if (&clock_ == &Clock::steady()) recorder_.setWallOffset(wallOffset(clock_));
  supervisor_->housekeep();
  const bool found = checkLiveness();
  const bool woken = checkDeadlines();
  return found || woken;
}

bool Runtime::turn(bool takeWaited) {
  bool busy = transport_->progress();
  busy |= drainSubmissions(takeWaited);
  busy |= stepOps();
  busy |= supervisor_->afterSteps();
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

bool Runtime::settle(TimePoint until) {
  int turns = 0;
  constexpr int kMaxTurns = 1 << 16;
  while (turns < kMaxTurns && !stopping_.load()) {
    ++turns;
    if (clock_.now() >= until) return false;
    if (turn()) continue;
    if (supervisor_->idle()) continue;  // no notice is left untaken
    if (hasSubmissions()) continue;     // submitted while the turn ended an op (a Work's hook)
    break;
  }
  return true;
}

void Runtime::requestStop() {
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    gLive.erase(this);
  }
  stopping_.store(true);
  wake();
}

void Runtime::stop() {
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    gLive.erase(this);
  }
  stopping_.store(true);
  if (drained_) return;
  drained_ = true;
  while (!active_.empty()) {
    finishOp(active_.begin(), Status(StatusKind::kClosed, "aborted: the engine was shut down"),
             Ending::kRefused);
  }
  if (supervisor_ != nullptr) supervisor_->stopped();
  heartbeat_.stop(*transport_);
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    for (auto& op : submitted_) {
      op->work->finish(Status(StatusKind::kClosed, "ddl: the engine was shut down"));
    }
    submitted_.clear();
    calls.swap(calls_);
    queued_.store(0);
  }
  for (auto& fn : calls) fn();
}

uint64_t Runtime::newIncarnation() {
  // splitmix64 of the address's hash and the count: distinct per process and per group made.
  uint64_t x = std::hash<std::string>{}(address_) + 0x9e3779b97f4a7c15ULL * ++incarnations_;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x == 0 ? 1 : x;
}

}  // namespace ddl
