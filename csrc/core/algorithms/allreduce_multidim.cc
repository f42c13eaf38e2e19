// Multi-dimensional, multi-colour ring allreduce (PowerAI DDL), run from a plan
// (topology/allreduce_plan.h holds the vocabulary: dimension, stage, piece, lane).
//
// 1. Every lane (a contiguous share of the buffer) runs at once, each in its own tag phase.
// 2. A lane walks its stages in order: in each, this rank reduce-scatters, with the ranks of its
//    ring of that dimension, every piece it holds (one ring pipeline per piece, over messages);
//    a stage needs only what the previous one left here, so a rank moves on as soon as its own
//    rings are done. After the last stage this rank holds the full sum of its part.
// 3. The allgather runs the same rings backwards, last stage first, storing instead of reducing.
// 4. Waves of a lane keep their order on each rank: wave w starts a stage (of either half) only
//    once wave w-1 has finished it here, so the waves pipeline through the levels.
// 5. The host level (dimension 0) runs over shared-memory slots (algorithms/slot_link.h) when the
// plan
//    says so, the buffer is in host memory and the ring's ranks can map each other's windows;
//    every other level, and a host ring that cannot, over messages. Each host ring gets windows
//    of its own per half (reduce-scatter, allgather) and per first wave of a lane: waves of one
//    lane use a half's host stage one after another on every rank, but one wave may gather at
//    the host level while the next reduce-scatters there. Windows are set up by the first
//    allreduce that needs them (every ring member agrees, all or nothing) and kept by the group;
//    ops that use them take the group's turn (shm/shared_ring.h), as the one-host ring does.
// A slow level carries only what survived the levels below it: with H hosts of L ranks, the
// network stage moves 2N(H-1)/H bytes per host link and direction, where a flat ring moves
// 2N(P-1)/P; colours keep the host and network levels busy at the same time.
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "../base/tag.h"
#include "../shm/shared_ring.h"
#include "algorithms.h"
#include "ring_pipeline.h"
#include "slot_link.h"

namespace ddl {
namespace {

// Tag steps of the shared phase that set up host rings: 0-7 belong to the one-host ring and the
// direct path (allreduce_shared.cc); each host ring takes three, below kResyncStep.
constexpr uint32_t kFirstSetUpStep = 8;

// A host-level ring this rank runs, where its windows are kept, and the tag steps of its set-up
// (numbered over the whole plan, so every member of the ring numbers it alike).
struct HostRing {
  int lane;
  int stage;
  int ring;
  bool gathering;
  std::string key;
  uint32_t setUpStep;
};

int firstWave(const AllreducePlan& plan, int lane) {
  while (plan.lanes[lane].after >= 0) lane = plan.lanes[lane].after;
  return lane;
}

std::vector<HostRing> hostRings(const AllreducePlan& plan, int rank) {
  std::vector<HostRing> out;
  uint32_t index = 0;  // the plan's host rings before this stage's, each twice (both halves)
  for (int l = 0; l < static_cast<int>(plan.lanes.size()); ++l) {
    const Lane& lane = plan.lanes[l];
    for (int s = 0; s < static_cast<int>(lane.stages.size()); ++s) {
      const Stage& stage = lane.stages[s];
      if (stage.dimension != 0) continue;
      for (const uint32_t r : ringsWith(stage, rank)) {
        const std::vector<int>& order = stage.rings[r].order;
        if (order.size() < 2) continue;
        for (bool gathering : {false, true}) {
          const uint32_t step = kFirstSetUpStep + 3 * (index + 2 * r + (gathering ? 1 : 0));
          std::string key = std::to_string(firstWave(plan, l)) + (gathering ? "g" : "r") +
                            std::to_string(r) + ":";
          for (int member : order) key += std::to_string(member) + ",";
          out.push_back(HostRing{l, s, static_cast<int>(r), gathering, std::move(key), step});
        }
      }
      index += 2 * static_cast<uint32_t>(stage.rings.size());
    }
  }
  if (kFirstSetUpStep + 3 * index > kResyncStep) {
    throw Error("a plan of more host rings than the shared phase's tag steps hold");
  }
  return out;
}

// The ranks of this rank's host (its host rings' members), in rank order.
std::vector<int> hostMembers(const AllreducePlan& plan, const std::vector<HostRing>& host) {
  std::set<int> members;
  for (const HostRing& h : host) {
    const std::vector<int>& order = plan.lanes[h.lane].stages[h.stage].rings[h.ring].order;
    members.insert(order.begin(), order.end());
  }
  return std::vector<int>(members.begin(), members.end());
}

class LaneRun {
 public:
  // `windows(stage, ring, gathering)`: the ready slot windows of a host ring of this lane, or null.
  using Windows = std::function<SlotWindows*(int, int, bool)>;
  LaneRun(Op& op, const Lane& lane, const LaneRun* before, void* data, DataType type,
          ReduceOp reduce, const PipelineSettings& settings, uint64_t elements, Windows windows)
      : op_(op),
        lane_(lane),
        stages_(static_cast<int>(lane.stages.size())),
        before_(before),
        data_(data),
        type_(type),
        reduce_(reduce),
        settings_(settings),
        elements_(elements),
        windows_(std::move(windows)) {}

