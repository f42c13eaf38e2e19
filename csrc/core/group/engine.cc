#include "engine.h"

#include <algorithm>

#include "../base/tag.h"
#include "../base/types.h"
#include "../transport/ucx/ucx_transport.h"

namespace ddl {

namespace {
std::mutex gEnginesMutex;
std::set<Engine*> gEngines;  // engines constructed and not yet destroyed
// The process-wide engine over UCX, shared by every process group of the process.
std::mutex gProcessMutex;
Engine* gProcessEngine = nullptr;
}  // namespace

Engine& Engine::process() {
  std::lock_guard<std::mutex> lock(gProcessMutex);
  if (gProcessEngine == nullptr) gProcessEngine = new Engine(std::make_unique<UcxTransport>());
  return *gProcessEngine;
}

void Engine::shutdownProcess() {
  std::lock_guard<std::mutex> lock(gProcessMutex);
  delete gProcessEngine;
  gProcessEngine = nullptr;
}

Engine::Engine(std::unique_ptr<Transport> transport, Drive drive, const Clock& clock,
               Memory* hostMemory, const Config* settings)
    : runtime_(std::move(transport), clock, hostMemory, settings ? *settings : ddl::config()),
      sharedBuffers_(std::make_shared<SharedBuffers>(&runtime_)) {
  runtime_.setSupervisor(&notices_);
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

namespace {

// Marks the owner's turn for its length (Drive::kExternal).
struct OwnerTurns {
  explicit OwnerTurns(bool& turning) : turning(turning) { turning = true; }
  ~OwnerTurns() { turning = false; }
  bool& turning;
};

}  // namespace

bool Engine::turn() {
  const OwnerTurns turns(turning_);
  return runtime_.turn();
}

bool Engine::settle(TimePoint until) {
  const OwnerTurns turns(turning_);
  return runtime_.settle(until);
}

bool Engine::holdingTurn(FunctionRef<void(Runtime&)> body) {
  if (driver_) return driver_->holdingTurn(body);
  if (!callersHold_ || turning_ || runtime_.stopping()) return false;
  body(runtime_);
  return true;
}

std::chrono::microseconds Engine::callerSpin() const {
  if (!driver_) return std::chrono::microseconds(0);
  return std::chrono::microseconds(runtime_.config().spinMicros);
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

void Engine::watch(const std::shared_ptr<const Group>& group, const Identities& identities) {
  if (identities.empty()) return;
  const ProcessIdentity me = ProcessIdentity::self();
  call([&] {
    for (const auto& [r, identity] : identities) {
      if (r >= 0 && r < group->size && r != group->rank && me.sameMachineAndNamespace(identity) &&
          identity.pid != me.pid) {
        runtime_.watch(group->peer(r), identity);
      }
    }
  });
}

namespace {

// The ids of the block of 2^wide ids `id` lies in.
std::vector<uint32_t> blockOf(uint32_t id, int wide) {
  std::vector<uint32_t> ids;
  for (uint32_t x = 0; x < (1u << wide); ++x) ids.push_back(id ^ x);
  return ids;
}

// The ids the agreements of a group of `wide` bits carry besides tag::kAgreementGroup.
bool agreementCarries(uint32_t id, int wide) {
  return id != tag::kAgreementGroup && (id ^ tag::kAgreementGroup) < (1u << wide);
}

}  // namespace

bool Engine::claimGroupId(uint32_t id, int wide) {
  std::lock_guard<std::mutex> lock(idsMutex_);
  const int reserved = std::max(wide, wides_.empty() ? 0 : *wides_.rbegin());
  const std::vector<uint32_t> block = blockOf(id, wide);
  for (uint32_t i : block) {
    if (groupIds_.count(i) > 0 || agreementCarries(i, reserved)) return false;
  }
  for (uint32_t i : groupIds_) {
    if (agreementCarries(i, wide)) return false;
  }
  groupIds_.insert(block.begin(), block.end());
  if (wide > 0) wides_.insert(wide);
  return true;
}

std::vector<bool> Engine::heldGroupIds() {
  std::vector<bool> held(tag::kMaxGroups, false);
  const TimePoint now = runtime_.clock().now();
  std::lock_guard<std::mutex> lock(idsMutex_);
  for (uint32_t id : groupIds_) held[id % tag::kMaxGroups] = true;
  std::erase_if(cooling_, [now](const auto& c) { return c.second <= now; });
  for (const auto& [id, until] : cooling_) held[id % tag::kMaxGroups] = true;
  const int reserved = wides_.empty() ? 0 : *wides_.rbegin();
  for (uint32_t id = tag::kAgreementBlock; id < tag::kMaxGroups; ++id) {
    if (agreementCarries(id, reserved)) held[id] = true;
  }
  return held;
}

bool Engine::holdAgreementIds(int wide, uint32_t* taken) {
  const TimePoint now = runtime_.clock().now();
  std::lock_guard<std::mutex> lock(idsMutex_);
  std::erase_if(cooling_, [now](const auto& c) { return c.second <= now; });
  for (uint32_t i = tag::kAgreementBlock; i < tag::kMaxGroups; ++i) {
    if (agreementCarries(i, wide) && (groupIds_.count(i) > 0 || cooling_.count(i) > 0)) {
      *taken = i;
      return false;
    }
  }
  wides_.insert(wide);
  return true;
}

void Engine::releaseAgreementIds(int wide) {
  std::lock_guard<std::mutex> lock(idsMutex_);
  if (auto it = wides_.find(wide); it != wides_.end()) wides_.erase(it);
}

void Engine::releaseGroupId(uint32_t id, int wide) {
  const TimePoint until = runtime_.clock().now() + GroupNotices::kGraveLife;
  std::lock_guard<std::mutex> lock(idsMutex_);
  for (uint32_t i : blockOf(id, wide)) {
    groupIds_.erase(i);
    cooling_[i] = until;
  }
  if (auto it = wides_.find(wide); wide > 0 && it != wides_.end()) wides_.erase(it);
}

void Engine::releaseGroupIdIfAlive(Engine* engine, uint32_t id, int wide) {
  std::lock_guard<std::mutex> live(gEnginesMutex);
  if (gEngines.count(engine) > 0) engine->releaseGroupId(id, wide);
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

}  // namespace ddl
