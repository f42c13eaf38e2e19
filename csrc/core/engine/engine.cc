#include "engine.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <set>

#include "../types.h"
#include "config.h"

namespace ddl {

using Clock = std::chrono::steady_clock;

namespace {
std::mutex gLiveMutex;
std::set<Engine*> gLive;  // engines constructed and not yet stopped
}  // namespace

Engine::Engine(std::unique_ptr<Transport> transport)
    : transport_(std::move(transport)),
      sharedBuffers_(std::make_shared<SharedBuffers>(this)),
      address_(transport_->localAddress()),
      transportName_(transport_->name()),
      eventFd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (eventFd_ < 0) throw Error("ddl: eventfd failed");
  thread_ = std::thread([this] { run(); });
  std::lock_guard<std::mutex> lock(gLiveMutex);
  gLive.insert(this);
}

Engine::~Engine() {
  sharedBuffers_->detach();
  stop();
  transport_.reset();  // before orphans_: a transport may still report on them while closing
  close(eventFd_);
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    gLive.erase(this);
  }
  if (!thread_.joinable()) return;
  stopping_.store(true);
  wake();
  thread_.join();
}

void Engine::wake() {
  if (sleeping_.load()) {
    uint64_t one = 1;
    (void)!write(eventFd_, &one, sizeof(one));
  }
}

void Engine::submit(std::unique_ptr<Op> op) {
  if (stopping_.load()) {
    op->work->finish("ddl: " + op->name() + " submitted after the engine was shut down");
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
    op->work->finish("ddl: " + op->name() + " started after the engine was shut down");
    return;
  }
  engine->submit(std::move(op));
}

void Engine::call(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == thread_.get_id()) return fn();
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

std::vector<std::string> Engine::transportDevices() {
  std::vector<std::string> devices;
  call([&] { devices = transport_->devices(); });
  return devices;
}

std::vector<PeerId> Engine::connect(const std::vector<std::string>& addresses) {
  std::vector<PeerId> peers(addresses.size(), -1);
  call([&] {
    for (size_t i = 0; i < addresses.size(); ++i) {
      if (!addresses[i].empty()) peers[i] = transport_->connect(addresses[i]);
    }
  });
  return peers;
}

void Engine::watch(const std::vector<PeerId>& peers,
                   const std::vector<ProcessIdentity>& identities) {
  const ProcessIdentity me = ProcessIdentity::self();
  call([&] {
    for (size_t i = 0; i < peers.size() && i < identities.size(); ++i) {
      if (peers[i] >= 0 && me.sameMachineAndNamespace(identities[i]) &&
          identities[i].pid != me.pid) {
        watch_.watch(peers[i], identities[i]);
      }
    }
  });
}

std::string Engine::lostPeerOf(const Op& op) const {
  if (lost_.empty()) return "";
  const auto now = Clock::now();
  const Group& g = op.group();
  for (int r = 0; r < g.size; ++r) {
    if (r == g.rank) continue;
    auto it = lost_.find(g.peers[r]);
    if (it != lost_.end() && now - it->second.since >= kLostGrace) {
      return "rank " + std::to_string(r) + " is gone: " + it->second.why;
    }
  }
  return "";
}

bool Engine::checkLiveness() {
  bool found = false;
  for (auto& [peer, why] : watch_.poll()) {
    lost_.emplace(peer, Lost{why, Clock::now()});
    found = true;
  }
  for (auto& [peer, why] : transport_->lostPeers()) {
    lost_.emplace(peer, Lost{why, Clock::now()});
    found = true;
  }
  if (lost_.empty()) return found;
  for (auto it = active_.begin(); it != active_.end();) {
    auto current = it++;
    std::string why = lostPeerOf(**current);
    if (!why.empty()) finishOp(current, why);
  }
  return found;
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
    op->startClock();
    active_.push_back(std::move(op));
    activeCount_.fetch_add(1);
    auto it = std::prev(active_.end());
    std::string closed = (*it)->group().state->closed();
    if (!closed.empty()) {
      finishOp(it, closed);
      continue;
    }
    std::string lost = lostPeerOf(**it);
    if (!lost.empty()) {
      finishOp(it, lost);
      continue;
    }
    resume(**it);
    if ((*it)->task.done() || !(*it)->failure().empty()) finishOp(it, "");
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
    if (!op.failure().empty()) {
      finishOp(current, "");
      any = true;
      continue;
    }
    if (op.completions_ == op.checked_ || op.waiting_ == nullptr) continue;
    op.checked_ = op.completions_;
    if (!op.waiting_->predicate_()) continue;
    resume(op);
    any = true;
    if (op.task.done() || !op.failure().empty()) finishOp(current, "");
  }
  return any;
}

