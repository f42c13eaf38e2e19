#include "waits.h"

#include <vector>

#include "op.h"

namespace ddl {

std::string pendingPeers(const Op& op) {
  std::set<int> recvFrom, sendTo, notStarted;
  bool fromAnyone = false;
  for (const auto& r : op.requests()) {
    if (r->done) continue;
    if (op.callCheck().isStartPrint(*r))
      notStarted.insert(r->peer);  // it has not sent its print yet
    if (r->peer < 0) {
      fromAnyone = true;
      continue;
    }
    (r->isSend ? sendTo : recvFrom).insert(r->peer);
  }
  auto list = [](const std::set<int>& ranks) {
    std::string s;
    for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  };
  std::string text;
  if (!recvFrom.empty()) {
    text += "no data arrived from rank" + std::string(recvFrom.size() > 1 ? "s " : " ") +
            list(recvFrom);
  }
  if (fromAnyone) text += std::string(text.empty() ? "" : "; ") + "no data arrived from any rank";
  if (!sendTo.empty()) {
    text += (text.empty() ? "" : "; ") + std::string("rank") + (sendTo.size() > 1 ? "s " : " ") +
            list(sendTo) + " did not take the data sent to it";
  }
  if (!notStarted.empty()) {
    text += (text.empty() ? "" : "; ") + std::string("rank") +
            (notStarted.size() > 1 ? "s " : " ") + list(notStarted) +
            (notStarted.size() > 1 ? " have" : " has") + " not started this op";
  }
  return text.empty() ? "no message outstanding" : text;
}

Waits waitsOf(const Op& op) {
  Waits w;
  for (const auto& r : op.requests()) {
    if (r->done || r->peer < 0) continue;
    w.peers.insert(r->peer);
    if (op.callCheck().isStartPrint(*r)) w.notStarted.insert(r->peer);
  }
  if (op.awaitedPeers) {
    for (int r : op.awaitedPeers()) w.peers.insert(r);
  }
  return w;
}

std::string waitChain(const Op& op, bool notStartedSaid) {
  const Waits own = waitsOf(op);
  std::string text;
  if (!notStartedSaid) {
    for (int r : own.notStarted) text += "; rank " + std::to_string(r) + " has not started this op";
  }
  if (op.waitReports.heard.empty()) return text;
  // Who saw which rank not start the op (this rank first).
  std::map<int, int> notStartedSeenBy;
  for (int r : own.notStarted) notStartedSeenBy.emplace(r, op.rank());
  for (const auto& [from, w] : op.waitReports.heard) {
    for (int r : w.notStarted) notStartedSeenBy.emplace(r, from);
  }
  // Breadth first from the peers this rank waits for, through the ranks that reported waiting,
  // to the ranks at the ends of the waits: ones that had not started the op, and ones in it that
  // sent no report (stopped, or not in the op: it is not known which).
  std::map<int, int> via;  // rank -> the rank it was reached from (-1: waited for here)
  std::vector<int> queue;
  for (int r : own.peers) {
    via.emplace(r, -1);
    queue.push_back(r);
  }
  std::vector<std::pair<int, std::string>> ends;
  for (size_t i = 0; i < queue.size(); ++i) {
    const int r = queue[i];
    if (auto seen = notStartedSeenBy.find(r); seen != notStartedSeenBy.end()) {
      ends.emplace_back(r, "has not started this op" +
                               (seen->second == op.rank()
                                    ? std::string()
                                    : " (rank " + std::to_string(seen->second) + " saw no call)"));
      continue;
    }
    auto report = op.waitReports.heard.find(r);
    if (report == op.waitReports.heard.end()) {
      ends.emplace_back(r, "sent no report halfway to the timeout (stopped, or not in this op)");
      continue;
    }
    for (int next : report->second.peers) {
      if (next == op.rank() || !via.emplace(next, r).second) continue;
      queue.push_back(next);
    }
  }
  for (const auto& [r, why] : ends) {
    if (via[r] == -1 && own.notStarted.count(r)) continue;  // said already
    std::vector<int> path;
    for (int at = via[r]; at != -1; at = via[at]) path.push_back(at);
    std::string through;
    if (!path.empty()) {
      through = " through rank" + std::string(path.size() > 1 ? "s " : " ");
      for (size_t k = path.size(); k-- > 0;) {
        through += std::to_string(path[k]) + (k ? ", " : "");
      }
    }
    text += "; the wait leads" + through + " to rank " + std::to_string(r) + ", which " + why;
  }
  return text;
}

}  // namespace ddl
