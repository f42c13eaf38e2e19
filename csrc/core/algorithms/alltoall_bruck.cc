// Bruck's all-to-all, the latency algorithm for large groups: ceil(log2 P) rounds where the
// pairwise exchange takes P - 1 messages and an endpoint to every rank.
//
// Position i (1 .. P-1) of rank r starts as r's block for rank r + i. In the round of distance
// d = 2^k, r sends every position whose bit k is set to rank r + d, in one message, and receives
// the same positions of rank r - d in their place: a block moves by d for each bit of its
// distance, so at the end position i holds the block rank r - i sent to r. Every rank talks to
// the 2 ceil(log2 P) ranks r +- 2^k, looked up in one bulk request (an all_to_all of thousands of
// ranks that looked every rank up queued P^2 keys at the store's one server).
//
// Blocks may differ in size per pair (all_to_all_single with splits), and a rank forwards blocks
// whose sizes only their sender and receiver know. So each round's data goes with a message of
// the blocks' sizes in the control phase (a simulation without payload still carries it): one
// size where they are all equal, else one per block. Both leave at once; the data is received
// once the sizes have said how much it is. The receiver of a block checks its size against its
// own layout, and a difference fails the op naming the sender, as the pairwise exchange's exact
// receive does.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <numeric>
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {
namespace {

// The round's sizes, as they travel: one where every block is of that size.
std::vector<uint64_t> sizesMessage(const std::vector<uint64_t>& sizes) {
  if (std::all_of(sizes.begin(), sizes.end(), [&](uint64_t s) { return s == sizes.front(); })) {
    return {sizes.front()};
  }
  return sizes;
}

// Where each position's block is now: in the input, or in what a round received (held while a
// position points into it).
struct Positions {
  std::vector<const char*> at;
  std::vector<uint64_t> size;
  std::vector<int> round;                     // the round whose message holds it (-1: the input)
  std::vector<std::shared_ptr<char>> landed;  // by round
  std::vector<int> users;                     // by round: positions pointing into it

  void let(int i) {
    if (round[i] >= 0 && --users[round[i]] == 0) landed[round[i]].reset();
    round[i] = -1;
  }
  void point(int i, int r, const char* p, uint64_t bytes) {
    let(i);
    at[i] = p;
    size[i] = bytes;
    round[i] = r;
    ++users[r];
  }
};

// Room for what rank `from` says its round's blocks come to. The sizes are a peer's word: a sum
// past 1 TiB (or past 2^64) fails the op naming it, as does one this process cannot allocate.
std::shared_ptr<char> landing(Op& op, int from, const std::vector<uint64_t>& sizes) {
  constexpr uint64_t kMost = uint64_t{1} << 40;
  uint64_t total = 0;
  for (uint64_t s : sizes) {
    if (s > kMost - total) {
      op.raise(Error(Status(StatusKind::kMismatch,
                            "rank " + std::to_string(from) + " says its blocks of " + op.name() +
                                " come to more than 1 TiB",
                            {from})));
    }
    total += s;
  }
  try {
    return op.memory().allocate(total);
  } catch (const std::bad_alloc&) {
    op.raise(Error(Status(StatusKind::kOther,
                          "no memory for the " + std::to_string(total) + " bytes rank " +
                              std::to_string(from) + "'s blocks of " + op.name() + " come to",
                          {from})));
  }
}

// Positions [first, last) hold their final blocks (no bit of theirs is left to move): into the
// output, each checked against the size this rank expects from its sender.
Task place(Op& op, Positions& held, int first, int last, char* dst, const AlltoallLayout& layout) {
  const int n = op.size(), me = op.rank();
  for (int i = first; i < last; ++i) {
    const int from = (me - i + n) % n;
    if (held.size[i] != layout.recvBytes[from]) {
      op.raise(Error(Status(StatusKind::kMismatch,
                            "rank " + std::to_string(from) + " sent a block of " +
                                std::to_string(held.size[i]) + " bytes where this rank expects " +
                                std::to_string(layout.recvBytes[from]) + ": the ranks called " +
                                op.name() + " with different splits",
                            {from})));
    }
    if (op.turnDue()) co_await op.yieldTurn();
    if (held.size[i] > 0)
      op.memory().copy(dst + layout.recvOffsets[from], held.at[i], held.size[i]);
    held.let(i);
  }
}

}  // namespace

Task alltoallBruck(Op& op, const void* in, void* out, AlltoallLayout layout) {
  const int n = op.size(), me = op.rank();
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  Memory& memory = op.memory();
  if (layout.sendBytes[me] > 0) {
    co_await copyInTurns(op, dst + layout.recvOffsets[me], src + layout.sendOffsets[me],
                         layout.sendBytes[me]);
  }
  if (n == 1) co_return;
  Positions held{
      std::vector<const char*>(n), std::vector<uint64_t>(n), std::vector<int>(n, -1), {}, {}};
  for (int i = 1; i < n; ++i) {
    held.at[i] = src + layout.sendOffsets[(me + i) % n];
    held.size[i] = layout.sendBytes[(me + i) % n];
  }
  std::vector<int> peers;
  for (int d = 1; d < n; d *= 2) peers.insert(peers.end(), {(me + d) % n, (me - d + n) % n});
  op.group().directory->prefetch(peers);
  int round = 0;
  for (int d = 1; d < n; d *= 2, ++round) {
    std::vector<int> moving;
    for (int i = d; i < n; ++i) {
      if ((i & d) != 0) moving.push_back(i);
    }
    std::vector<uint64_t> sizes;
    uint64_t total = 0;
    for (int i : moving) {
      sizes.push_back(held.size[i]);
      total += held.size[i];
    }
    std::shared_ptr<char> packed = memory.allocate(total);
    char* p = packed.get();
    for (int i : moving) {
      if (op.turnDue()) co_await op.yieldTurn();
      if (held.size[i] > 0) memory.copy(p, held.at[i], held.size[i]);
      p += held.size[i];
    }
    const int to = (me + d) % n, from = (me - d + n) % n;
    const uint64_t sizesSlot = tag::slot(tag::kControlPhase, tag::kSizesStep + round);
    const std::vector<uint64_t> told = sizesMessage(sizes);
    std::vector<uint64_t> heard(moving.size());
    std::vector<Request*> requests{
        op.send(to, sizesSlot, told.data(), told.size() * sizeof(uint64_t)),
        op.send(to, tag::slot(0, round), packed.get(), total)};
    Request* sizesIn = op.recvUpTo(from, sizesSlot, heard.data(), heard.size() * sizeof(uint64_t));
    // While they move: the positions the last round made final.
    co_await place(op, held, std::max(1, d / 2), d, dst, layout);
    co_await op.all(sizesIn);
    if (sizesIn->receivedBytes == sizeof(uint64_t)) {
      std::fill(heard.begin(), heard.end(), heard.front());
    } else if (sizesIn->receivedBytes != heard.size() * sizeof(uint64_t)) {
      op.raise(Error(Status(
          StatusKind::kMismatch,
          "rank " + std::to_string(from) + " sent " + std::to_string(sizesIn->receivedBytes) +
              " bytes of block sizes where this rank expects " + std::to_string(heard.size()) +
              " sizes: the ranks called " + op.name() + " in groups of different sizes",
          {from})));
    }
    held.landed.push_back(landing(op, from, heard));
    held.users.push_back(0);
    const uint64_t incoming = std::accumulate(heard.begin(), heard.end(), uint64_t{0});
    char* q = held.landed.back().get();
    requests.push_back(op.recv(from, tag::slot(0, round), q, incoming));
    co_await op.all(std::move(requests));
    for (size_t j = 0; j < moving.size(); ++j) {
      held.point(moving[j], round, q, heard[j]);
      q += heard[j];
    }
  }
  co_await place(op, held, 1 << (round - 1), n, dst, layout);  // round >= 1: n >= 2
}

}  // namespace ddl
