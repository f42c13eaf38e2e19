#include "group_state.h"

#include "runtime.h"

namespace ddl {

void GroupState::recordFailure(const Status& status, bool remote) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!first_.status.ok()) return;
  first_ = Failure{status, remote};
}

void GroupState::countMismatch(uint32_t sequence) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!lastMismatch_ || opBefore(*lastMismatch_, sequence)) lastMismatch_ = sequence;
}

std::optional<uint32_t> GroupState::lastMismatch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lastMismatch_;
}

GroupState::Failure GroupState::firstFailure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_;
}

void GroupState::close(const Status& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (refusal_.ok()) refusal_ = reason;
}

void GroupState::fail(const Status& status, bool remote) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (first_.status.ok()) first_ = Failure{status, remote};
  if (refusal_.ok()) refusal_ = status.withDetail("the group failed earlier: " + status.detail);
}

void GroupState::noteGone(int rank, TimePoint when, int witness) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (gone_.emplace(rank, when).second && witness >= 0) witnesses_.emplace(rank, witness);
}

std::vector<int> GroupState::witnesses(int self) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> ranks;
  ranks.reserve(gone_.size());
  for (const auto& [rank, when] : gone_) {
    auto it = witnesses_.find(rank);
    ranks.push_back(it == witnesses_.end() ? self : it->second);
  }
  return ranks;
}

std::vector<int> GroupState::gone() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> ranks;
  for (const auto& [rank, when] : gone_) ranks.push_back(rank);
  return ranks;
}

std::optional<TimePoint> GroupState::goneSince(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = gone_.find(rank);
  if (it == gone_.end()) return std::nullopt;
  return it->second;
}

bool GroupState::usable(std::optional<uint32_t>* lastMismatch) const {
  std::lock_guard<std::mutex> lock(mutex_);
  *lastMismatch = lastMismatch_;
  return refusal_.ok();
}

Status GroupState::refusal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refusal_;
}

PeerId Group::peer(int r) const {
  auto it = peers.find(r);
  if (it != peers.end()) return it->second;
  if (r < 0 || r >= size) {
    throw Error("ddl: " + name + " has no rank " + std::to_string(r) + " (its size is " +
                std::to_string(size) + ")");
  }
  const std::string address = directory->address(r);
  if (address.empty()) {
    throw Error(Status(StatusKind::kOther,
                       "ddl: " + name + ": rank " + std::to_string(r) +
                           " cannot be reached from here (no address is known or found for it)",
                       {r}));
  }
  const PeerId id = runtime->connect(address);
  peers.emplace(r, id);
  return id;
}

PeerId Group::openPeer(int r) const {
  auto it = peers.find(r);
  return it == peers.end() ? -1 : it->second;
}

}  // namespace ddl
