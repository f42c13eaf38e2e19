#include "dispatch.h"

#include "../base/config.h"
#include "../base/tag.h"
#include "../base/types.h"
#include "../runtime/runtime.h"

namespace ddl {

PipelineSettings pipelineSettings(const Op& op) {
  const Config& c = op.group().runtime->config();
  const bool host = op.memory().kind() == MemoryKind::kHost;
  return PipelineSettings{host ? c.segmentBytes : c.deviceSegmentBytes, c.pipelineDepth,
                          static_cast<int>(std::max<size_t>(c.rings, 1))};
}

namespace {

// The allreduce bodies, one per plan algorithm (the table below), over one call's arguments.
Task trivialBody(Op&, AllreduceCall) { co_return; }

Task recursiveDoublingBody(Op& op, AllreduceCall c) {
  if (op.callCheck().inlined()) {  // two ranks: the peer's data came with its call print
    const int peer = 1 - op.rank();
    co_await op.all(op.callCheck().printFrom(peer));
    op.memory().reduce(c.type, c.reduce, c.data, op.callCheck().inlinePayload(peer), c.count,
                       peer < op.rank() ? Operands::kSrcFirst : Operands::kDstFirst);
    co_return;
  }
  co_await allreduceRecursiveDoubling(op, c.data, c.count, c.type, c.reduce);
}

Task leadersBody(Op& op, AllreduceCall c) {
  co_await allreduceLeaders(op, c.data, c.count, c.type, c.reduce, c.plan);
}

Task ringBody(Op& op, AllreduceCall c) {
  c.settings.rings = c.plan->rings;
  co_await allreduceRing(op, c.data, c.count, c.type, c.reduce, c.settings);
}

Task multiDimBody(Op& op, AllreduceCall c) {
  co_await allreduceMultiDim(op, c.data, c.type, c.reduce, c.plan, c.settings);
}

Task sharedBody(Op& op, AllreduceCall c) {
  // Device memory moves through the transport only (the shared-memory paths are for host
  // memory): a shared plan, or a forced shm_ring, direct or staged, means the ring there.
  if (op.memory().kind() != MemoryKind::kHost) {
    co_await allreduceRing(op, c.data, c.count, c.type, c.reduce, c.settings);
    co_return;
  }
  if (!c.plan->adopts) c.adoptable = {};
  co_await allreduceShared(op, c.data, c.count, c.type, c.reduce, c.settings, *c.plan, c.adoptable);
}

// What each plan algorithm runs.
constexpr AllreduceEntry kAllreduceTable[] = {
    {AllreduceAlgorithm::kTrivial, &trivialBody},
    {AllreduceAlgorithm::kRecursiveDoubling, &recursiveDoublingBody},
    {AllreduceAlgorithm::kLeaders, &leadersBody},
    {AllreduceAlgorithm::kRing, &ringBody},
    {AllreduceAlgorithm::kMultiDim, &multiDimBody, true},
    {AllreduceAlgorithm::kShared, &sharedBody, true},
    {AllreduceAlgorithm::kSharedRing, &sharedBody, true},
    {AllreduceAlgorithm::kDirect, &sharedBody, true},
    {AllreduceAlgorithm::kStaged, &sharedBody, true},
};

// The table's entry for `algorithm` (nullptr: none).
const AllreduceEntry* entryOf(AllreduceAlgorithm algorithm) {
  for (const AllreduceEntry& e : kAllreduceTable) {
    if (e.algorithm == algorithm) return &e;
  }
  return nullptr;
}

}  // namespace

std::span<const AllreduceEntry> allreduceTable() { return kAllreduceTable; }

bool resyncsSharedWindows(const AllreducePlan& plan, MemoryKind memory) {
  if (memory != MemoryKind::kHost) return false;
  if (plan.algorithm == AllreduceAlgorithm::kMultiDim && !plan.hostSlots) return false;
  const AllreduceEntry* entry = entryOf(plan.algorithm);
  return entry != nullptr && entry->sharesWindows;
}

Task allreduceTask(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                   Adoptable adoptable, std::shared_ptr<const AllreducePlan> plan) {
  const AllreduceEntry* entry = entryOf(plan->algorithm);
  if (entry == nullptr) {
    throw Error(std::string("ddl: no allreduce runs a plan of ") + algorithmName(plan->algorithm));
  }
  // (A local, not a braced list inside co_await: GCC 12 miscompiles those in coroutines.)
  AllreduceCall call{data, count, type, reduce, adoptable, plan, pipelineSettings(op)};
  co_await entry->body(op, std::move(call));
  if (reduce == ReduceOp::kAvg) {
    co_await averageInTurns(op, type, data, count, static_cast<size_t>(op.size()));
  }
}

Task reduceScatterTask(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       std::shared_ptr<const BlockPlan> stages, AllgatherSchedule schedule) {
  const bool bruck =
      schedule == AllgatherSchedule::kBruck || schedule == AllgatherSchedule::kGridBruck;
  if (bruck && !stages->empty() && schedule == AllgatherSchedule::kGridBruck) {
    co_await reduceScatterGridBruck(op, data, count, type, reduce, stages);
  } else if (bruck) {
    co_await reduceScatterBruck(op, data, count, type, reduce);
  } else if (!stages->empty()) {
    co_await reduceScatterGrid(op, data, count, type, reduce, stages, pipelineSettings(op));
  } else {
    co_await reduceScatterRing(op, data, count, type, reduce, pipelineSettings(op));
  }
  if (reduce == ReduceOp::kAvg) {
    char* mine = static_cast<char*>(data) + op.rank() * count * elementSize(type);
    co_await averageInTurns(op, type, mine, count, static_cast<size_t>(op.size()));
  }
}

Task reduceTask(Op& op, const void* in, void* out, size_t count, DataType type, ReduceOp reduce,
                int root) {
  co_await reduceTree(op, in, out, count, type, reduce, root);
  if (reduce == ReduceOp::kAvg && op.rank() == root) {
    co_await averageInTurns(op, type, out, count, static_cast<size_t>(op.size()));
  }
}

// A collective's body, then the call check: the op completes only once every print it sent and
// asked for is done (a print that differs fails it as soon as it arrives: Op::observe). A body
// that decides how its call is checked (CallCheck::defer) starts or watches it itself.
Task checkedCall(Op& op, Task body) {
  if (!op.callCheck().deferred()) op.callCheck().start();
  co_await body;
  co_await op.until([&op] { return op.callCheck().done(); });
}

uint64_t pointToPointSlot(uint32_t userTag) {
  const uint32_t high = userTag >> tag::kSequenceBits;
  return tag::slot(tag::kPointToPointPhase + (high >> tag::kStepBits), high);
}

Task sendTask(Op& op, const void* data, size_t bytes, int peer, uint32_t userTag) {
  co_await op.all(op.send(peer, pointToPointSlot(userTag), data, bytes));
}

Task recvTask(Op& op, void* data, size_t bytes, int peer, uint32_t userTag) {
  uint64_t slot = pointToPointSlot(userTag);
  Request* r = peer >= 0 ? op.recvUpTo(peer, slot, data, bytes) : op.recvAny(slot, data, bytes);
  co_await op.all(r);
  op.work->setSource(op.sourceOf(r));
}

Task batchTask(Op& op, std::vector<Transfer> transfers) {
  std::vector<Request*> requests;
  requests.reserve(transfers.size());
  for (const Transfer& t : transfers) {
    const uint64_t slot = pointToPointSlot(t.userTag);
    requests.push_back(t.isSend ? op.sendUnder(t.userTag, t.peer, slot, t.data, t.bytes)
                                : op.recvUnder(t.userTag, t.peer, slot, t.data, t.bytes));
  }
  co_await op.all(std::move(requests));
}

}  // namespace ddl
