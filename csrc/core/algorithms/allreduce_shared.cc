// Shared-memory ring allreduce: the ring of allreduce_ring.cc (the ring pipeline of
// ring_pipeline.h) over a SlotLink (algorithms/slot_link.h) instead of messages: every byte moves
// through the group's shared windows (shm/shared_ring.h) in user space, and messages only say
// which slot holds what and which slot is free again.
//
// What each rank does with a segment of step s (chunk c = r - s - 1 mod P) that arrives in its
// inbox, fused by the pipeline because the link has an outbox of its own:
//   s < P-2:        reduce own chunk c with the slot straight into a slot of the next inbox;
//   s == P-2:       reduce the slot into own chunk c (now final) and copy it to the next inbox;
//   P-2 < s < 2P-3: copy the slot into own chunk c and into the next inbox;
//   s == 2P-3:      copy the slot into own chunk c.
// No kernel copy and no staging on the receiving side: for two ranks this is the copy-based
// design of benchmarks/reference/shm_ring.cc.
//
// Paths, in order: the one-step allreduce (plan.once) where the windows are set up and need no
// mending (its call check deferred until then: allreduce_staged.cc); after a mismatch, the ranks
// agree again on the windows (resyncAfterMismatch); the group's windows are set up by the first
// allreduce that wants them (all ranks or none); an adoptable tensor is moved into shared memory
// here, holding the turn; the direct allreduce when every rank's tensor is shared (beyond what
// one step takes); else staged or the ring over the windows; else (some rank cannot map its
// neighbour's window) the message ring.
#include <algorithm>
#include <memory>

#include "../base/log.h"
#include "../base/tag.h"
#include "../runtime/runtime.h"
#include "../shm/shared_buffers.h"
#include "../shm/shared_ring.h"
#include "../topology/ring_plan.h"
#include "algorithms.h"
#include "ring_pipeline.h"
#include "slot_link.h"