namespace {

bool allDone(const std::vector<std::unique_ptr<Request>>& requests) {
  return std::all_of(requests.begin(), requests.end(), [](auto& r) { return r->done; });
}

}  // namespace

void Engine::closeGroup(const std::shared_ptr<const Group>& group, const std::string& reason) {
  group->state->close(reason);
  call([&] {
    for (auto it = active_.begin(); it != active_.end();) {
      auto current = it++;
      if (&(*current)->group() == group.get()) finishOp(current, reason);
    }
  });
}

void Engine::finishOp(std::list<std::unique_ptr<Op>>::iterator it, std::string error,
                      bool timedOut) {
  std::unique_ptr<Op> op = std::move(*it);
  active_.erase(it);
  activeCount_.fetch_sub(1);
  std::string where = op->name() + " on " + op->group().name + " (rank " +
                      std::to_string(op->rank()) + " of " + std::to_string(op->size()) + ", op #" +
                      std::to_string(op->sequence()) + ")";
  if (error.empty() && !op->failure().empty()) error = op->failure();
  if (error.empty() && op->task.done()) {
    try {
      op->task.rethrow();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  std::vector<std::unique_ptr<Request>> pending = op->takePending();
  for (auto& req : pending) transport_->cancel(req.get());
  std::shared_ptr<Work> work = op->work;
  std::shared_ptr<GroupState> group = op->group().state;
  if (allDone(pending)) {
    op.reset();  // destroys the coroutine frame (and scratch buffers) before anyone is told
  } else {
    orphans_.push_back(Orphaned{std::move(op), std::move(pending)});
    orphanCount_.store(orphans_.size());
  }
  if (!error.empty()) {
    error = "ddl: " + where + " " + error;
    group->recordFailure(
        timedOut ? GroupState::Failure::kTimeout : GroupState::Failure::kCommunication, error);
  }
  work->finish(error);
  // An op may wait on state another op releases (a group's shared windows): look again.
  for (auto& other : active_) other->checked_ = other->completions_ - 1;
}

void Engine::checkDeadlines() {
  auto now = Clock::now();
  for (auto it = active_.begin(); it != active_.end();) {
    auto current = it++;
    Op& op = **current;
    if (now < op.deadline()) continue;
    std::string why = op.describeTimeout
                          ? op.describeTimeout()
                          : "Timed out after " + std::to_string(op.timeout().count()) +
                                " ms: " + op.pendingPeers();
    finishOp(current, why, true);
  }
  orphans_.erase(std::remove_if(orphans_.begin(), orphans_.end(),
                                [](const Orphaned& o) { return allDone(o.requests); }),
                 orphans_.end());
  orphanCount_.store(orphans_.size());
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
    if (!active_.empty()) {
      auto nearest = Clock::now() + std::chrono::hours(1);
      for (auto& op : active_) nearest = std::min(nearest, op->deadline());
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(nearest - Clock::now());
      timeoutMs = static_cast<int>(std::clamp<long>(wait.count() + 1, 0, 1000));
    } else if (!orphans_.empty()) {
      timeoutMs = 1000;
    }
    if (!lost_.empty() && !active_.empty()) timeoutMs = std::clamp(timeoutMs, 0, 10);
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

void Engine::run() {
  auto lastActivity = Clock::now();
  auto lastDeadlineCheck = lastActivity;
  while (true) {
    bool busy = transport_->progress();
    busy |= drainSubmissions();
    busy |= stepOps();
    auto now = Clock::now();
    if (now - lastDeadlineCheck > std::chrono::milliseconds(1)) {
      busy |= checkLiveness();
      checkDeadlines();
      lastDeadlineCheck = now;
    }
    if (stopping_.load()) break;
    if (busy) {
      lastActivity = now;
      continue;
    }
    if (now - lastActivity < std::chrono::microseconds(config().spinMicros)) {
      sched_yield();
      continue;
    }
    sleep();
    lastActivity = Clock::now();
  }
  while (!active_.empty()) finishOp(active_.begin(), "aborted: the engine was shut down");
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    for (auto& op : submitted_) op->work->finish("ddl: the engine was shut down");
    submitted_.clear();
    calls.swap(calls_);
  }
  for (auto& fn : calls) fn();
}

}  // namespace ddl