  bool done() const { return turn_ >= 2 * stages_; }

  // True once both halves of every stage are done here.
  bool advance() {
    while (turn_ < 2 * stages_) {
      if (!started_) {
        if (before_ != nullptr && !before_->done() && before_->turn_ <= turn_) {
          return false;  // the wave ahead first
        }
        start(turn_ < stages_ ? turn_ : 2 * stages_ - 1 - turn_, turn_ < stages_);
      }
      // No link of this stage has seen a request complete since none of its pipelines could
      // move: none can (found without touching them).
      if (stuckAt_ >= 0 && completions() == stuckAt_) return false;
      // Those done leave the list that is walked (a multi-lane op wakes here for every message
      // of any lane, and walking the done ones was most of this function's time).
      size_t moving = 0;
      for (RingPipeline* p : active_) {
        if (!p->advance()) active_[moving++] = p;
      }
      active_.resize(moving);
      if (moving > 0) {
        stuckAt_ = counted_ && !op_.turnGivenUp() ? completions() : -1;
        return false;
      }
      pipelines_.clear();
      active_.clear();
      started_ = false;
      ++turn_;
    }
    return true;
  }

 private:
  int64_t completions() const {
    int64_t sum = 0;
    for (size_t i = 0; i < pipelines_.size(); ++i) sum += counts_[i];
    return sum;
  }

  void start(int stage, bool reducing) {
    started_ = true;
    stuckAt_ = -1;
    const size_t es = elementSize(type_);
    const std::vector<StageRing>& rings = lane_.stages[stage].rings;
    for (const uint32_t index : ringsWith(lane_.stages[stage], op_.rank())) {
      const int r = static_cast<int>(index);
      const StageRing& ring = rings[index];
      const int position = RingPlan{ring.order}.positionOf(op_.rank());
      if (position < 0) continue;
      const int n = static_cast<int>(ring.order.size());
      RingSchedule schedule;
      schedule.ring = RingPlan{ring.order};
      schedule.phase = lane_.phase;
      schedule.steps = n - 1;
      schedule.chunks = ring.chunks;
      if (reducing) {  // position p ends holding chunk p
        schedule.stepBase = ring.firstStep;
        schedule.reduceSteps = n - 1;
        schedule.shift = -1;
      } else {  // position p starts holding chunk p
        schedule.stepBase = ring.firstStep + static_cast<uint32_t>(n - 1);
        schedule.reduceSteps = 0;
        schedule.shift = 0;
      }
      std::unique_ptr<Link> link;
      if (SlotWindows* w = windows_(stage, r, !reducing)) {
        // Notices in the ring's first tag step, freed slots in the next: the halves of a ring
        // follow each other on every member, and one sender's messages of a tag keep their order.
        link = std::make_unique<SlotLink>(op_, *w, ring.order[(position + n - 1) % n],
                                          ring.order[(position + 1) % n], elements_, lane_.phase,
                                          ring.firstStep);
      }
      pipelines_.push_back(std::make_unique<RingPipeline>(op_, std::move(schedule), data_, type_,
                                                          reduce_, settings_.segmentBytes / es,
                                                          settings_.depth, std::move(link)));
    }
    for (const std::unique_ptr<RingPipeline>& p : pipelines_) active_.push_back(p.get());
    counted_ = pipelines_.size() <= counts_.size();
    for (size_t i = 0; counted_ && i < pipelines_.size(); ++i) {
      counted_ = pipelines_[i]->countInto(&counts_[i]);
    }
  }