namespace ddl {
namespace {

constexpr uint32_t kSlotNoticeStep = 3;  // and 4 for freed slots; 0-2 set up, 5-7 the direct path
// The staged allreduce's windows are set up in the phase's last three steps (the resync after a
// mismatch takes the two before them: shm/shared_ring.h).
constexpr uint32_t kStageSetUpStep = tag::kMaxSteps - 3;
static_assert(kResyncStep + 2 <= kStageSetUpStep);

std::string unavailable(AllreduceAlgorithm mode) {
  return std::string("TORCH_DDL_ALLREDUCE_ALGO=") + algorithmName(mode) +
         ", but not every rank of the group can map its neighbour's shared memory (ranks on other "
         "hosts, or UCX without a shared-memory transport); use auto or ring";
}

// The ring through the group's windows (ready), holding the turn.
Task slotRing(Op& op, void* data, size_t count, DataType type, ReduceOp reduce, SharedRing& ring,
              SharedRingTurn& turn) {
  const int n = op.size();
  const size_t es = elementSize(type);
  turn.setClean(false);  // from here on, bytes land in the next rank's inbox
  const int rank = op.rank();
  RingSchedule schedule;
  schedule.ring = naturalRing(n, false);
  schedule.steps = 2 * (n - 1);
  schedule.reduceSteps = n - 1;
  schedule.shift = 0;
  schedule.chunks = splitEven(count, n);
  auto link = std::make_unique<SlotLink>(op, ring.windows, (rank + n - 1) % n, (rank + 1) % n,
                                         count, tag::kSharedPhase, kSlotNoticeStep);
  SlotLink* slots = link.get();
  {
    RingPipeline pipeline(op, std::move(schedule), data, type, reduce, ring.windows.slotBytes / es,
                          ring.windows.slots, std::move(link));
    // The link's words on a timeout, for as long as it lives (however this scope is left).
    op.describeTimeout = [slots] { return slots->describeTimeout(); };
    struct Forget {
      Op& op;
      ~Forget() { op.describeTimeout = nullptr; }
    } forget{op};
    while (!pipeline.advance()) co_await op.next();
  }
  turn.release();
}

// Moves the block holding the tensor into shared memory, holding the turn (no earlier op of this
// group still writes the tensor).
void adopt(Op& op, Adoptable adoptable) {
  if (!op.group().buffers->adopt(adoptable.base, adoptable.bytes) && logs(LogLevel::kWarn)) {
    logLine(LogLevel::kWarn, op.group().name + " rank " + std::to_string(op.rank()) +
                                 ": a tensor of " + std::to_string(adoptable.bytes) +
                                 " bytes was not adopted into shared memory (no room in "
                                 "/dev/shm, or its memory cannot be remapped): its "
                                 "allreduces stay on the shared-memory ring");
  }
}

// Whether the allreduce first asks every rank whether its tensor is shared, to take the direct
// path: where forced, or for a large one, or while the group's last round found every tensor
// shared. Not for one small enough for one step (plan.once): copying it costs less than the
// direct path's two rounds of messages, and the staging buffers it needs are set up after.
bool asksDirect(const AllreducePlan& plan, const SharedRing& ring) {
  using A = AllreduceAlgorithm;
  return plan.algorithm == A::kDirect ||
         (plan.algorithm == A::kShared && !plan.once && (ring.lastAllShared || plan.asksDirect));
}

// Where the ranks cannot map each other's memory: messages.
Task unshared(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
              PipelineSettings settings, const AllreducePlan& plan) {
  if (plan.doublesUnshared) {
    co_await allreduceRecursiveDoubling(op, data, count, type, reduce);
  } else {
    co_await allreduceRing(op, data, count, type, reduce, settings);
  }
}

}  // namespace

Task allreduceShared(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                     PipelineSettings settings, const AllreducePlan& plan, Adoptable adoptable) {
  const AllreduceAlgorithm mode = plan.algorithm;
  const bool required = mode != AllreduceAlgorithm::kShared;
  const int n = op.size();
  if (n == 1 || count == 0) co_return;
  SharedRing& ring = *op.group().sharedRing;
  const size_t es = elementSize(type);
  std::unique_ptr<SharedRingTurn> held;
  if (op.callCheck().deferred()) {  // plan.once: decided holding the turn, as every rank does
    held = std::make_unique<SharedRingTurn>(ring, op);
    held->mendsAfterMismatch();
    co_await op.until([&held] { return held->ready(); });
    const auto lastMismatch = op.group().state ? op.group().state->lastMismatch() : std::nullopt;
    if (onceMayRun(ring, count * es, lastMismatch)) {
      co_await allreduceOnce(op, data, count, type, reduce, ring, *held);
      co_return;
    }
    op.callCheck().start();
  }
  if (ring.state == SharedRing::State::kUnavailable && !resyncDue(op, ring)) {
    if (held) held->release();
    if (required) throw Error(unavailable(mode));
    co_await unshared(op, data, count, type, reduce, settings, plan);
    co_return;
  }
  if (!held) held = std::make_unique<SharedRingTurn>(ring, op);
  SharedRingTurn& turn = *held;
  turn.mendsAfterMismatch();
  co_await op.until([&turn] { return turn.ready(); });
  if (ring.state == SharedRing::State::kBroken) throw Error(ring.broken);
  if (resyncDue(op, ring)) co_await resyncAfterMismatch(op, ring, naturalRing(n, false).order);
  if (ring.state == SharedRing::State::kUnknown) {
    std::vector<int> everyone = naturalRing(n, false).order;
    turn.setClean(false);  // a setup cut short leaves the ranks disagreeing on the windows
    co_await setUpRingWindows(op, ring.windows, std::move(everyone), settings, 0);
    turn.setClean(true);
    ring.state = ring.windows.ready ? SharedRing::State::kReady : SharedRing::State::kUnavailable;
  }
  if (ring.state == SharedRing::State::kUnavailable) {
    turn.release();
    if (required) throw Error(unavailable(mode));
    co_await unshared(op, data, count, type, reduce, settings, plan);
    co_return;
  }
  if (adoptable.base != nullptr) adopt(op, adoptable);
  if (asksDirect(plan, ring)) {
    bool used = false;
    co_await allreduceDirect(op, data, count, type, reduce, ring,
                             mode == AllreduceAlgorithm::kDirect, turn, &used);
    if (used) co_return;
  }
  if (plan.staged && !ring.stage.setUp) {
    turn.setClean(false);  // as the ring's setup
    co_await setUpStageWindows(op, ring.stage, op.group().runtime->config().stagedBytes,
                               kStageSetUpStep);
    turn.setClean(true);
  }
  if (plan.staged && ring.stage.ready && ring.stage.halfBytes >= es) {
    co_await allreduceStaged(op, data, count, type, reduce, ring, turn);
    co_return;
  }
  if (mode == AllreduceAlgorithm::kStaged) {
    turn.release();
    throw Error(
        "TORCH_DDL_ALLREDUCE_ALGO=staged, but not every rank of the group can map every "
        "other's staging buffer (see TORCH_DDL_DEBUG=WARN), or it is smaller than one element; "
        "use auto");
  }
  if (settings.segmentBytes < es) {  // slots too small for one element
    turn.release();
    co_await allreduceRing(op, data, count, type, reduce, settings);
    co_return;
  }

  co_await slotRing(op, data, count, type, reduce, ring, turn);
}

}  // namespace ddl
