// What each collective runs: the body the communicator submits for it (group/communicator.h),
// from the plan or settings it was given to the algorithm files. Operation bodies are plain
// coroutine functions (never capturing lambdas): a coroutine's parameters live in its frame, a
// lambda's captures would die with the closure.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "algorithms.h"

namespace ddl {

// The pipeline settings of an op (its runtime's configuration; device memory has its own
// segment size).
PipelineSettings pipelineSettings(const Op& op);

// One allreduce call's arguments, as each algorithm's body takes them.
struct AllreduceCall {
  void* data;
  size_t count;
  DataType type;
  ReduceOp reduce;
  Adoptable adoptable;
  std::shared_ptr<const AllreducePlan> plan;
  PipelineSettings settings;
};
// The table of allreduce algorithms: a plan's algorithm and the body that runs it (UCC's
// ucc_tl_ucp_allreduce_algs[]). A new algorithm is a file of its own, an entry here and, for the
// planner to choose it, a builder and a cost in topology/.
struct AllreduceEntry {
  AllreduceAlgorithm algorithm;
  Task (*body)(Op& op, AllreduceCall call);
  // Over host memory, the body may use the group's shared-memory windows, and so resync them
  // after a mismatch (shm/shared_ring.h); the multi-dimensional plan where its host level does.
  bool sharesWindows = false;
};
std::span<const AllreduceEntry> allreduceTable();

// Whether an allreduce of `plan` over `memory` may resync the group's shared-memory windows
// after a mismatch (the table's sharesWindows): its call print then carries the latest
// mismatched op known (CallCheck::carryMismatches).
bool resyncsSharedWindows(const AllreducePlan& plan, MemoryKind memory);

// allreduce by the plan's algorithm, from the table (AVG divides at the end).
Task allreduceTask(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                   Adoptable adoptable, std::shared_ptr<const AllreducePlan> plan);
// reduce_scatter by the schedule the allgather of its block size takes (the two move the same
// messages, reversed): Bruck's rounds flat (kBruck) or per stage of the grid (kGridBruck, flat
// where there are no stages), else the grid's rings when there are stages, else the flat ring.
Task reduceScatterTask(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       std::shared_ptr<const BlockPlan> stages, AllgatherSchedule schedule);
Task reduceTask(Op& op, const void* in, void* out, size_t count, DataType type, ReduceOp reduce,
                int root);

// A collective's body, then the call check: the op completes only once every print it sent and
// asked for is done (a print that differs fails it as soon as it arrives: Op::observe).
Task checkedCall(Op& op, Task body);

// Point to point: messages under the user's 32-bit tag (base/tag.h).
uint64_t pointToPointSlot(uint32_t userTag);
Task sendTask(Op& op, const void* data, size_t bytes, int peer, uint32_t userTag);
// From `peer`, or from any rank (-1): the Work's source() names the sender.
Task recvTask(Op& op, void* data, size_t bytes, int peer, uint32_t userTag);
// One transfer of a point-to-point batch.
struct Transfer {
  bool isSend = true;
  void* data = nullptr;  // read by a send, written by a receive
  size_t bytes = 0;      // a receive takes at most this many
  int peer = 0;          // a rank of the group; a batch receives from named ranks only
  uint32_t userTag = 0;
};
// Every transfer posted at once in the order given, each under its own tag's sequence field.
Task batchTask(Op& op, std::vector<Transfer> transfers);

}  // namespace ddl
