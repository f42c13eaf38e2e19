#include "message_link.h"

#include <algorithm>

#include "../engine/tag.h"

namespace ddl {

MessageLink::MessageLink(Op& op, int prev, int next, uint32_t phase, uint32_t stepBase,
                         size_t depth)
    : op_(op),
      prev_(prev),
      next_(next),
      phase_(phase),
      stepBase_(stepBase),
      depth_(std::max<size_t>(depth, 1)) {}

void MessageLink::begin(const LinkGeometry& geometry) {
  inFlight_.resize(geometry.steps);
  slotBytes_ = geometry.segmentBytes;
  if (geometry.reduceSteps > 0 && geometry.segments > 0) {
    size_t slots = depth_ * static_cast<size_t>(std::min(geometry.reduceSteps, 2));
    scratch_ = op_.memory().allocate(slots * std::max<size_t>(slotBytes_, 1));
    for (size_t i = slots; i-- > 0;) freeSlots_.push_back(static_cast<int>(i));
  }
}

bool MessageLink::expect(int step, size_t segment, char* home, size_t bytes, bool reducing) {
  std::deque<Posted>& posted = inFlight_[step];
  if (posted.size() >= depth_ || (reducing && freeSlots_.empty())) return false;
  int slot = -1;
  char* target = home;
  if (reducing) {
    slot = freeSlots_.back();
    freeSlots_.pop_back();
    target = scratch_.get() + static_cast<size_t>(slot) * slotBytes_;
  }
  Request* r =
      op_.recv(prev_, tag::slot(phase_, stepBase_ + static_cast<uint32_t>(step)), target, bytes);
  posted.push_back(Posted{r, segment, target, slot});
  lowest_ = std::min(lowest_, step);
  highest_ = std::max(highest_, step + 1);
  return true;
}

bool MessageLink::arrival(Arrival* out) {
  // Receives of one step complete in the order they were posted; earlier steps first.
  while (lowest_ < highest_ && inFlight_[lowest_].empty()) ++lowest_;
  for (size_t s = static_cast<size_t>(lowest_); s < static_cast<size_t>(highest_); ++s) {
    std::deque<Posted>& posted = inFlight_[s];
    if (posted.empty() || !posted.front().request->done) continue;
    const Posted& p = posted.front();
    *out = Arrival{static_cast<int>(s), p.segment, p.target, static_cast<uint64_t>(p.slot + 1)};
    posted.pop_front();
    return true;
  }
  return false;
}

void MessageLink::post(int step, size_t, char* at, size_t bytes) {
  sends_.push_back(
      op_.send(next_, tag::slot(phase_, stepBase_ + static_cast<uint32_t>(step)), at, bytes));
}

void MessageLink::release(const Arrival& arrival) {
  if (arrival.handle > 0) freeSlots_.push_back(static_cast<int>(arrival.handle - 1));
}

bool MessageLink::idle() {
  std::erase_if(sends_, [](Request* r) { return r->done; });
  return sends_.empty();
}

}  // namespace ddl
