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
#include <string>
#include <vector>

#include "../base/clock.h"
#include "../base/status.h"
#include "../transport/transport.h"

namespace ddl {

struct Notice {
  // kRefusal: the sender refused its arguments and never started the op (the op fails, and no
  // rank can have finished it: what it shared with others may be given up cleanly).
  // kWaiting: the sender is still in the op halfway to its deadline and says whom it waits for
  // (text: "peers;not started", comma-separated ranks); nothing ends.
  enum class Scope : uint8_t { kOp, kGroup, kGroupTimeout, kRefusal, kWaiting };
  static constexpr size_t kMaxBytes = 2048;
  uint32_t sequence = 0;
  Scope scope = Scope::kOp;
  int from = -1;
  // Passed on down a binomial tree rooted at `from` (Engine::relayNotice), so that it reaches
  // every rank; false for one sent to chosen ranks only (wait reports in large groups).
  bool tree = true;
  // The rank it says is gone (-1: none): the tree passes around it (Engine::relayNotice).
  int gone = -1;
  StatusKind kind = StatusKind::kOther;  // of the failure it reports
  std::string text;

  std::string encode() const;  // at most kMaxBytes (the text is cut to fit)
  static std::optional<Notice> decode(const char* data, size_t bytes);
};

class Engine;
struct Group;

// A group's notices, on the turning thread (the engine drives them: group/notices.cc).
struct GroupControl {
  Engine* engine = nullptr;
  // The group, while it lives: the engine holds it (owner.lock()) while it reads `group`; a
  // group destroyed before its closeControl ran is treated as closed.
  const Group* group = nullptr;
  std::weak_ptr<const Group> owner;
  uint32_t groupId = 0;
  bool open = false;
  bool received = false;  // the receive completed: apply `arrived`, take the next one
  std::unique_ptr<Request> receive;
  std::vector<char> buffer = std::vector<char>(Notice::kMaxBytes);
  std::vector<Notice> arrived;
  std::map<uint32_t, Notice> early;  // for ops not started here yet
  int64_t started = -1;              // the highest collective sequence number started here
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
};

}  // namespace ddl
