#include "message_link.h"

#include <algorithm>

#include "../base/tag.h"

namespace ddl {

MessageLink::MessageLink(Op& op, int prev, int next, uint32_t phase, uint32_t stepBase,
                         size_t depth)
    : op_(op),
      prev_(prev),
      next_(next),
      phase_(phase),
      stepBase_(stepBase),
      depth_(std::max<size_t>(depth, 1)) {}

MessageLink::~MessageLink() {
  for (StepQueue& q : inFlight_) {
    for (Posted& p : q) p.request->consumer = nullptr;
  }
  for (Request* r : sends_) r->consumer = nullptr;
}

void MessageLink::begin(const LinkGeometry& geometry) {
  const int window =
      geometry.window > 0 ? std::min(geometry.window, geometry.steps) : geometry.steps;
  inFlight_.resize(std::max(window, 1));
  slotBytes_ = geometry.segmentBytes;
  if (geometry.reduceSteps > 0 && geometry.segments > 0) {
    size_t slots = depth_ * static_cast<size_t>(std::min(geometry.reduceSteps, 2));
    scratch_ = op_.memory().allocate(slots * std::max<size_t>(slotBytes_, 1));
    for (size_t i = slots; i-- > 0;) freeSlots_.push_back(static_cast<int>(i));
  }
}

bool MessageLink::expect(int step, size_t segment, char* home, size_t bytes, bool reducing) {
  StepQueue& posted = queueOf(step);
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
  if (r->done) {  // it matched a message that had arrived
    ++ready_;
  } else {
    r->consumer = [](void* context) {
      auto* link = static_cast<MessageLink*>(context);
      ++link->ready_;
      ++*link->activity_;
    };
    r->consumerContext = this;
  }
  posted.push_back(Posted{r, segment, target, slot});
  if (lowest_ == highest_) lowest_ = highest_ = step;  // nothing posted: start afresh here
  lowest_ = std::min(lowest_, step);
  highest_ = std::max(highest_, step + 1);
  return true;
}

bool MessageLink::arrival(Arrival* out) {
  // Receives of one step complete in the order they were posted; earlier steps first. Without a
  // completed receive not yet handed over, nothing to look for.
  if (ready_ == 0) return false;
  while (lowest_ < highest_ && queueOf(lowest_).empty()) ++lowest_;
  for (int s = lowest_; s < highest_; ++s) {
    StepQueue& posted = queueOf(s);
    if (posted.empty() || !posted.front().request->done) continue;
    const Posted p = posted.front();
    *out = Arrival{s, p.segment, p.target, static_cast<uint64_t>(p.slot + 1)};
    posted.pop_front();
    while (lowest_ < highest_ && queueOf(lowest_).empty()) ++lowest_;  // see inFlight_
    --ready_;
    op_.recycle(p.request);
    return true;
  }
  return false;
}

void MessageLink::post(int step, size_t, char* at, size_t bytes) {
  Request* r =
      op_.send(next_, tag::slot(phase_, stepBase_ + static_cast<uint32_t>(step)), at, bytes);
  if (!r->done) {
    r->consumer = [](void* link) { ++*static_cast<MessageLink*>(link)->activity_; };
    r->consumerContext = this;
  }
  sends_.push_back(r);
  if (sends_.size() >= reapAt_) {
    reap();
    reapAt_ = std::max<size_t>(64, 2 * sends_.size());
  }
}

void MessageLink::release(const Arrival& arrival) {
  if (arrival.handle > 0) freeSlots_.push_back(static_cast<int>(arrival.handle - 1));
}

void MessageLink::reap() {
  std::erase_if(sends_, [this](Request* r) {
    if (!r->done) return false;
    op_.recycle(r);
    return true;
  });
}

bool MessageLink::idle() {
  reap();
  return sends_.empty();
}

}  // namespace ddl
