// Bruck allgather, the latency algorithm for small blocks: ceil(log2 P) rounds where the ring
// takes P - 1 steps.
//
// Rank r holds the blocks r, r-1, ..., r-h+1 (mod P), h = 1 at the start. In round k (distance
// d = 2^k, while d < P) it sends its first min(d, P - d) blocks to rank r + d and receives as many
// from rank r - d: the blocks r-d, r-d-1, ..., which that rank holds first. Every round's last
// message thus goes to the next rank (d = 1), which a collective's call print goes to anyway
// (runtime/call_print.h: PrintRing). Blocks land in their places in the output at once (no
// rotation at the end): a run of blocks that wraps past block P - 1 goes as two messages, the
// run up to the end (step 2k) and the rest from block 0 (step 2k+1), split the same way by sender
// and receiver. At most 2 ceil(log2 P) messages each way per rank; every rank receives the P - 1
// other blocks once, as in the ring.
//
// Level by level (allgatherGridBruck): the stages of the grid's allgather (block_plan.h),
// outermost dimension first, each run as Bruck's rounds over its dimension ring instead of one
// ring per combination of the coordinates above it: a position's blocks of every combination go
// together, one message a round, to position + d. A stage works in a buffer of the positions in
// order back from the rank's own, where what a round sends is a prefix and what it receives lands
// after it: this rank's blocks are packed once, and every other position's unpacked once into
// the output, while the next round's messages move. The grid's bytes (each block crosses each
// host's link once) in sum over the dimensions of ceil(log2 extent) rounds: at most ceil(log2 P)
// + the number of dimensions messages each way per rank.
#include <algorithm>
#include <vector>

#include "../base/tag.h"
#include "../topology/block_plan.h"
#include "algorithms.h"
#include "bruck_pieces.h"

namespace ddl {
Task allgatherBruck(Op& op, const void* in, void* out, size_t bytes) {
  const int n = op.size(), rank = op.rank();
  char* base = static_cast<char*>(out);
  char* mine = base + static_cast<size_t>(rank) * bytes;
  if (bytes > 0 && in != mine) co_await copyInTurns(op, mine, in, bytes);
  if (n == 1 || bytes == 0) co_return;
  uint32_t round = 0;
  for (int d = 1; d < n; d *= 2, ++round) {
    const int count = std::min(d, n - d);
    const int to = (rank + d) % n, from = (rank - d + n) % n;
    std::vector<Request*> requests;
    uint32_t step = 2 * round;
    for (auto [first, blocks] : bruckPieces((rank - count + 1 + n) % n, count, n)) {
      requests.push_back(op.send(to, tag::slot(0, step++), base + first * bytes, blocks * bytes));
    }
    step = 2 * round;
    for (auto [first, blocks] : bruckPieces((from - count + 1 + n) % n, count, n)) {
      requests.push_back(op.recv(from, tag::slot(0, step++), base + first * bytes, blocks * bytes));
    }
    co_await op.all(std::move(requests));
  }
}

Task allgatherGridBruck(Op& op, const void* in, void* out, size_t bytes,
                        std::shared_ptr<const BlockPlan> plan) {
  char* base = static_cast<char*>(out);
  char* mine = base + static_cast<size_t>(op.rank()) * bytes;
  if (bytes > 0 && in != mine) co_await copyInTurns(op, mine, in, bytes);
  if (op.size() == 1 || bytes == 0) co_return;
  Memory& memory = op.memory();
  for (size_t stage = 0; stage < plan->stages.size(); ++stage) {
    const BruckStage ring = bruckStage(*plan, stage, op.rank());
    if (ring.order.empty()) continue;
    const BlockStage& s = plan->stages[stage];
    const std::vector<int>& order = ring.order;
    const int n = static_cast<int>(order.size()), me = ring.me;
    // held[p]: the blocks position p holds as the stage starts.
    const std::vector<std::vector<int>>& held = ring.blocks;
    const size_t perPosition = s.combinations * bytes;
    // The positions in order back from this rank's (relative position i is me - i): before the
    // round of distance d it holds relative 0 .. d - 1, and sends the first min(d, n - d) of them
    // as they lie to me + d, receiving as many after them from me - d.
    std::shared_ptr<char> work = memory.allocate(static_cast<size_t>(n) * perPosition);
    char* w = work.get();
    for (int b : held[me]) {
      memory.copy(w, base + static_cast<size_t>(b) * bytes, bytes);
      w += bytes;
    }
    w = work.get();
    int placed = 1;  // relative positions 1 .. placed - 1 are in the output
    uint32_t round = 0;
    for (int d = 1; d < n; d *= 2, ++round) {
      const int count = std::min(d, n - d);
      const size_t length = static_cast<size_t>(count) * perPosition;
      const uint64_t slot = tag::slot(0, s.firstStep + round);
      Request* sent = op.send(order[(me + d) % n], slot, w, length);
      Request* got = op.recv(order[(me - d + n) % n], slot, w + d * perPosition, length);
      // While they move: what the last round brought, into its places in the output.
      for (; placed < d; ++placed) {
        if (op.turnDue()) co_await op.yieldTurn();
        const char* from = w + placed * perPosition;
        for (int b : held[(me - placed + n) % n]) {
          memory.copy(base + static_cast<size_t>(b) * bytes, from, bytes);
          from += bytes;
        }
      }
      co_await op.all(sent, got);
    }
    for (; placed < n; ++placed) {
      if (op.turnDue()) co_await op.yieldTurn();
      const char* from = w + placed * perPosition;
      for (int b : held[(me - placed + n) % n]) {
        memory.copy(base + static_cast<size_t>(b) * bytes, from, bytes);
        from += bytes;
      }
    }
  }
}

}  // namespace ddl
