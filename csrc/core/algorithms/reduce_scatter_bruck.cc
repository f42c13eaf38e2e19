// Bruck reduce-scatter, the latency algorithm for small blocks: Bruck's allgather
// (allgather_bruck.cc) run backwards, ceil(log2 P) rounds where the ring takes P - 1 steps.
//
// The buffer holds P blocks; block c is the one rank c keeps. Rank r holds partial sums of the
// blocks r, r+1, ..., r+h-1 (mod P), h = P at the start. The allgather's rounds run in reverse,
// distance d = 2^k from the largest below P down to 1: in each, rank r sends its partial sums of
// the blocks r+d, ..., r+d+c-1 (c = min(d, P - d), the window's last c) to rank r + d, receives
// from rank r - d its partial sums of the blocks r, ..., r+c-1 and reduces them into its own, and
// its window shrinks to d: the allgather's rounds in reverse and mirrored (it too sends to r + d,
// so that the last round meets the next rank, where the call print goes), and every rank's
// contribution to block b reaches rank b once. A run of blocks that wraps past block P - 1 goes
// as two messages, split the same way by sender and receiver: at most 2 ceil(log2 P) messages
// each way per rank, and every rank sends P - 1 blocks in all, as in the ring.
//
// Level by level (reduceScatterGridBruck): the stages of the grid's reduce-scatter
// (block_plan.h), innermost dimension first, each run as these rounds over its dimension ring
// instead of one ring per combination of the coordinates above it: a position's blocks of every
// combination go together, packed into one message a round, and position p ends holding its
// blocks of every combination summed over the ring, as the grid's rings leave them. The grid's
// bytes in sum over the dimensions of ceil(log2 extent) rounds: at most ceil(log2 P) + the number
// of dimensions messages each way per rank (allgatherGridBruck's, reversed). Only the first round
// packs what it sends: a later round's positions are the second half of what the last round
// brought, summed there with this rank's own blocks and sent from where they lie, and the first
// half, which this rank keeps, is reduced into the output while the round's messages move. A
// round thus passes over its blocks once outside its messages' time, where a pack before them and
// a reduction after them took two passes.
#include <algorithm>
#include <vector>

#include "../base/tag.h"
#include "../topology/block_plan.h"
#include "algorithms.h"
#include "bruck_pieces.h"

namespace ddl {
namespace {

// A position's blocks `at` (in order) and the output's: summed into the output, or into the
// buffer (`intoBuffer`: to be sent on).
Task foldPosition(Op& op, DataType type, ReduceOp reduce, char* base, size_t count,
                  const std::vector<int>& blocks, char* at, bool intoBuffer) {
  const size_t bytes = count * elementSize(type);
  for (int b : blocks) {
    char* mine = base + static_cast<size_t>(b) * bytes;
    co_await reduceInTurns(op, type, reduce, intoBuffer ? at : mine, intoBuffer ? mine : at, count);
    at += bytes;
  }
}

}  // namespace

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

Task reduceScatterGridBruck(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                            std::shared_ptr<const BlockPlan> plan) {
  const size_t bytes = count * elementSize(type);
  if (op.size() == 1 || bytes == 0) co_return;
  char* base = static_cast<char*>(data);
  Memory& memory = op.memory();
  for (size_t stage = 0; stage < plan->stages.size(); ++stage) {
    const BruckStage ring = bruckStage(*plan, stage, op.rank());
    if (ring.order.empty()) continue;
    const BlockStage& s = plan->stages[stage];
    const std::vector<int>& order = ring.order;
    const int n = static_cast<int>(order.size()), me = ring.me;
    // kept[p]: the blocks position p holds summed over the ring as the stage ends.
    const std::vector<std::vector<int>>& kept = ring.blocks;
    const size_t perPosition = s.combinations * bytes;
    int top = 1;
    uint32_t round = 0;
    while (2 * top < n) top *= 2, ++round;
    // Two buffers of `top` positions take turns: one holds what the last round brought (relative
    // position i, that is me + i, at i), the other receives this round's.
    std::shared_ptr<char> buffers[2] = {memory.allocate(static_cast<size_t>(top) * perPosition),
                                        memory.allocate(static_cast<size_t>(top) * perPosition)};
    char* arrived = nullptr;
    int arrivedCount = 0;
    auto fold = [&](int i, char* at, bool intoBuffer) {
      return foldPosition(op, type, reduce, base, count, kept[(me + i) % n], at, intoBuffer);
    };
    for (int d = top; d >= 1; d /= 2, --round) {
      const int positions = std::min(d, n - d);
      // What the round sends, relative positions d .. d + positions - 1 summed so far, lies in one
      // buffer: packed from the output in the first round; after it, where the last round brought
      // them (d + positions <= 2d), each summed there with this rank's own.
      char* out = arrived == nullptr ? buffers[1].get() : arrived + d * perPosition;
      for (int i = 0; i < positions; ++i) {
        char* at = out + static_cast<size_t>(i) * perPosition;
        if (arrived != nullptr && d + i < arrivedCount) {
          co_await fold(d + i, at, true);
          continue;
        }
        if (op.turnDue()) co_await op.yieldTurn();
        for (int b : kept[(me + d + i) % n]) {
          memory.copy(at, base + static_cast<size_t>(b) * bytes, bytes);
          at += bytes;
        }
      }
      char* into = arrived == buffers[0].get() ? buffers[1].get() : buffers[0].get();
      const uint64_t slot = tag::slot(0, s.firstStep + round);
      const size_t length = static_cast<size_t>(positions) * perPosition;
      Request* sent = op.send(order[(me + d) % n], slot, out, length);
      Request* got = op.recv(order[(me - d + n) % n], slot, into, length);
      // While they move: the last round's positions this rank keeps, into the output.
      for (int i = 0; arrived != nullptr && i < std::min(d, arrivedCount); ++i) {
        co_await fold(i, arrived + static_cast<size_t>(i) * perPosition, false);
      }
      co_await op.all(sent, got);
      arrived = into;
      arrivedCount = positions;
    }
    for (int i = 0; i < arrivedCount; ++i) {
      co_await fold(i, arrived + static_cast<size_t>(i) * perPosition, false);
    }
  }
}

}  // namespace ddl
