// Dissemination barrier: in round k (distance d = 2^k) every rank sends an empty message to
// rank + d and waits for one from rank - d. After ceil(log2 P) rounds every rank has heard,
// directly or through others, from every rank, so all have arrived.
#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task barrierDissemination(Op& op) {
  const int n = op.size();
  const int rank = op.rank();
  uint32_t round = 0;
  for (int d = 1; d < n; d <<= 1, ++round) {
    Request* s = op.send((rank + d) % n, tag::slot(0, round), nullptr, 0);
    Request* r = op.recv((rank - d + n) % n, tag::slot(0, round), nullptr, 0);
    co_await op.all(s, r);
  }
}

}  // namespace ddl
