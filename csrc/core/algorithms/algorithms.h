// Every algorithm, one per file, as a coroutine over an Op. Buffers are type-erased: a pointer,
// an element count and a DataType. Each algorithm is called by every rank of the group with
// arguments that agree (the communicator checks what it can before anything is sent).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "../base/task.h"
#include "../base/types.h"
#include "../runtime/op.h"
#include "../topology/allreduce_plan.h"
#include "../topology/block_plan.h"

namespace ddl {

// An ordinary allocation (the block holding a tensor) that allreduceShared may move into shared
// memory in place (SharedBuffers::adopt) before it offers the direct path.
struct Adoptable {
  void* base = nullptr;
  size_t bytes = 0;
};

struct PipelineSettings {
  size_t segmentBytes = 256 << 10;
  size_t depth = 4;
  int rings = 1;
};

// in_turns.cc: the op's Memory's reduce, copy and average, in blocks on the turning thread,
// giving up the turn between blocks once the op has held it for Op::kTurnSlice, so that a rank's
// heartbeats leave while it works through a large buffer slowly. Memory of a device is given to
// it whole (its kernels do not hold the turn).
Task reduceInTurns(Op& op, DataType type, ReduceOp reduce, void* dst, const void* src, size_t count,
                   Operands order = Operands::kDstFirst);
Task copyInTurns(Op& op, void* dst, const void* src, size_t bytes);
Task averageInTurns(Op& op, DataType type, void* data, size_t count, size_t divisor);

// Every other rank's address in one bulk lookup, before an algorithm sends to all of them (an
// all_to_all, a scatter's root): looked up one by one, the ranks of a group of 512 queued P^2
// requests at the store's one server (8 s), and a rank waiting its turn there sent no
// heartbeat, so that its watchers counted it gone.
inline void lookUpEveryPeer(Op& op) {
  std::vector<int> peers;
  for (int r = 0; r < op.size(); ++r) {
    if (r != op.rank()) peers.push_back(r);
  }
  op.group().directory->prefetch(peers);
}

// allreduce_ring.cc: data split across `rings` rings; each runs reduce-scatter then allgather.
Task allreduceRing(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                   PipelineSettings settings);

// allreduce_multidim.cc: the plan's lanes at once, each reduce-scattering stage by stage along
// its dimension order and gathering back in reverse (allreduce_plan.h).
Task allreduceMultiDim(Op& op, void* data, DataType type, ReduceOp reduce,
                       std::shared_ptr<const AllreducePlan> plan, PipelineSettings settings);

// allreduce_shared.cc: for ranks of one host, a plan of kShared, kSharedRing or kDirect. kShared:
// the direct allreduce below when every rank's tensor is in a shared buffer, else the ring through
// the group's shared-memory windows (shm/shared_ring.h), else (some rank cannot map its
// neighbour's window) the message ring above. Finding out costs a round of messages: kShared asks
// where the plan says (plan.asksDirect), and for smaller ones while the group's last answer was
// yes. kSharedRing and kDirect take that algorithm or fail on every rank.
Task allreduceShared(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                     PipelineSettings settings, const AllreducePlan& plan,
                     Adoptable adoptable = {});

struct SharedRing;
class SharedRingTurn;

// allreduce_staged.cc: each rank copies its tensor into a staging buffer every rank maps and
// reduces its chunk out of all of them, paced by flags in shared memory (no message). Holding the
// group's turn at its shared windows (released here), set up (ring.stage.ready).
Task allreduceStaged(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                     SharedRing& ring, SharedRingTurn& turn);

// The one-step allreduce (allreduce_staged.cc, plan.once): each rank copies its whole tensor into
// its staging half and raises its flag; once every rank's flag is up and every header says the
// same call, each reduces all the halves in rank order into its tensor (the same bits on every
// rank). The call is checked through the headers, with no print (CallCheck::watch). Holding the
// group's turn at its shared windows (released here), staging buffers set up and large enough.
// `staged`: the staging this rank already made (onceStage), else 0.
Task allreduceOnce(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                   SharedRing& ring, SharedRingTurn& turn, uint64_t staged = 0);
// The same, for an op that takes over a caller's one-step allreduce (Communicator's quick path)
// whose peers had not all come: its turn, taken by the caller, and its staging.
Task allreduceOnceFrom(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       std::unique_ptr<SharedRingTurn> turn, uint64_t staging);
// Its steps, for the caller's quick path (on the thread that holds the runtime's turn): stages
// this rank's tensor and header (the staging's number); whether every rank's flag is up; whether
// every header says this rank's call; the reduction.
// Whether the one-step allreduce may run now for `bytes`: the group's windows set up, staging
// halves large enough, no mending due after the group's latest mismatched op
// (GroupState::lastMismatch).
struct StageWindows;
bool onceMayRun(const SharedRing& ring, size_t bytes, std::optional<uint32_t> lastMismatch);
uint64_t onceStage(StageWindows& stage, int rank, uint32_t sequence, const void* data, size_t count,
                   DataType type, ReduceOp reduce);
bool onceArrived(const StageWindows& stage, uint64_t staging);
bool onceAgrees(const StageWindows& stage, uint64_t staging, int rank);
void onceReduce(const StageWindows& stage, uint64_t staging, void* data, size_t count,
                DataType type, ReduceOp reduce);

// allreduce_direct.cc: each rank reduces its chunk straight out of its peers' shared buffers.
// Called by allreduceShared while it holds the ring's turn, which it gives up; sets *used to
// false, having moved no data, when some rank's tensor is not in a shared buffer.
Task allreduceDirect(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                     SharedRing& ring, bool required, SharedRingTurn& turn, bool* used);

// allreduce_recursive_doubling.cc: log2(P) full exchanges; non-powers of two fold first. The
// second form runs among `ranks` only (others return at once), in tag steps from firstStep on.
Task allreduceRecursiveDoubling(Op& op, void* data, size_t count, DataType type, ReduceOp reduce);
Task recursiveDoublingAmong(Op& op, std::vector<int> ranks, void* data, size_t count, DataType type,
                            ReduceOp reduce, uint32_t firstStep);

// allreduce_leaders.cc: to each host's leader, recursive doubling among leaders, back (the
// plan's hosts).
Task allreduceLeaders(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                      std::shared_ptr<const AllreducePlan> plan);

// broadcast_tree.cc: segmented tree; `place` is this rank's (block_plan.h).
Task broadcastTree(Op& op, void* data, size_t bytes, TreePlace place, PipelineSettings settings);

// allgather_ring.cc: `out` holds size() blocks of `bytes`; block rank() is filled from `in`
// (unless `in` already points at it), the others arrive around the ring.
Task allgatherRing(Op& op, const void* in, void* out, size_t bytes, PipelineSettings settings);

// allgather_bruck.cc: the arguments of allgatherRing; ceil(log2 P) rounds.
Task allgatherBruck(Op& op, const void* in, void* out, size_t bytes);
// The same rounds per stage of the grid's allgather (block_plan.h), a position's blocks of every
// combination in one message.
Task allgatherGridBruck(Op& op, const void* in, void* out, size_t bytes,
                        std::shared_ptr<const BlockPlan> plan);

// allgather_grid.cc, reduce_scatter_grid.cc: level by level over a regular grid (block_plan.h):
// the arguments of allgatherRing and reduceScatterRing, and the stages.
Task allgatherGrid(Op& op, const void* in, void* out, size_t bytes,
                   std::shared_ptr<const BlockPlan> stages, PipelineSettings settings);
Task reduceScatterGrid(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       std::shared_ptr<const BlockPlan> stages, PipelineSettings settings);

// allgather_varying.cc: every rank contributes `bytes` of its own choosing; afterwards
// out->data holds all blocks in rank order, block r at [offsets[r], offsets[r + 1]).
struct VaryingBlocks {
  std::vector<size_t> offsets;
  std::vector<char> data;
};
Task allgatherVaryingRing(Op& op, const void* in, size_t bytes, std::shared_ptr<VaryingBlocks> out,
                          PipelineSettings settings);

// barrier_dissemination.cc: ceil(log2(P)) rounds of empty messages.
Task barrierDissemination(Op& op);

// monitored_barrier.cc: everyone reports to rank 0, which then releases everyone. A timeout
// names the lowest missing rank, or every missing rank when `waitAll`.
Task barrierMonitored(Op& op, bool waitAll);

// reduce_scatter_bruck.cc: Bruck's allgather run backwards, ceil(log2 P) rounds of at most two
// messages each way, for small blocks (the buffer's P blocks; block r is rank r's).
Task reduceScatterBruck(Op& op, void* data, size_t count, DataType type, ReduceOp reduce);
// The same rounds per stage of the grid's reduce-scatter (block_plan.h), a position's blocks of
// every combination in one message.
Task reduceScatterGridBruck(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                            std::shared_ptr<const BlockPlan> plan);

// reduce_scatter_ring.cc: `data` holds size() blocks of `count` elements; afterwards block
// rank() holds the reduction of every rank's block rank() (the other blocks are scratch).
Task reduceScatterRing(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       PipelineSettings settings);

// reduce_tree.cc: binomial-tree reduce to `root`. `out` is written at the root only and may
// alias `in`; `in` is never modified elsewhere.
Task reduceTree(Op& op, const void* in, void* out, size_t count, DataType type, ReduceOp reduce,
                int root);

// gather_scatter_linear.cc: the root exchanges one block of `bytes` with every rank directly.
// gather: `out` (root only) receives size() blocks, block r from rank r.
Task gatherLinear(Op& op, const void* in, void* out, size_t bytes, int root);
// gather_tree.cc: the same gather in ceil(log2 P) rounds of a binomial tree.
Task gatherTree(Op& op, const void* in, void* out, size_t bytes, int root);
// scatter: `in` (root only) holds size() blocks; rank r receives block r into `out`.
Task scatterLinear(Op& op, const void* in, void* out, size_t bytes, int root);

// alltoall_pairwise.cc: rank r sends bytes [sendOffsets[p], +sendBytes[p]) of `in` to rank p
// and receives rank p's block into [recvOffsets[p], +recvBytes[p]) of `out`, all at once.
struct AlltoallLayout {
  std::vector<size_t> sendOffsets, sendBytes, recvOffsets, recvBytes;
};
Task alltoallPairwise(Op& op, const void* in, void* out, AlltoallLayout layout);
// alltoall_bruck.cc: the same in ceil(log2 P) rounds, each block forwarded through the ranks
// between its sender and receiver (PlanBook::alltoallSchedule).
Task alltoallBruck(Op& op, const void* in, void* out, AlltoallLayout layout);

}  // namespace ddl
