// Hierarchical latency allreduce for small messages across hosts: one message per rank inside
// each host, recursive doubling among one leader per host, one message back.
//
// 1. Every rank of a host but its leader (the host's lowest rank) sends its buffer to the leader,
//    which reduces them in, in rank order.
// 2. The leaders run recursive doubling among themselves (allreduce_recursive_doubling.cc): the
//    network carries one buffer per host and round, where recursive doubling over every rank
//    carries one per rank.
// 3. Each leader sends the result to the ranks of its host. Every rank ends with the bytes its
//    leader computed, and the leaders' exchange is symmetric, so all agree bitwise.
#include <algorithm>
#include <memory>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task allreduceLeaders(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                      std::shared_ptr<const AllreducePlan> plan) {
  if (op.size() == 1 || count == 0) co_return;
  const size_t bytes = count * elementSize(type);
  constexpr uint32_t kGather = 0, kSpread = 1, kLeaders = 2;
  // The rank's host by index, not by a search of every host: O(1) a rank, where the search was
  // O(P) a rank (O(P^2) in a simulation of the whole group: 81 % of a 69 632-rank run's time).
  const int index = static_cast<size_t>(op.rank()) < plan->hostOf.size()
                        ? plan->hostOf[static_cast<size_t>(op.rank())]
                        : -1;
  if (index < 0) throw Error("ddl: the leaders' plan has no host for this rank");
  const std::vector<int>* host = &plan->hosts[static_cast<size_t>(index)];
  const int leader = host->front();
  if (op.rank() != leader) {
    co_await op.all(op.send(leader, tag::slot(0, kGather), data, bytes));
    co_await op.all(op.recv(leader, tag::slot(0, kSpread), data, bytes));
    co_return;
  }
  const size_t members = host->size();
  if (members > 1) {
    std::shared_ptr<char> scratch = op.memory().allocate((members - 1) * bytes);
    std::vector<Request*> arrivals;
    for (size_t i = 1; i < members; ++i) {
      arrivals.push_back(
          op.recv((*host)[i], tag::slot(0, kGather), scratch.get() + (i - 1) * bytes, bytes));
    }
    co_await op.all(arrivals);
    for (size_t i = 1; i < members; ++i) {
      co_await reduceInTurns(op, type, reduce, data, scratch.get() + (i - 1) * bytes, count);
    }
  }
  co_await recursiveDoublingAmong(op, plan->leaders, data, count, type, reduce, kLeaders);
  std::vector<Request*> spread;
  for (size_t i = 1; i < members; ++i) {
    spread.push_back(op.send((*host)[i], tag::slot(0, kSpread), data, bytes));
  }
  co_await op.all(spread);
}

}  // namespace ddl
