#include "ring_pipeline.h"

#include <algorithm>
#include <cstring>

#include "../base/tag.h"
#include "../reduce/reduce.h"
#include "message_link.h"

namespace ddl {
namespace {

// The last reduction of an allreduce goes into the buffer and on to the next inbox block by
// block, so that each block is copied while it is still in L1.
constexpr size_t kBlockBytes = 16 << 10;

// How many steps a position asks for at once, from the first step whose segments have not all
// arrived. Every position starts at step 0 and a step waits for the one before, so the steps of
// a ring stay close together: a window of 64 steps changes nothing for rings of up to 33
// positions (2 (n - 1) steps), and keeps a long ring's work per arrival, and the receives and
// requests it holds, independent of its length. What arrives for a later step waits in the
// transport until it is asked for. It also keeps the steps of a ring longer than the tag's step
// field holds apart where they wrap (tag::kMaxRanks).
constexpr int kExpectWindow = 64;
static_assert(kExpectWindow < static_cast<int>(tag::kMaxSteps));

}  // namespace

RingPipeline::RingPipeline(Op& op, RingSchedule schedule, void* buffer, DataType type,
                           ReduceOp reduce, size_t segmentElements, size_t depth,
                           std::unique_ptr<Link> link)
    : op_(op),
      schedule_(std::move(schedule)),
      link_(std::move(link)),
      buffer_(static_cast<char*>(buffer)),
      type_(type),
      reduce_(reduce),
      elementSize_(elementSize(type)) {
  const RingPlan& ring = schedule_.ring;
  int n = ring.length();
  position_ = ring.positionOf(op.rank());
  if (position_ < 0) throw Error("ddl: rank is not a member of its ring");
  if (!link_) {
    link_ = std::make_unique<MessageLink>(op, ring.order[(position_ + n - 1) % n],
                                          ring.order[(position_ + 1) % n], schedule_.phase,
                                          schedule_.stepBase, depth);
  }
  activity_ = link_->activity();
  if (link_->maxSegmentBytes() > 0) {
    segmentElements = std::min(segmentElements, link_->maxSegmentBytes() / elementSize_);
  }
  size_t largest = 0;
  for (const Range& c : schedule_.chunks) largest = std::max(largest, c.length);
  if (largest > 0 && schedule_.steps > 0) {
    segment_ = std::clamp<size_t>(segmentElements, 1, largest);
    segments_ = (largest + segment_ - 1) / segment_;
  }
  expected_.assign(schedule_.steps, 0);
  taken_.assign(schedule_.steps, 0);
  link_->begin(LinkGeometry{schedule_.steps, schedule_.reduceSteps, segments_,
                            segment_ * elementSize_, kExpectWindow});
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

// Segment k of step s arrived: reduce or store it, and post the result as segment k of step s+1
// (unless s is the last step). False, leaving everything as it was, while the outbox is full.
bool RingPipeline::handle(const Arrival& a) {
  const int n = schedule_.ring.length();
  const int s = a.step;
  const Range seg = segmentOf((chunkSentAt(s) + n - 1) % n, a.segment);
  const size_t bytes = seg.length * elementSize_;
  char* mine = at(seg.offset);
  const bool forwards = s + 1 < schedule_.steps;
  char* out = mine;
  if (forwards) {
    out = link_->outbox(mine, bytes, false);
    if (out == nullptr) return false;
  }
  Memory& memory = op_.memory();
  if (s < schedule_.reduceSteps) {
    if (out == mine) {
      memory.reduce(type_, reduce_, mine, a.data, seg.length, Operands::kDstFirst);
    } else if (s + 1 < schedule_.reduceSteps) {  // host memory: straight into the next inbox
      reduceTo(type_, reduce_, out, mine, a.data, seg.length);
    } else {  // final here: into the buffer, and on
      const size_t block = std::max<size_t>(kBlockBytes / elementSize_, 1);
      for (size_t i = 0; i < seg.length; i += block) {
        const size_t length = std::min(block, seg.length - i);
        const size_t offset = i * elementSize_;
        reduceTo(type_, reduce_, mine + offset, mine + offset, a.data + offset, length);
        std::memcpy(out + offset, mine + offset, length * elementSize_);
      }
    }
  } else {
    if (a.data != mine && bytes > 0) memory.copy(mine, a.data, bytes);
    if (out != mine && bytes > 0) memory.copy(out, a.data, bytes);
  }
  if (forwards) link_->post(s + 1, a.segment, out, bytes);
  link_->release(a);
  ++handled_;
  return true;
}

bool RingPipeline::move() {
  const int n = schedule_.ring.length();
  bool moved = true, paused = false;
  while (moved && !paused) {
    moved = false;
    link_->poll();
    // 1. New data enters the ring: this position's chunk of step 0. Before any receive is
    //    posted: a receive that fails at once (a peer's message of the wrong size) ends the op,
    //    which then posts nothing more, and the peer must still get what this rank sends.
    const int first = chunkSentAt(0);
    while (injected_ < segments_ && schedule_.steps > 0) {
      Range seg = segmentOf(first, injected_);
      const size_t bytes = seg.length * elementSize_;
      char* out = link_->outbox(at(seg.offset), bytes, true);
      if (out == nullptr) break;
      if (out != at(seg.offset) && bytes > 0) std::memcpy(out, at(seg.offset), bytes);
      link_->post(0, injected_, out, bytes);
      ++injected_;
      moved = true;
    }
    // 2. Ask for what each step will receive, as far as the link has room (the steps below
    //    expectFrom_ have asked for every segment), within the window.
    while (expectFrom_ < schedule_.steps && expected_[expectFrom_] >= segments_) ++expectFrom_;
    const int window = std::min(schedule_.steps, takenFrom_ + kExpectWindow);
    for (int s = expectFrom_; s < window; ++s) {
      const bool reducing = s < schedule_.reduceSteps;
      // Without scratch for any reducing step, on to the storing ones: asking each of up to a
      // window of reducing steps in turn, at every wake, was a fifth of a large simulation.
      if (reducing && !link_->reducingRoom()) {
        s = schedule_.reduceSteps - 1;
        continue;
      }
      const int chunk = (chunkSentAt(s) + n - 1) % n;
      while (expected_[s] < segments_) {
        Range seg = segmentOf(chunk, expected_[s]);
        if (!link_->expect(s, expected_[s], at(seg.offset), seg.length * elementSize_, reducing)) {
          break;
        }
        ++expected_[s];
        moved = true;
      }
    }
    // 3. Handle arrivals, earlier ones first; one whose forward finds no room waits.
    Arrival a;
    while (link_->arrival(&a)) {
      ++taken_[a.step];
      waiting_.push_back(a);
    }
    while (takenFrom_ < schedule_.steps && taken_[takenFrom_] >= segments_) ++takenFrom_;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (op_.turnDue()) {  // the rest in the op's next turn: heartbeats leave meanwhile
        op_.giveUpTurn();
        paused = true;
        break;
      }
      if (handle(*it)) {
        it = waiting_.erase(it);
        moved = true;
      } else {
        ++it;
      }
    }
  }
  const size_t total = static_cast<size_t>(schedule_.steps) * segments_;
  done_ = injected_ == segments_ && handled_ == total && link_->idle();
  stuckAt_ = done_ || paused || activity_ == nullptr ? -1 : *activity_;
  return done_;
}

Task runPipelines(Op& op, std::vector<std::unique_ptr<RingPipeline>> pipelines) {
  while (true) {
    bool done = true;
    for (auto& p : pipelines) done = p->advance() && done;
    if (done) break;
    co_await op.next();
  }
}

Task runPipelinesWindowed(Op& op, size_t count, size_t window,
                          std::function<std::unique_ptr<RingPipeline>(size_t)> make) {
  std::vector<std::unique_ptr<RingPipeline>> running;
  size_t next = 0;
  while (true) {
    while (running.size() < window && next < count) running.push_back(make(next++));
    bool done = true;
    for (auto& p : running) done = p->advance() && done;
    if (done && next == count) break;
    const size_t before = running.size();
    std::erase_if(running, [](const auto& p) { return p->done(); });
    if (running.size() < before && next < count) continue;  // room: make the next at once
    co_await op.next();
  }
}

Task runBlockPlan(Op& op, std::shared_ptr<const BlockPlan> plan,
                  std::function<std::unique_ptr<RingPipeline>(const BlockRing&)> make) {
  for (size_t stage = 0; stage < plan->stages.size(); ++stage) {
    const int ring = plan->stages[stage].ringOf[op.rank()];
    if (ring < 0) continue;
    co_await runPipelinesWindowed(
        op, plan->stages[stage].combinations, kRingWindow,
        [&, stage, ring](size_t q) { return make(plan->ring(stage, ring, q)); });
  }
}

}  // namespace ddl
