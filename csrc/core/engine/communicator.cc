#include "communicator.h"

#include <limits>

#include "../reduce/reduce.h"
#include "config.h"
#include "tag.h"

namespace ddl {
namespace {

PipelineSettings pipelineSettings() {
  const Config& c = config();
  return PipelineSettings{c.segmentBytes, c.pipelineDepth, static_cast<int>(c.rings)};
}

size_t checkedBytes(const std::string& where, size_t count, DataType type, size_t times = 1) {
  size_t es = elementSize(type);
  if (count > std::numeric_limits<size_t>::max() / es / std::max<size_t>(times, 1)) {
    throw Error(where + ": " + std::to_string(count) + " elements of " + dataTypeName(type) +
                " overflow the address space");
  }
  return count * es;
}

Task allreduceTask(Op& op, void* data, size_t count, DataType type, ReduceOp reduce) {
  const Config& c = config();
  size_t bytes = count * elementSize(type);
  bool small = c.allreduceAlgorithm == AllreduceAlgorithm::kRecursiveDoubling ||
               (c.allreduceAlgorithm == AllreduceAlgorithm::kAuto && bytes <= c.smallBytes);
  if (small) {
    co_await allreduceRecursiveDoubling(op, data, count, type, reduce);
  } else {
    co_await allreduceRing(op, data, count, type, reduce, pipelineSettings());
  }
  if (reduce == ReduceOp::kAvg) finishAverage(type, data, count, static_cast<size_t>(op.size()));
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(Engine& engine, KeyValueStore& store, int rank,
                                                   int size, std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("ddl: rank " + std::to_string(rank) + " is outside a group of size " +
                std::to_string(size));
  }
  if (static_cast<uint32_t>(size) > tag::kMaxRanks) {
    throw Error("ddl: groups are limited to " + std::to_string(tag::kMaxRanks) + " ranks");
  }
  auto group = std::make_shared<Group>();
  group->engine = &engine;
  group->rank = rank;
  group->size = size;
  if (rank == 0) {
    group->id = static_cast<uint32_t>(store.nextGroupNumber() % tag::kMaxGroups);
    store.set("ddl/group_id", std::to_string(group->id));
  } else {
    group->id = static_cast<uint32_t>(std::stoul(store.get("ddl/group_id")));
  }
  group->name = "group " + std::to_string(group->id);
  store.set("ddl/address/" + std::to_string(rank), engine.localAddress());
  std::vector<std::string> addresses(size);
  for (int r = 0; r < size; ++r) {
    if (r != rank) addresses[r] = store.get("ddl/address/" + std::to_string(r));
  }
  group->peers = engine.connect(addresses);
  return std::shared_ptr<Communicator>(new Communicator(std::move(group), timeout));
}

std::string Communicator::where(const char* name) const {
  return std::string("ddl: ") + name + " on " + group_->name + " (rank " +
         std::to_string(rank()) + " of " + std::to_string(size()) + ")";
}

std::shared_ptr<Work> Communicator::start(const char* name, CallOptions& options,
                                          const std::function<Task(Op&)>& body) {
  auto timeout = options.timeout.count() >= 0 ? options.timeout : timeout_;
  std::shared_ptr<Work> work = options.work ? options.work : std::make_shared<Work>(name);
  uint32_t sequence = static_cast<uint32_t>(sequence_.fetch_add(1));
  auto op = std::make_unique<Op>(group_, sequence, name, timeout, work);
  op->task = body(*op);
  group_->engine->submit(std::move(op));
  return work;
}

std::shared_ptr<Work> Communicator::allreduce(void* data, size_t count, DataType type,
                                              ReduceOp reduce, CallOptions options) {
  std::string bad = checkReduceOp(type, reduce);
  if (!bad.empty()) throw Error(where("allreduce") + ": " + bad);
  checkedBytes(where("allreduce"), count, type);
  return start("allreduce", options,
               [=](Op& op) { return allreduceTask(op, data, count, type, reduce); });
}

std::shared_ptr<Work> Communicator::broadcast(void* data, size_t count, DataType type, int root,
                                              CallOptions options) {
  if (root < 0 || root >= size()) {
    throw Error(where("broadcast") + ": root " + std::to_string(root) + " is not a rank of it");
  }
  size_t bytes = checkedBytes(where("broadcast"), count, type);
  return start("broadcast", options, [=](Op& op) {
    return broadcastTree(op, data, bytes, root, pipelineSettings());
  });
}

std::shared_ptr<Work> Communicator::allgather(const void* in, void* out, size_t count,
                                              DataType type, CallOptions options) {
  size_t bytes = checkedBytes(where("allgather"), count, type, static_cast<size_t>(size()));
  return start("allgather", options, [=](Op& op) {
    return allgatherRing(op, in, out, bytes, pipelineSettings());
  });
}

std::shared_ptr<Work> Communicator::barrier(CallOptions options) {
  return start("barrier", options, [](Op& op) { return barrierDissemination(op); });
}

}  // namespace ddl
