// A small allreduce its caller waits for, on the caller's own thread, with no Op and no message:
// the one-step allreduce (algorithms/allreduce_staged.cc) run by the caller while it holds the
// runtime's turn (runtime/driver.h), where nothing else of the group is in flight. On a host
// whose ranks call allreduces back to back this is most of them; it costs a copy into the
// staging half, a flag, a look at the peers' flags and a reduction, where an op costs its Work,
// coroutine frames, call print and flight-recorder entries (docs/benchmarks.md).
//
// It is the same protocol as the op's, step for step: the same sequence number, staging count,
// ticket at the group's windows and header, so that ranks that take it and ranks that run the op
// (whose caller does not wait, or whose group has something else in flight) meet in the same
// buffers. Where the peers have not all staged within a spin (TORCH_DDL_SPIN_US), an op takes it
// over from there (allreduceOnceFrom): the deadline, the peers' deaths, mismatches and the words
// for each are the op's, as for any other.
#include <sched.h>

#include "../algorithms/algorithms.h"
#include "../base/config.h"
#include "../runtime/runtime.h"
#include "../shm/shared_ring.h"
#include "communicator.h"
#include "engine.h"
#include "notices.h"

namespace ddl {
namespace {

// Until every rank's flag reached `staging`, or `spin` passed: true when they all did. Polls
// without a pause at first (a peer a core away answers within a microsecond or two), then gives
// the core away between looks (a peer on this core must run to answer).
bool awaitStagings(const StageWindows& stage, uint64_t staging, const Clock& clock,
                   std::chrono::microseconds spin) {
  constexpr int kTightLooks = 256;
  for (int i = 0; i < kTightLooks; ++i) {
    if (onceArrived(stage, staging)) return true;
  }
  const TimePoint start = clock.now();
  while (!onceArrived(stage, staging)) {
    if (clock.now() - start >= spin) return false;
    sched_yield();
  }
  return true;
}

}  // namespace

std::shared_ptr<Work> Communicator::allreduceQuick(void* data, size_t count, DataType type,
                                                   ReduceOp reduce, CallOptions& options) {
  std::shared_ptr<Work> work;
  const char* name = collectiveName(Collective::kAllreduce);
  engine_->holdingTurn([&](Runtime& runtime) {
    const Group& group = *group_;
    // Nothing else of the group made: no op before it still to run, none after it that took a
    // number first. Nothing lost, the group usable, no notice early for this op.
    if (group.opsAlive.n.load(std::memory_order_acquire) != 0 || !runtime.lost().empty() ||
        !group.sharedRing) {
      return;
    }
    SharedRing& ring = *group.sharedRing;
    std::optional<uint32_t> lastMismatch;
    if (!group.state->usable(&lastMismatch) || ring.tickets != ring.serving ||
        !onceMayRun(ring, count * elementSize(type), lastMismatch)) {
      return;
    }
    uint64_t next = sequence_.load();
    const auto sequence = static_cast<uint32_t>(next);
    if (group.notices != nullptr && group.notices->early.count(sequence) > 0) return;
    if (!sequence_.compare_exchange_strong(next, next + 1)) return;  // another thread's op

    const Clock& clock = runtime.clock();
    const TimePoint began = clock.now();
    const CallPrint print = callPrint(Collective::kAllreduce, count, type, reduce);
    const uint64_t ticket = ring.tickets++;
    const uint64_t staging = onceStage(ring.stage, group.rank, sequence, data, count, type, reduce);
    if (awaitStagings(ring.stage, staging, clock, engine_->callerSpin()) &&
        onceAgrees(ring.stage, staging, group.rank)) {
      onceReduce(ring.stage, staging, data, count, type, reduce);
      ring.advance();
      // Started and ended here (a notice of it that comes later is not an early one); an op
      // that takes over is marked as it is taken in, as any other.
      if (group.notices != nullptr) group.notices->markStarted(sequence);
      work = options.work ? options.work : std::make_shared<Work>(name);
      const TimePoint now = clock.now();
      work->markStarted(began);
      work->finish(Status(), now);
      runtime.countQuick(group, print, sequence,
                         options.timeout.count() >= 0 ? options.timeout : timeout_, began, now);
      return;
    }
    // A peer has not come (or called something else): an op takes over from its staging.
    runtime.countHanded();
    work = startAt(sequence, &print, name, options, [&](Op& op) {
      op.callCheck().defer();
      return allreduceOnceFrom(op, data, count, type, reduce,
                               std::make_unique<SharedRingTurn>(ring, op, ticket), staging);
    });
  });
  return work;
}

}  // namespace ddl