  Op& op_;
  const Lane& lane_;
  int stages_;
  const LaneRun* before_;
  void* data_;
  DataType type_;
  ReduceOp reduce_;
  PipelineSettings settings_;
  uint64_t elements_;
  Windows windows_;
  int turn_ = 0;  // stages reduce-scattered so far, then plus those gathered
  bool started_ = false;
  std::vector<std::unique_ptr<RingPipeline>> pipelines_;
  std::vector<RingPipeline*> active_;  // pipelines_ not yet done, in order
  // The stage's links' completions, counted here side by side (where every link counts them);
  // their sum when the stage last could not move (-1: look again). A LaneRun does not move once
  // its pipelines count into it.
  std::array<int64_t, 4> counts_{};
  bool counted_ = false;
  int64_t stuckAt_ = -1;
};

}  // namespace

Task allreduceMultiDim(Op& op, void* data, DataType type, ReduceOp reduce,
                       std::shared_ptr<const AllreducePlan> plan, PipelineSettings settings) {
  // The host level over shared memory: this rank's host rings, their windows set up once.
  std::vector<HostRing> host;
  if (plan->hostSlots && op.memory().kind() == MemoryKind::kHost &&
      settings.segmentBytes >= elementSize(type)) {
    host = hostRings(*plan, op.rank());
  }
  std::optional<SharedRingTurn> turn;
  std::map<std::tuple<int, int, int, bool>, SlotWindows*> ready;  // lane, stage, ring, gathering
  if (!host.empty()) {
    SharedRing& shared = *op.group().sharedRing;
    turn.emplace(shared, op);
    turn->mendsAfterMismatch();
    co_await op.until([&turn] { return turn->ready(); });
    if (shared.state == SharedRing::State::kBroken) throw Error(shared.broken);
    if (resyncDue(op, shared)) co_await resyncAfterMismatch(op, shared, hostMembers(*plan, host));
    turn->setClean(false);  // setting up windows, then writing into them
    for (const HostRing& h : host) {
      auto it = shared.levelRings.find(h.key);
      if (it == shared.levelRings.end()) {
        it = shared.levelRings.emplace(h.key, SlotWindows{}).first;
        std::vector<int> order = plan->lanes[h.lane].stages[h.stage].rings[h.ring].order;
        co_await setUpRingWindows(op, it->second, std::move(order), settings, h.setUpStep);
      }
      if (it->second.ready) {
        ready[{h.lane, h.stage, h.ring, h.gathering}] = &it->second;
      }
    }
  }
  // Side by side (every lane is looked at on every wake); reserved: a lane points at the one
  // before it.
  std::vector<LaneRun> lanes;
  lanes.reserve(plan->lanes.size());
  for (int l = 0; l < static_cast<int>(plan->lanes.size()); ++l) {
    const Lane& lane = plan->lanes[l];
    const LaneRun* before = lane.after >= 0 ? &lanes[lane.after] : nullptr;
    auto windows = [&ready, l](int stage, int ring, bool gathering) -> SlotWindows* {
      auto it = ready.find({l, stage, ring, gathering});
      return it == ready.end() ? nullptr : it->second;
    };
    lanes.emplace_back(op, lane, before, data, type, reduce, settings, plan->count, windows);
  }
  while (true) {
    bool done = true;
    // In lane order, so that a wave that frees the stage for the next one lets it start now.
    for (LaneRun& lane : lanes) done = lane.advance() && done;
    if (done) break;
    co_await op.next();
  }
  if (turn) turn->release();
}

}  // namespace ddl
