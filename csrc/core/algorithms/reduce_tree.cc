// Binomial-tree reduce.
//
// Ranks are renumbered relative to the root (v = rank - root mod P).
// 1. For mask = 1, 2, 4, ...: if bit `mask` of v is set, send the partial result to v - mask
//    and stop; otherwise, if v + mask exists, receive its partial result and reduce it in.
// 2. The root (v = 0) ends with the reduction of all P inputs after ceil(log2 P) rounds.
// A rank with children accumulates in its own buffer (the root's output, else scratch), so no
// caller's input is modified.
#include <memory>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task reduceTree(Op& op, const void* in, void* out, size_t count, DataType type, ReduceOp reduce,
                int root) {
  const int n = op.size();
  const size_t bytes = count * elementSize(type);
  const bool isRoot = op.rank() == root;
  if (isRoot && bytes > 0 && out != in) co_await copyInTurns(op, out, in, bytes);
  if (n == 1 || count == 0) co_return;
  const int v = (op.rank() - root + n) % n;
  Memory& memory = op.memory();
  std::shared_ptr<char> accumulator, incoming = memory.allocate(bytes);
  const void* partial = isRoot ? out : in;
  uint32_t round = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++round) {
    if (v & mask) {
      int parent = (v - mask + root) % n;
      co_await op.all(op.send(parent, tag::slot(0, round), partial, bytes));
      break;
    }
    if (v + mask >= n) continue;
    if (!isRoot && !accumulator) {
      accumulator = memory.allocate(bytes);
      co_await copyInTurns(op, accumulator.get(), in, bytes);
      partial = accumulator.get();
    }
    int child = (v + mask + root) % n;
    co_await op.all(op.recv(child, tag::slot(0, round), incoming.get(), bytes));
    co_await reduceInTurns(op, type, reduce, const_cast<void*>(partial), incoming.get(), count);
  }
}

}  // namespace ddl
