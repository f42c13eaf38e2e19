#include "communicator.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "../algorithms/dispatch.h"
#include "../base/config.h"
#include "../base/log.h"
#include "../base/tag.h"
#include "../base/wire.h"
#include "../runtime/trace.h"
#include "../shm/shared_ring.h"
#include "agreement.h"
#include "link_probe.h"

namespace ddl {
namespace {

// False when `times` blocks of `count` elements of `type` do not fit in size_t.
bool fits(size_t count, DataType type, size_t times = 1) {
  return count <=
         std::numeric_limits<size_t>::max() / elementSize(type) / std::max<size_t>(times, 1);
}

}  // namespace

Communicator::Communicator(Engine& engine, std::shared_ptr<Group> group,
                           std::chrono::milliseconds timeout, std::shared_ptr<PlanBook> book)
    : engine_(&engine), group_(std::move(group)), timeout_(timeout), book_(std::move(book)) {}

Communicator::~Communicator() {
  Notices::close(group_->notices);
  if (ownsId_) {
    Engine::releaseGroupIdIfAlive(engine_, group_->id, tag::wideBits(group_->size));
  }
}

void Communicator::reject(const char* name, const std::string& why) noexcept {
  const auto sequence = static_cast<uint32_t>(sequence_.fetch_add(1));
  try {
    Notices::refuse(group_, sequence,
                    "rank " + std::to_string(rank()) + " refused its call to " + name + ": " + why);
  } catch (...) {  // out of memory: the others time out instead
  }
}

void Communicator::refuse(const char* name, const std::string& what) {
  reject(name, what);
  throw Error(where(name) + ": " + what, StatusKind::kInvalidArgument);
}

std::shared_ptr<Communicator> Communicator::create(Engine& engine,
                                                   std::shared_ptr<KeyValueStore> store, int rank,
                                                   int size, std::chrono::milliseconds timeout,
                                                   const Topology* simulated) {
  GroupOptions options;
  options.timeout = timeout;
  options.topology = simulated;
  return Creation::begin(engine, std::move(store), rank, size, options)->await();
}

void Communicator::nameGroup(Group& group, Engine& engine) {
  group.runtime = &engine.runtime();
  group.buffers = engine.sharedBuffers();
  group.name = "group " + std::to_string(group.id);
  engine.runtime().recorder().describeGroup(group.id, group.name, group.rank, group.size);
  group.sharedRing = std::make_shared<SharedRing>(group.runtime);
  group.sharedRing->releasedSeen = group.buffers->releasedSoFar();
}

void Communicator::logCreation(const char* how) const {
  if (!logs(LogLevel::kInfo)) return;
  logLine(LogLevel::kInfo, group_->name + " rank " + std::to_string(rank()) + " of " +
                               std::to_string(size()) + " " + how + ": " + topology().describe() +
                               "; links " + links().describe());
}

std::shared_ptr<Communicator> Communicator::shrink(const std::vector<int>& excluded,
                                                   bool abortFirst, bool requireQuorum) {
  return Derivation::shrink(*this, excluded, abortFirst, requireQuorum)->await();
}

std::shared_ptr<Communicator> Communicator::split(const std::vector<int>& ranks) {
  return Derivation::split(*this, ranks)->await();
}

std::shared_ptr<Communicator> Communicator::reconfigure(Engine& engine,
                                                        const std::vector<std::string>& handles,
                                                        int64_t uuid,
                                                        std::chrono::milliseconds timeout,
                                                        const LinkCosts* links) {
  return Derivation::reconfigure(engine, handles, uuid, timeout, links)->await();
}

uint32_t Communicator::nextAgreement(const char* what) {
  // From what the ranks share: the parent, the call, how many times it was made of the parent
  // before. Not from the request itself: ranks asked different things must meet to find out.
  const std::string key =
      std::to_string(group_->id) + "/" + what + "/" + std::to_string(derivations_[what]++);
  return static_cast<uint32_t>(std::hash<std::string>{}(key)&0xffff);
}

std::shared_ptr<const AllreducePlan> Communicator::allreducePlan(size_t count, DataType type) {
  auto plan = book_->allreduce(count, elementSize(type));
  if (logs(LogLevel::kInfo)) {  // once per size class (power of two) of this group
    const size_t bytes = count * elementSize(type);
    const uint64_t bit = uint64_t{1} << std::bit_width(bytes) % 64;
    if ((loggedSizes_.fetch_or(bit) & bit) == 0) {
      logLine(LogLevel::kInfo, group_->name + " rank " + std::to_string(rank()) +
                                   ": allreduce of " + std::to_string(bytes) +
                                   " bytes: " + plan->describe());
    }
  }
  return plan;
}

std::pair<int, int> Communicator::hostRings() {
  std::pair<int, int> counts{0, 0};
  engine_->call([&] {
    for (const auto& [key, windows] : group_->sharedRing->levelRings) {
      (windows.ready ? counts.first : counts.second)++;
    }
  });
  return counts;
}

std::shared_ptr<Work> Communicator::probe(const Topology& topology, LinkCosts* links) {
  auto work = std::make_shared<Work>("link probe");
  auto op = std::make_unique<Op>(group_, 0, "link probe", timeout_, work);
  op->task = probeLinks(*op, *engine_, topology, links);
  engine_->submit(std::move(op));
  return work;
}

void Communicator::close(const std::string& reason) {
  engine_->closeGroup(group_, Status(StatusKind::kClosed, reason));
}

std::string Communicator::where(const char* name) const {
  return std::string("ddl: ") + name + " on " + group_->name + " (rank " + std::to_string(rank()) +
         " of " + std::to_string(size()) + ")";
}

std::shared_ptr<Work> Communicator::start(const CallPrint& print, CallOptions& options,
                                          FunctionRef<Task(Op&)> body, const void* inlineData,
                                          size_t inlineBytes) {
  const CallPrint own = options.as ? callPrint(*options.as, options.asCount) : print;
  return startAt(static_cast<uint32_t>(sequence_.fetch_add(1)), &own,
                 collectiveName(own.collective), options, body, kNotPointToPoint, inlineData,
                 inlineBytes);
}

std::shared_ptr<Work> Communicator::startAt(uint32_t sequence, const CallPrint* print,
                                            const char* name, CallOptions& options,
                                            FunctionRef<Task(Op&)> body, int peer,
                                            const void* inlineData, size_t inlineBytes) {
  return startOn(group_, sequence, print, name, options, body, peer, inlineData, inlineBytes);
}

std::shared_ptr<Work> Communicator::startOn(const std::shared_ptr<const Group>& group,
                                            uint32_t sequence, const CallPrint* print,
                                            const char* name, CallOptions& options,
                                            FunctionRef<Task(Op&)> body, int peer,
                                            const void* inlineData, size_t inlineBytes) {
  auto timeout = options.timeout.count() >= 0 ? options.timeout : timeout_;
  std::shared_ptr<Work> work = options.work ? options.work : std::make_shared<Work>(name);
  if (logs(LogLevel::kTrace)) {
    logLine(LogLevel::kTrace, group->name + " rank " + std::to_string(rank()) + " op #" +
                                  std::to_string(sequence) + " " +
                                  (print != nullptr ? print->describe() : std::string(name)) +
                                  (peer >= 0 ? " with rank " + std::to_string(peer) : ""));
  }
  auto op = std::make_unique<Op>(group, sequence, name, timeout, work);
  op->setMemory(options.memory == MemoryKind::kHost ? engine_->hostMemory()
                                                    : memoryFor(options.memory, options.device));
  op->traceRecord = engine_->runtime().recorder().created(
      group->id, sequence, name, print != nullptr ? *print : CallPrint{}, peer != kNotPointToPoint,
      peer, timeout, engine_->runtime().clock().now());
  if (print != nullptr && size() > 1) {
    op->callCheck().set(*print);
    if (inlineBytes > 0) op->callCheck().setInline(inlineData, inlineBytes);
    op->task = checkedCall(*op, body(*op));
  } else {
    op->task = body(*op);
  }
  if (!options.deferStart) {
    engine_->submit(std::move(op), options.waited);
    return work;
  }
  Runtime* runtime = &engine_->runtime();
  auto held = std::make_shared<std::unique_ptr<Op>>(std::move(op));
  options.deferStart([runtime, held] { Runtime::submitIfAlive(runtime, std::move(*held)); });
  return work;
}

std::shared_ptr<Work> Communicator::allreduce(void* data, size_t count, DataType type,
                                              ReduceOp reduce, CallOptions options) {
  const char* name = collectiveName(Collective::kAllreduce);
  std::string bad = checkReduceOp(type, reduce);
  if (!bad.empty()) refuse(name, bad);
  checkedBytes(name, count, type);
  const Adoptable adoptable = options.adoptable;
  std::shared_ptr<const AllreducePlan> plan = options.plan;
  if (!plan) {
    plan = allreducePlan(count, type);
  } else if (plan->count != count || plan->elementSize != elementSize(type)) {
    refuse(name, "the plan given is for " + std::to_string(plan->count) + " elements of " +
                     std::to_string(plan->elementSize) + " bytes");
  } else if (!plan->checked) {
    try {
      checkPlan(*plan, size());
    } catch (const Error& e) {
      refuse(name, e.what());
    }
  }
  // Two ranks, a small host allreduce: its data rides in the call print.
  const size_t bytes = count * elementSize(type);
  const bool host = options.memory == MemoryKind::kHost;
  const bool carried = plan->algorithm == AllreduceAlgorithm::kRecursiveDoubling && size() == 2 &&
                       bytes > 0 && bytes <= CallCheck::kInlineMax && host &&
                       engine_->hostMemory().holdsBytes();
  // In one step where the group's windows allow it (decided holding its turn at them).
  // (Not a window's collective, whose print says what it is: group/window.h.)
  const bool once = plan->once && host && bytes > 0 && size() > 1 && !options.as;
  if (once && options.waited && !options.deferStart && reduce != ReduceOp::kAvg) {
    if (std::shared_ptr<Work> work = allreduceQuick(data, count, type, reduce, options)) {
      return work;
    }
  }
  return start(
      callPrint(Collective::kAllreduce, count, type, reduce), options,
      [=, carries = resyncsSharedWindows(*plan, options.memory)](Op& op) {
        if (carries) op.callCheck().carryMismatches();
        if (once) op.callCheck().defer();
        return allreduceTask(op, data, count, type, reduce, adoptable, plan);
      },
      carried ? data : nullptr, carried ? bytes : 0);
}

size_t Communicator::checkedBytes(const char* name, size_t count, DataType type, size_t times) {
  if (!fits(count, type, times)) {  // the message is built only when it is needed
    refuse(name, std::to_string(count) + " elements of " + dataTypeName(type) +
                     " overflow the address space");
  }
  return count * elementSize(type);
}

void Communicator::checkRoot(const char* name, int root) {
  if (root < 0 || root >= size())
    refuse(name, "rank " + std::to_string(root) + " is not a rank of it");
}

std::shared_ptr<Work> Communicator::broadcast(void* data, size_t count, DataType type, int root,
                                              CallOptions options) {
  const char* name = collectiveName(Collective::kBroadcast);
  checkRoot(name, root);
  size_t bytes = checkedBytes(name, count, type);
  return start(callPrint(Collective::kBroadcast, count, type, std::nullopt, root), options,
               [=, place = broadcastTreePlace(topology(), root, rank(), book_->hierarchical())](
                   Op& op) { return broadcastTree(op, data, bytes, place, pipelineSettings(op)); });
}

std::shared_ptr<Work> Communicator::allgather(const void* in, void* out, size_t count,
                                              DataType type, CallOptions options) {
  const char* name = collectiveName(Collective::kAllgather);
  size_t bytes = checkedBytes(name, count, type, static_cast<size_t>(size()));
  return start(
      callPrint(Collective::kAllgather, count, type), options,
      [=, schedule = book_->allgatherSchedule(bytes), stages = book_->blockStages(false)](Op& op) {
        switch (schedule) {
          case AllgatherSchedule::kBruck:
            return allgatherBruck(op, in, out, bytes);
          case AllgatherSchedule::kGridBruck:
            if (!stages->empty()) return allgatherGridBruck(op, in, out, bytes, stages);
            return allgatherBruck(op, in, out, bytes);
          case AllgatherSchedule::kGrid:
            if (!stages->empty()) {
              return allgatherGrid(op, in, out, bytes, stages, pipelineSettings(op));
            }
            break;
          case AllgatherSchedule::kRing:
            break;
        }
        return allgatherRing(op, in, out, bytes, pipelineSettings(op));
      });
}

std::shared_ptr<Work> Communicator::allgatherVarying(const void* in, size_t bytes,
                                                     std::shared_ptr<VaryingBlocks> out,
                                                     CallOptions options) {
  const char* name = collectiveName(Collective::kAllgatherVarying);
  if (!out) refuse(name, "no output blocks given");
  return start(callPrint(Collective::kAllgatherVarying), options, [=](Op& op) {
    return allgatherVaryingRing(op, in, bytes, out, pipelineSettings(op));
  });
}

std::shared_ptr<Work> Communicator::barrier(CallOptions options) {
  return start(callPrint(Collective::kBarrier), options,
               [](Op& op) { return barrierDissemination(op); });
}

std::shared_ptr<Work> Communicator::monitoredBarrier(bool waitAll, CallOptions options) {
  // A diagnostic with its own protocol and error words: no call check, no notices.
  return startAt(static_cast<uint32_t>(sequence_.fetch_add(1)), nullptr, "monitored_barrier",
                 options, [=](Op& op) { return barrierMonitored(op, waitAll); });
}

std::shared_ptr<Work> Communicator::reduceScatter(void* data, size_t count, DataType type,
                                                  ReduceOp reduce, CallOptions options) {
  const char* name = collectiveName(Collective::kReduceScatter);
  std::string bad = checkReduceOp(type, reduce);
  if (!bad.empty()) refuse(name, bad);
  checkedBytes(name, count, type, static_cast<size_t>(size()));
  const AllgatherSchedule schedule =
      book_->allgatherSchedule(count * elementSize(type), /*reduceScatter=*/true);
  return start(callPrint(Collective::kReduceScatter, count, type, reduce), options,
               [=, stages = book_->blockStages(true)](Op& op) {
                 return reduceScatterTask(op, data, count, type, reduce, stages, schedule);
               });
}

std::shared_ptr<Work> Communicator::reduce(const void* in, void* out, size_t count, DataType type,
                                           ReduceOp reduce, int root, CallOptions options) {
  const char* name = collectiveName(Collective::kReduce);
  std::string bad = checkReduceOp(type, reduce);
  if (!bad.empty()) refuse(name, bad);
  checkRoot(name, root);
  checkedBytes(name, count, type);
  return start(callPrint(Collective::kReduce, count, type, reduce, root), options,
               [=](Op& op) { return reduceTask(op, in, out, count, type, reduce, root); });
}

std::shared_ptr<Work> Communicator::gather(const void* in, void* out, size_t count, DataType type,
                                           int root, CallOptions options) {
  const char* name = collectiveName(Collective::kGather);
  checkRoot(name, root);
  size_t bytes = checkedBytes(name, count, type, static_cast<size_t>(size()));
  const bool tree = book_->gatherSchedule(bytes) == GatherSchedule::kTree;
  return start(
      callPrint(Collective::kGather, count, type, std::nullopt, root), options, [=](Op& op) {
        return tree ? gatherTree(op, in, out, bytes, root) : gatherLinear(op, in, out, bytes, root);
      });
}

std::shared_ptr<Work> Communicator::scatter(const void* in, void* out, size_t count, DataType type,
                                            int root, CallOptions options) {
  const char* name = collectiveName(Collective::kScatter);
  checkRoot(name, root);
  size_t bytes = checkedBytes(name, count, type, static_cast<size_t>(size()));
  return start(callPrint(Collective::kScatter, count, type, std::nullopt, root), options,
               [=](Op& op) { return scatterLinear(op, in, out, bytes, root); });
}

std::shared_ptr<Work> Communicator::alltoall(const void* in, void* out, AlltoallLayout layout,
                                             CallOptions options) {
  const char* name = collectiveName(Collective::kAlltoall);
  const size_t n = static_cast<size_t>(size());
  if (layout.sendOffsets.size() != n || layout.sendBytes.size() != n ||
      layout.recvOffsets.size() != n || layout.recvBytes.size() != n) {
    refuse(name, "the layout must name one block per rank");
  }
  return start(callPrint(Collective::kAlltoall), options,
               [=, schedule = book_->alltoallSchedule()](Op& op) {
                 if (schedule == AlltoallSchedule::kBruck) {
                   return alltoallBruck(op, in, out, layout);
                 }
                 return alltoallPairwise(op, in, out, layout);
               });
}

std::shared_ptr<Work> Communicator::send(const void* data, size_t bytes, int peer, uint32_t userTag,
                                         CallOptions options) {
  if (peer < 0 || peer >= size()) {  // point to point: outside the sequence, nobody to tell
    throw Error(where("send") + ": rank " + std::to_string(peer) + " is not a rank of it");
  }
  if (peer == rank()) throw Error(where("send") + ": a rank cannot send to itself");
  return startAt(
      userTag, nullptr, "send", options,
      [=](Op& op) { return sendTask(op, data, bytes, peer, userTag); }, peer);
}

std::shared_ptr<Work> Communicator::recv(void* data, size_t bytes, int peer, uint32_t userTag,
                                         CallOptions options) {
  if (peer < -1 || peer >= size()) {
    throw Error(where("recv") + ": rank " + std::to_string(peer) + " is not a rank of it");
  }
  if (peer == rank()) throw Error(where("recv") + ": a rank cannot receive from itself");
  return startAt(
      userTag, nullptr, "recv", options,
      [=](Op& op) { return recvTask(op, data, bytes, peer, userTag); }, peer);
}

std::shared_ptr<Work> Communicator::pointToPoint(std::vector<Transfer> transfers,
                                                 CallOptions options) {
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const char* what = t.isSend ? "send" : "recv";
    if (t.peer < 0 || t.peer >= size()) {
      throw Error(where("batch") + ": " + what + " " + std::to_string(i) + " names rank " +
                  std::to_string(t.peer) + ", not a rank of it" +
                  (t.peer == -1 && !t.isSend ? " (a batch receives from named ranks only)" : ""));
    }
    if (t.peer == rank()) {
      throw Error(where("batch") + ": " + what + " " + std::to_string(i) +
                  " names this rank; a rank cannot " + (t.isSend ? "send to" : "receive from") +
                  " itself");
    }
  }
  const uint32_t first = transfers.empty() ? 0 : transfers.front().userTag;
  return startAt(
      first, nullptr, "coalesced", options,
      [transfers = std::move(transfers)](Op& op) { return batchTask(op, transfers); }, -1);
}

}  // namespace ddl
