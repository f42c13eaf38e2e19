// What an op that has not finished waits for, in words: whom it still waits on (for its timeout's
// error and the flight recorder), and, halfway to its deadline, what it tells the others and
// hears from them (Engine's wait reports), so that a rank that times out names the rank at the
// end of the wait.
#pragma once

#include <map>
#include <set>
#include <string>

namespace ddl {

class Op;

// Whom an op still waits for: peers it has posted requests to, and of them the previous rank if
// its call print, sent as it starts, has not arrived (it has not started the op).
struct Waits {
  std::set<int> peers;
  std::set<int> notStarted;
};

// Halfway to its deadline an op of more than two ranks that is still running tells the others
// whom it waits for; a rank that times out follows those reports from the ranks it waits for to
// the rank at the end of the wait.
struct WaitReports {
  bool sent = false;
  std::map<int, Waits> heard;  // by the reporting rank
};

Waits waitsOf(const Op& op);
// Describes who `op` still waits for, e.g. "no data from rank 2; rank 3 has not received".
std::string pendingPeers(const Op& op);
// Where the reports lead: "; ..." or "" (none to add). notStartedSaid: the words so far
// (pendingPeers) already say which peers have not started.
std::string waitChain(const Op& op, bool notStartedSaid);

}  // namespace ddl
