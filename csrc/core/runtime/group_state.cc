#include "group_state.h"

#include "runtime.h"

namespace ddl {

void GroupState::recordFailure(const Status& status, bool remote) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!first_.status.ok()) return;
  first_ = Failure{status, remote};
}

void GroupState::countMismatch() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++mismatches_;
}

uint64_t GroupState::mismatches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mismatches_;
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

void GroupState::noteGone(int rank, TimePoint when) {
  std::lock_guard<std::mutex> lock(mutex_);
  gone_.emplace(rank, when);
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

Status GroupState::refusal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refusal_;
}

PeerId Group::peer(int r) const {
  PeerId& id = peers.at(static_cast<size_t>(r));
  if (id < 0) id = runtime->connect(addresses.at(static_cast<size_t>(r)));
  return id;
}

}  // namespace ddl
