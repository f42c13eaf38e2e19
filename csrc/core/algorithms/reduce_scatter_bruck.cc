// Bruck reduce-scatter, the latency algorithm for small blocks: Bruck's allgather
// (allgather_bruck.cc) run backwards, ceil(log2 P) rounds where the ring takes P - 1 steps.
//
// The buffer holds P blocks; block c is the one rank c keeps. Rank r holds partial sums of the
// blocks r, r+1, ..., r+h-1 (mod P), h = P at the start. The allgather's rounds run in reverse,
// distance d = 2^k from the largest below P down to 1: in each, rank r sends its partial sums of
// the blocks r+d, ..., r+d+c-1 (c = min(d, P - d), the window's last c) to rank r + d, receives
// from rank r - d its partial sums of the blocks r, ..., r+c-1 and reduces them into its own, and
// its window shrinks to d. Each message of the allgather goes the other way, so every rank's
// contribution to block b reaches rank b once. A run of blocks that wraps past block P - 1 goes
// as two messages, split the same way by sender and receiver: at most 2 ceil(log2 P) messages
// each way per rank, and every rank sends P - 1 blocks in all, as in the ring.
#include <algorithm>
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"
#include "bruck_pieces.h"

namespace ddl {

Task reduceScatterBruck(Op& op, void* data, size_t count, DataType type, ReduceOp reduce) {
  const int n = op.size(), rank = op.rank();
  const size_t bytes = count * elementSize(type);
  if (n == 1 || bytes == 0) co_return;
  char* base = static_cast<char*>(data);
  int top = 1;
  uint32_t round = 0;
  while (2 * top < n) top *= 2, ++round;
  std::shared_ptr<char> incoming = op.memory().allocate(static_cast<size_t>(n / 2) * bytes);
  for (int d = top; d >= 1; d /= 2, --round) {
    const int blocks = std::min(d, n - d);
    std::vector<Request*> requests;
    uint32_t step = 2 * round;
    for (auto [first, run] : bruckPieces((rank + d) % n, blocks, n)) {
      requests.push_back(op.send((rank + d) % n, tag::slot(0, step++), base + first * bytes,
                                 static_cast<size_t>(run) * bytes));
    }
    step = 2 * round;
    size_t at = 0;
    for (auto [first, run] : bruckPieces(rank, blocks, n)) {
      requests.push_back(op.recv((rank - d + n) % n, tag::slot(0, step++), incoming.get() + at,
                                 static_cast<size_t>(run) * bytes));
      at += static_cast<size_t>(run) * bytes;
    }
    co_await op.all(std::move(requests));
    at = 0;
    for (auto [first, run] : bruckPieces(rank, blocks, n)) {
      co_await reduceInTurns(op, type, reduce, base + first * bytes, incoming.get() + at,
                             static_cast<size_t>(run) * count);
      at += static_cast<size_t>(run) * bytes;
    }
  }
}

}  // namespace ddl
