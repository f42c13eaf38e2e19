// Bruck allgather, the latency algorithm for small blocks: ceil(log2 P) rounds where the ring
// takes P - 1 steps.
//
// Rank r holds the blocks r, r+1, ..., r+h-1 (mod P), h = 1 at the start. In round k (distance
// d = 2^k, while d < P) it sends its first min(d, P - d) blocks to rank r - d and receives as many
// from rank r + d: the blocks r+d, r+d+1, ..., which that rank holds first. Blocks land in their
// places in the output at once (no rotation at the end): a run of blocks that wraps past block
// P - 1 goes as two messages, the run up to the end (step 2k) and the rest from block 0 (step
// 2k+1), split the same way by sender and receiver. At most 2 ceil(log2 P) messages each way per
// rank; every rank receives the P - 1 other blocks once, as in the ring.
#include <algorithm>
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {
namespace {

// The run of `count` blocks from block `first` (mod n), as at most two contiguous pieces of the
// buffer: {first block, blocks} each.
std::vector<std::pair<int, int>> pieces(int first, int count, int n) {
  std::vector<std::pair<int, int>> out;
  const int before = std::min(count, n - first);
  out.emplace_back(first, before);
  if (count > before) out.emplace_back(0, count - before);
  return out;
}

}  // namespace

int bruckRounds(int n) {
  int rounds = 0;
  for (int d = 1; d < n; d *= 2) ++rounds;
  return rounds;
}

Task allgatherBruck(Op& op, const void* in, void* out, size_t bytes) {
  const int n = op.size(), rank = op.rank();
  char* base = static_cast<char*>(out);
  char* mine = base + static_cast<size_t>(rank) * bytes;
  if (bytes > 0 && in != mine) co_await copyInTurns(op, mine, in, bytes);
  if (n == 1 || bytes == 0) co_return;
  uint32_t round = 0;
  for (int d = 1; d < n; d *= 2, ++round) {
    const int count = std::min(d, n - d);
    const int to = (rank - d + n) % n, from = (rank + d) % n;
    std::vector<Request*> requests;
    uint32_t step = 2 * round;
    for (auto [first, blocks] : pieces(rank, count, n)) {
      requests.push_back(op.send(to, tag::slot(0, step++), base + first * bytes, blocks * bytes));
    }
    step = 2 * round;
    for (auto [first, blocks] : pieces(from, count, n)) {
      requests.push_back(op.recv(from, tag::slot(0, step++), base + first * bytes, blocks * bytes));
    }
    co_await op.all(std::move(requests));
  }
}

}  // namespace ddl
