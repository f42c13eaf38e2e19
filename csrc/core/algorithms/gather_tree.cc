// Binomial-tree gather.
//
// Ranks are renumbered relative to the root (v = rank - root mod P). A rank v > 0 whose lowest
// set bit is m holds the blocks of v .. min(v + m, P) - 1, its subtree, once its children's have
// arrived: it receives the subtree of v + mask from each child (mask = 1, 2, .. < m, v + mask <
// P) all at once, each into its place, then sends the whole subtree to v - m in one message.
// The root's children are v = 1, 2, 4, ..., and their subtrees arrive straight into `out`, in
// rank order (one that runs past rank P - 1 arrives in scratch and is copied in two pieces).
//
// ceil(log2 P) rounds and P - 1 messages, as many as the linear gather's, and the same blocks
// into the root; a rank talks only to the ranks at distances 2^k before and after it, whose
// addresses creation tells it (runtime/peer_directory.h), where in the linear gather every rank
// looked the root's address up in the store. A rank other than the root holds its subtree in
// scratch: at most half the blocks (PlanBook::gatherSchedule bounds its bytes).
#include <algorithm>
#include <bit>
#include <memory>
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task gatherTree(Op& op, const void* in, void* out, size_t bytes, int root) {
  const int n = op.size();
  const int v = (op.rank() - root + n) % n;
  const bool isRoot = v == 0;
  char* base = static_cast<char*>(out);
  if (isRoot && bytes > 0 && base + root * bytes != in) {
    co_await copyInTurns(op, base + root * bytes, in, bytes);
  }
  if (n == 1 || bytes == 0) co_return;
  // The root: a power of two past every child; else v's lowest set bit.
  const int low = isRoot ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(n))) : v & -v;
  const int span = std::min(low, n - v);  // the subtree's blocks, this rank's first
  Memory& memory = op.memory();
  std::shared_ptr<char> held, wrapped;
  if (!isRoot && span > 1) {
    held = memory.allocate(span * bytes);
    co_await copyInTurns(op, held.get(), in, bytes);
  }
  int wrapFirst = 0, wrapCount = 0;  // the root's child whose subtree runs past rank P - 1
  std::vector<Request*> arrivals;
  uint32_t round = 0;
  for (int mask = 1; mask < low && v + mask < n; mask <<= 1, ++round) {
    const int child = (v + mask + root) % n;
    const int count = std::min(mask, n - v - mask);
    char* into = nullptr;
    if (!isRoot) {
      into = held.get() + mask * bytes;
    } else if (child + count <= n) {
      into = base + child * bytes;
    } else {
      wrapped = memory.allocate(count * bytes);
      into = wrapped.get();
      wrapFirst = child;
      wrapCount = count;
    }
    arrivals.push_back(op.recv(child, tag::slot(0, round), into, count * bytes));
  }
  if (!arrivals.empty()) co_await op.all(arrivals);
  if (wrapped) {
    const size_t before = static_cast<size_t>(n - wrapFirst) * bytes;
    co_await copyInTurns(op, base + wrapFirst * bytes, wrapped.get(), before);
    co_await copyInTurns(op, base, wrapped.get() + before, wrapCount * bytes - before);
  }
  if (isRoot) co_return;
  const auto parentRound = static_cast<uint32_t>(std::countr_zero(static_cast<unsigned>(low)));
  const void* subtree = held ? static_cast<const void*>(held.get()) : in;
  co_await op.all(op.send((v - low + root) % n, tag::slot(0, parentRound), subtree, span * bytes));
}

}  // namespace ddl
