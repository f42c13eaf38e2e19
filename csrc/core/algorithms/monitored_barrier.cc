// Monitored barrier: a barrier that says who is missing.
//
// 1. Every rank but 0 sends an empty message to rank 0 and waits for a release.
// 2. Rank 0 waits for all of them, then releases everyone.
// If the op's deadline passes first, the engine's timeout message lists exactly the ranks whose
// message has not arrived (at rank 0), or rank 0 itself (elsewhere). Rank 0 serialises the
// barrier on purpose: it is the one place that can see every rank.
#include <vector>

#include "../engine/tag.h"
#include "algorithms.h"

namespace ddl {

Task barrierMonitored(Op& op) {
  const int n = op.size();
  constexpr uint32_t kArrive = 0, kRelease = 1;
  if (op.rank() != 0) {
    Request* arrive = op.send(0, tag::slot(0, kArrive), nullptr, 0);
    Request* release = op.recv(0, tag::slot(0, kRelease), nullptr, 0);
    co_await op.all(arrive, release);
    co_return;
  }
  std::vector<Request*> arrivals;
  for (int r = 1; r < n; ++r) arrivals.push_back(op.recv(r, tag::slot(0, kArrive), nullptr, 0));
  co_await op.all(arrivals);
  std::vector<Request*> releases;
  for (int r = 1; r < n; ++r) releases.push_back(op.send(r, tag::slot(0, kRelease), nullptr, 0));
  co_await op.all(releases);
}

}  // namespace ddl
