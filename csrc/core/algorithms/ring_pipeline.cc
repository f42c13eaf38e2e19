#include "ring_pipeline.h"

#include <algorithm>

#include "../engine/tag.h"

namespace ddl {

RingPipeline::RingPipeline(Op& op, RingSchedule schedule, void* buffer, DataType type,
                           ReduceOp reduce, size_t segmentElements, size_t depth)
    : op_(op),
      schedule_(std::move(schedule)),
      buffer_(static_cast<char*>(buffer)),
      type_(type),
      reduce_(reduce),
      elementSize_(elementSize(type)),
      depth_(std::max<size_t>(depth, 1)) {
  const RingPlan& ring = schedule_.ring;
  int n = ring.length();
  position_ = ring.positionOf(op.rank());
  if (position_ < 0) throw Error("ddl: rank is not a member of its ring");
  next_ = ring.order[(position_ + 1) % n];
  prev_ = ring.order[(position_ + n - 1) % n];
  size_t largest = 0;
  for (const Range& c : schedule_.chunks) largest = std::max(largest, c.length);
  if (largest > 0 && schedule_.steps > 0) {
    segment_ = std::clamp<size_t>(segmentElements, 1, largest);
    segments_ = (largest + segment_ - 1) / segment_;
  }
  steps_.resize(schedule_.steps);
  if (schedule_.reduceSteps > 0 && segments_ > 0) {
    size_t slots = depth_ * static_cast<size_t>(std::min(schedule_.reduceSteps, 2));
    scratch_ = op.memory().allocate(slots * segment_ * elementSize_);
    for (size_t i = 0; i < slots; ++i) freeSlots_.push_back(static_cast<int>(i));
  }
}

int RingPipeline::chunkSentAt(int step) const {
  int n = schedule_.ring.length();
  return (((position_ - step + schedule_.shift) % n) + n) % n;
}

Range RingPipeline::segmentOf(int chunk, size_t k) const {
  const Range& c = schedule_.chunks[chunk];
  size_t begin = k * segment_;
  size_t length = begin < c.length ? std::min(segment_, c.length - begin) : 0;
  return Range{c.offset + std::min(begin, c.length), length};
}

bool RingPipeline::advance() {
  if (done_) return true;
  const int n = schedule_.ring.length();
  bool moved = true;
  while (moved) {
    moved = false;
    for (int s = 0; s < schedule_.steps; ++s) {
      Step& step = steps_[s];
      const bool reducing = s < schedule_.reduceSteps;
      // 1. Retire receives in the order they were posted.
      while (!step.inFlight.empty() && step.inFlight.front().request->done) {
        Posted& p = step.inFlight.front();
        if (reducing) {
          const char* incoming = scratch_.get() + p.slot * segment_ * elementSize_;
          op_.memory().reduce(type_, reduce_, at(p.segment.offset), incoming, p.segment.length);
          freeSlots_.push_back(p.slot);
        }
        step.inFlight.pop_front();
        ++step.completed;
        moved = true;
      }
      // 2. Send every segment whose previous step is complete.
      const int sendChunk = chunkSentAt(s);
      while (step.sent < segments_ && (s == 0 || step.sent < steps_[s - 1].completed)) {
        Range seg = segmentOf(sendChunk, step.sent);
        sends_.push_back(op_.send(next_, tag::slot(schedule_.phase, schedule_.stepBase + s),
                                  at(seg.offset), seg.length * elementSize_));
        ++step.sent;
        moved = true;
      }
      // 3. Keep `depth` receives posted.
      const int recvChunk = (sendChunk + n - 1) % n;
      while (step.posted < segments_ && step.inFlight.size() < depth_ &&
             (!reducing || !freeSlots_.empty())) {
        Range seg = segmentOf(recvChunk, step.posted);
        int slot = -1;
        char* target = at(seg.offset);
        if (reducing) {
          slot = freeSlots_.back();
          freeSlots_.pop_back();
          target = scratch_.get() + slot * segment_ * elementSize_;
        }
        Request* r = op_.recv(prev_, tag::slot(schedule_.phase, schedule_.stepBase + s), target,
                              seg.length * elementSize_);
        step.inFlight.push_back(Posted{r, slot, seg});
        ++step.posted;
        moved = true;
      }
    }
  }
  for (const Step& step : steps_) {
    if (step.completed < segments_ || step.sent < segments_) return false;
  }
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(), [](Request* r) { return r->done; }),
               sends_.end());
  done_ = sends_.empty();
  return done_;
}

}  // namespace ddl
