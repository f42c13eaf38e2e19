// Notices: how the ranks of a group learn that one of them failed, on every path and without
// waiting out the timeout.
//
// A rank whose collective fails sends every other rank of the group a notice: the op's sequence
// number, whether the whole group failed (a timeout, a lost peer: later ops fail at once on every
// rank) or only the op (calls that differ, arguments one rank refused: the ranks still agree on
// the sequence, so the group goes on), and the error. Each rank keeps a receive posted for its
// groups' notices; one for an op that has not started here waits until it does. Messages a
// failed op leaves behind (sent to a rank that never posted their receives) are discarded for a
// while after it failed ("graves"), and all at shutdown, so they neither linger in the transport
// nor match a later op. The engine owns the class that drives them (Notices, below).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "../base/clock.h"
#include "../base/status.h"
#include "../runtime/runtime.h"
#include "../transport/transport.h"
#include "notice.h"

namespace ddl {

class Notices;
struct Group;

// A group's notices, on the turning thread (Notices drives them).
struct GroupNotices {
  Notices* board = nullptr;
  Runtime* runtime = nullptr;  // the board's, for Notices::close
  // The group, while it lives: the engine holds it (owner.lock()) while it reads `group`; a
  // group destroyed before Notices::close ran is treated as closed.
  const Group* group = nullptr;
  std::weak_ptr<const Group> owner;
  uint32_t groupId = 0;
  int wideBits = 0;          // the group's (tag::wideBits): a wide group's notices match its block
  uint64_t incarnation = 0;  // the group's: stamped on what it sends, checked on what arrives
  // A notice of this group, from this rank, stamped with its incarnation.
  Notice notice(Notice::Type type, uint32_t sequence) const;
  bool open = false;
  bool received = false;  // the receive completed: apply `arrived`, take the next one
  std::unique_ptr<Request> receive;
  std::unique_ptr<Request> spare;  // kept from a look that found no notice (Notices::takeNotice)
  std::vector<char> buffer = std::vector<char>(Notice::kMaxBytes);
  std::vector<Notice> arrived;
  std::map<uint32_t, Notice> early;  // for ops not started here yet
  // The latest collective sequence number started here (none yet: `anyStarted` false). Sequence
  // numbers are 32 bits and wrap (after 2^32 ops: 50 days at 1 000 ops/s); they are compared as
  // serial numbers (RFC 1982), by their difference, never by their value.
  uint32_t started = 0;
  bool anyStarted = false;
  void markStarted(uint32_t sequence) {
    if (!anyStarted || static_cast<int32_t>(sequence - started) > 0) started = sequence;
    anyStarted = true;
  }
  // Whether op `sequence` has not started here yet (it is after the latest started).
  bool ahead(uint32_t sequence) const {
    return !anyStarted || static_cast<int32_t>(sequence - started) > 0;
  }
  // How many ops were started here after op `sequence` (negative: it is ahead).
  int64_t startedSince(uint32_t sequence) const {
    return anyStarted ? static_cast<int32_t>(started - sequence) : -1;
  }
  struct Sent {
    std::unique_ptr<Request> request;
    std::string bytes;
  };
  std::list<Sent> sent;  // a list: a send in flight keeps its bytes where they are
  struct Grave {
    uint32_t sequence;
    TimePoint until;
  };
  std::deque<Grave> graves;
  static constexpr size_t kMaxEarly = 1024;
  static constexpr size_t kMaxGraves = 256;
  // How long a failed op's leftovers are discarded: also after its group is destroyed.
  static constexpr std::chrono::seconds kGraveLife{10};
  // News (Notices::floodNews): the ranks known gone grew since the last flood; when that was;
  // the words of the first loss known here.
  bool newsPending = false;
  std::set<int> newsOf;  // ranks whose loss this group has taken in (failed, news to spread)
  TimePoint lastFlood = TimePoint::min();
  std::string newsWhy;
  // What this rank flooded (ascending), and to whom: a rank it flooded to before is sent only
  // what is new since, one it floods to first all it knows.
  std::vector<int> flooded;
  std::set<int> floodedTo;
  // Ops another rank reported timed out (its notice went to every rank: this rank's own timeout
  // of the same op adds nothing), and ranks counted gone here that spoke since (told so, once a
  // second at most).
  std::deque<uint32_t> timeoutsHeard;
  std::map<int, TimePoint> toldGone;
  // The heartbeats this group asked of the runtime: addresses beaten, addresses watched.
  std::vector<std::string> beats, watches;
};

// The notice protocol of an engine's groups, and what an op's end means to the rest of its group
// (the runtime's Supervisor; the engine owns one). A failure of this rank's making is told to the
// others down the group's notice tree; a timeout or a lost peer fails the whole group; a notice
// from another rank ends the op it names, here, or waits for it to start. Ranks found gone are
// news, flooded to every rank of the groups that have them.
class Notices : public Runtime::Supervisor {
 public:
  explicit Notices(Runtime& runtime) : runtime_(runtime) {}
  Notices(const Notices&) = delete;
  Notices& operator=(const Notices&) = delete;

