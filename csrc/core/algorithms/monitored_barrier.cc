// Monitored barrier: a barrier that says who is missing.
//
// 1. Every rank but 0 sends an empty message to rank 0 and waits for a release.
// 2. Rank 0 waits for all of them, then releases everyone.
// At the op's deadline the error names, at rank 0, the ranks whose message has not arrived
// (the lowest one, or all of them with waitAll); elsewhere it points at rank 0. The words are
// gloo's, so programs and tests that match on them work unchanged. Rank 0 serialises the
// barrier on purpose: it is the one place that can see every rank.
#include <string>
#include <vector>

#include "../base/tag.h"
#include "algorithms.h"

namespace ddl {

Task barrierMonitored(Op& op, bool waitAll) {
  const int n = op.size();
  const std::string timeout = std::to_string(op.timeout().count()) + " ms";
  constexpr uint32_t kArrive = 0, kRelease = 1;
  if (op.rank() != 0) {
    Request* arrive = op.send(0, tag::slot(0, kArrive), nullptr, 0);
    Request* release = op.recv(0, tag::slot(0, kRelease), nullptr, 0);
    op.describeTimeout = [&op, arrive, timeout] {
      std::string me = "Rank " + std::to_string(op.rank());
      if (!arrive->done)
        return me + " could not reach rank 0 in monitoredBarrier within " + timeout;
      return me +
             " successfully reached monitoredBarrier, but received errors while waiting "
             "for send/recv from rank 0. Please check rank 0 logs for faulty rank.";
    };
    co_await op.all(arrive, release);
    co_return;
  }
  std::vector<Request*> arrivals;
  for (int r = 1; r < n; ++r) arrivals.push_back(op.recv(r, tag::slot(0, kArrive), nullptr, 0));
  op.describeTimeout = [&op, &arrivals, waitAll, timeout] {
    if (op.timeout().count() == 0) {
      return std::string("Rank 0 timed out in monitoredBarrier after 0 ms");
    }
    std::vector<int> missing;
    for (size_t i = 0; i < arrivals.size(); ++i) {
      if (!arrivals[i]->done) missing.push_back(static_cast<int>(i) + 1);
    }
    std::string list;
    for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    if (missing.size() == 1) {
      return "Rank " + list + " failed to pass monitoredBarrier in " + timeout;
    }
    if (waitAll) return "Ranks " + list + " failed to pass monitoredBarrier in " + timeout;
    return "Rank " + std::to_string(missing.front()) + " failed to pass monitoredBarrier in " +
           timeout + " (ranks " + list + " did not arrive)";
  };
  co_await op.all(arrivals);
  std::vector<Request*> releases;
  for (int r = 1; r < n; ++r) releases.push_back(op.send(r, tag::slot(0, kRelease), nullptr, 0));
  op.describeTimeout = nullptr;  // every rank arrived: the engine's words say who is slow now
  co_await op.all(releases);
}

}  // namespace ddl
