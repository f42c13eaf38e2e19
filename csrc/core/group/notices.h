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
// nor match a later op. The engine drives them (group/engine.h, group/notices.cc).
#pragma once

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
#include "../transport/transport.h"

namespace ddl {

struct Notice {
  // kOp: the op failed on the sender (calls that differ, an error of its own): the op ends, the
  // group goes on. kGroupTimeout: the op timed out on the sender; the group fails.
  // kRefusal: the sender refused its arguments and never started the op (the op fails, and no
  // rank can have finished it: what it shared with others may be given up cleanly).
  // kWaiting: the sender is still in the op halfway to its deadline and says whom it waits for
  // (text: "peers;not started", comma-separated ranks); nothing ends.
  // kNews: ranks the sender counts gone (`gone`: all it knows); the group fails. News floods
  // (Engine::floodNews) instead of going down a tree.
  enum class Type : uint8_t { kOp, kNews, kGroupTimeout, kRefusal, kWaiting };
  static constexpr size_t kMaxBytes = 4096;
  uint32_t sequence = 0;
  // The sender's group's (Group::incarnation): a notice of another group that held the id is
  // dropped.
  uint64_t incarnation = 0;
  Type type = Type::kOp;
  int from = -1;
  // Passed on down a binomial tree rooted at `from` (Engine::relayNotice), so that it reaches
  // every rank; false for one sent to chosen ranks only (wait reports in large groups).
  bool tree = true;
  // The ranks it says are gone, ascending (travel as ranges: a host, a rack or one side of a
  // partition is a few); a tree passes around them (Engine::relayNotice).
  std::vector<int> gone;
  StatusKind kind = StatusKind::kOther;  // of the failure it reports
  std::string text;

  std::string encode() const;  // at most kMaxBytes (the text is cut to fit)
  static std::optional<Notice> decode(const char* data, size_t bytes);
};

class Engine;
struct Group;

// A group's notices, on the turning thread (the engine drives them: group/notices.cc).
struct GroupNotices {
  Engine* engine = nullptr;
  // The group, while it lives: the engine holds it (owner.lock()) while it reads `group`; a
  // group destroyed before its closeControl ran is treated as closed.
  const Group* group = nullptr;
  std::weak_ptr<const Group> owner;
  uint32_t groupId = 0;
  uint64_t incarnation = 0;  // the group's: stamped on what it sends, checked on what arrives
  // A notice of this group, from this rank, stamped with its incarnation.
  Notice notice(Notice::Type type, uint32_t sequence) const;
  bool open = false;
  bool received = false;  // the receive completed: apply `arrived`, take the next one
  std::unique_ptr<Request> receive;
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
  // News (Engine::floodNews): the ranks known gone grew since the last flood; when that was;
  // the words of the first loss known here.
  bool newsPending = false;
  std::set<int> newsOf;  // ranks whose loss this group has taken in (failed, news to spread)
  TimePoint lastFlood = TimePoint::min();
  std::string newsWhy;
  // Ops another rank reported timed out (its notice went to every rank: this rank's own timeout
  // of the same op adds nothing), and ranks counted gone here that spoke since (told so, once a
  // second at most).
  std::deque<uint32_t> timeoutsHeard;
  std::map<int, TimePoint> toldGone;
  // The heartbeats this group asked of the runtime: addresses beaten, addresses watched.
  std::vector<std::string> beats, watches;
};

}  // namespace ddl