  // Posts the group's notice receive and starts its heartbeats (blocks until done).
  void open(const std::shared_ptr<Group>& group);
  // Takes a group's notices down (from a destructor: the engine may be gone, then nothing is
  // left to take down).
  static void close(std::shared_ptr<GroupNotices> notices);
  // A rank that refused its arguments for op `sequence` of `group` tells the others, whose op
  // then fails with `text`. Returns at once.
  static void refuse(std::shared_ptr<const Group> group, uint32_t sequence, std::string text);

  // Runtime::Supervisor.
  Status admit(Op& op, Ending* ending) override;
  void ended(Op& op, const Status& status, Ending ending, const std::string& where) override;
  void halfway(Op& op) override;
  bool afterSteps() override;
  bool idle() override;
  void housekeep() override;
  void afterLiveness() override;
  TimePoint nextHousekeeping() const override;
  void stopped() override;

 private:
  // Once a peer has been lost for the grace period, every open group that has it fails and
  // spreads the news (floodNews), whether an op of it is in flight or not: ranks that never
  // connected to the dead one (a receive from it fails nowhere) learn it in log2(P) rounds.
  void announceLost();
  // The process at `address` is gone (`why`): every open group that has it notes the rank gone
  // and fails; its news is to be spread (in the words `heard` from another rank, if it was).
  void learnGone(const std::string& address, const std::string& why, const std::string& heard);
  // Group rank `r` of `control`'s group is gone: the group fails (once per rank), and its news
  // is due. `witness`: the rank that counted it gone itself, where news told of it (-1: this one).
  void noteGone(GroupNotices& control, int r, const std::string& why, const std::string& heard,
                int witness = -1);
  // News: a rank that learns ranks are gone sends what it knows gone to its successors at
  // distances 1, 2, 4, ... (not to ranks gone), and passes news on when what it knows grew: all
  // of it to a rank it sends news to first, what is new since its last flood to the others (so
  // every rank it sends to has heard all it knows). Every rank hears from log2(P) predecessors,
  // so dead relays (a whole host, a rack) cut no one off, where a tree's dead relay cuts off its
  // subtree. A rank floods at most once per kNewsPeriod (what grows meanwhile goes with the
  // next): P log2(P) messages a flood, and a few floods per rank however many ranks die at once.
  static constexpr std::chrono::milliseconds kNewsPeriod{50};
  void floodPendingNews();
  void floodNews(GroupNotices& control, const Group& group);  // the group held alive
  // News from a rank this one counts gone: it is told so (it stalled, or sits on the other side
  // of a partition), at most once a second.
  void tellGone(GroupNotices& control, int rank);
  // Fails the ops in flight whose group was failed (set when a group fails).
  void failRefusedOps();

  // Starts receiving a notice that has arrived for the group, if one has and none is being
  // received (notices are not posted for: a receive under a mask costs every message).
  bool takeNotice(GroupNotices& control);
  static void onNotice(Request* req);
  // Applies what arrived, passes on what travels down a tree, cleans up sends and, every
  // housekeeping period, discards what failed ops left behind. True when something happened.
  bool service(bool housekeeping);
  void applyNotice(GroupNotices& control, const Notice& notice);
  void applyNews(GroupNotices& control, const Notice& notice);
  // Starts `notice` down its tree (from this rank, its root).
  void sendNotice(GroupNotices& control, const Notice& notice);
  // False when no endpoint to `to` can be made (nothing is sent).
  bool sendNoticeTo(GroupNotices& control, const Notice& notice, const std::string& bytes, int to);
  // Passes a notice of the tree on to this rank's children in it: the rank at distance v from
  // the root sends to the ranks at distance v + 2^k for every 2^k > v (below the group's size).
  // A notice reaches all P - 1 other ranks in P - 1 messages and log2(P) rounds, and whoever
  // starts one, a rank sends only to the ranks 2^k after it: log2(P) endpoints.
  // A child that is gone (the notice's `gone`, or a peer lost here) is passed around: this rank
  // sends to its children in its stead.
  void relayNotice(GroupNotices& control, const Notice& notice, const std::string& bytes);
  void relayBelow(GroupNotices& control, const Notice& notice, const std::string& bytes, int v);
  // Tells the op's other ranks whom it still waits for, halfway to its deadline (runtime/waits.h):
  // every rank in groups of up to kWaitReportsToAll ranks, else the ranks it sent to.
  static constexpr int kWaitReportsToAll = 64;
  void reportWaits(Op& op);
  void buryOp(GroupNotices& control, uint32_t sequence);
  static Ending endingOf(const Notice& notice);
  static Status reportOf(const Notice& notice);  // "rank 2 reports: ..."

  Runtime& runtime_;
  // The turning thread only.
  std::vector<std::shared_ptr<GroupNotices>> controls_;
  bool noticesArrived_ = false;   // a notice receive completed
  bool refusalsPending_ = false;  // a group failed: fail its ops in flight
};

}  // namespace ddl
