// Recursive-doubling allreduce, the latency algorithm for small messages.
//
// P2 is the largest power of two <= P and E = P - P2 the ranks "extra" to it.
// 1. Fold: among ranks [0, 2E), each even rank sends its buffer to the odd rank above it, which
//    reduces it in and stands for both. Virtual ranks: odd r < 2E is r/2, r >= 2E is r - E.
// 2. Exchange: for mask = 1, 2, ..., P2/2 every virtual rank swaps its whole buffer with virtual
//    rank (v ^ mask) and reduces. Both partners compute a (op) b from the same two operands, the
//    lower virtual rank's first (MAX of NaN and 1 depends on the order), so every rank ends with
//    bitwise the same result.
// 3. Unfold: each odd rank below 2E sends the result back to the even rank it stood for.
// log2(P2) + 2 message rounds; each moves the whole buffer. The same runs among a subset of the
// ranks (positions in `ranks` stand for ranks above), as the leaders' step of allreduce_leaders.
#include <algorithm>
#include <memory>
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task allreduceRecursiveDoubling(Op& op, void* data, size_t count, DataType type, ReduceOp reduce) {
  std::vector<int> everyone(op.size());
  for (int r = 0; r < op.size(); ++r) everyone[r] = r;
  co_await recursiveDoublingAmong(op, std::move(everyone), data, count, type, reduce, 0);
}

Task recursiveDoublingAmong(Op& op, std::vector<int> ranks, void* data, size_t count, DataType type,
                            ReduceOp reduce, uint32_t firstStep) {
  const int n = static_cast<int>(ranks.size());
  const int rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), op.rank()) - ranks.begin());
  if (n == 1 || count == 0 || rank == n) co_return;
  const size_t bytes = count * elementSize(type);
  std::shared_ptr<char> scratch = op.memory().allocate(bytes);
  char* incoming = scratch.get();
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  const uint32_t kFold = firstStep, kUnfold = firstStep + 1, kExchange = firstStep + 2;
  // The partners (recursiveDoublingPartners: the fold's first, where this rank folds), their
  // addresses in one bulk lookup where creation did not tell them (it tells the leaders of a
  // regular machine theirs: topology/ringPartners).
  std::vector<int> partners = recursiveDoublingPartners(rank, n);
  for (int& p : partners) p = ranks[p];
  if (n > 2) op.group().directory->prefetch(partners);
  const size_t firstExchange = rank < 2 * extra ? 1 : 0;

  int virtualRank = rank - extra;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      co_await op.all(op.send(ranks[rank + 1], tag::slot(0, kFold), data, bytes));
      virtualRank = -1;
    } else {
      co_await op.all(op.recv(ranks[rank - 1], tag::slot(0, kFold), incoming, bytes));
      co_await reduceInTurns(op, type, reduce, data, incoming, count);
      virtualRank = rank / 2;
    }
  }
  if (virtualRank >= 0) {
    for (size_t i = firstExchange; i < partners.size(); ++i) {
      const int peer = partners[i];
      const auto round = static_cast<uint32_t>(i - firstExchange);
      Request* s = op.send(peer, tag::slot(0, kExchange + round), data, bytes);
      Request* r = op.recv(peer, tag::slot(0, kExchange + round), incoming, bytes);
      co_await op.all(s, r);
      const bool lower = (virtualRank & (1 << round)) == 0;
      co_await reduceInTurns(op, type, reduce, data, incoming, count,
                             lower ? Operands::kDstFirst : Operands::kSrcFirst);
    }
  }
  if (rank < 2 * extra) {
    if (rank % 2 == 1) {
      co_await op.all(op.send(ranks[rank - 1], tag::slot(0, kUnfold), data, bytes));
    } else {
      co_await op.all(op.recv(ranks[rank + 1], tag::slot(0, kUnfold), data, bytes));
    }
  }
}

}  // namespace ddl
