// Heartbeats: how a process learns in bounded time that a peer has stopped, on any transport.
// UCX reports a peer gone when a connection fails: at once for a process that died on a live
// host (its kernel closes the connection), but for a host that lost power, a cut cable or a
// stopped process only when TCP's retransmissions give up (minutes with the kernel's defaults)
// or UCX's keepalive notices (20 s by default, and not on every transport). So ddl's runtime
// sends a small message of its own to a few peers every period, and counts a peer gone once
// nothing has come from it for the timeout (TORCH_DDL_HEARTBEAT_MS, 250; and
// TORCH_DDL_HEARTBEAT_TIMEOUT_MS, 2000, in a process and in the simulator alike).
//
// Whom: each group makes every rank beat and watch its successors and predecessors at distances
// 1, 2, 4, ... (below the group's size); a process beats and watches the union over its groups,
// once per peer. A rank is watched by up to 2 log2(P) others, on both sides, so any block of dead
// ranks shorter than half the group (a host, a rack) still has live watchers at its edges. Where
// more die at once, a dead rank may have none; the survivors, without a quorum then, still learn
// that the group failed from the ranks that were watched. Cost: 2 log2(P) messages of 8 bytes per
// period per process, the same endpoints the news uses.
//
// Silence counts only while this process listened: a tick that comes more than a period after it
// was due (the process stopped, descheduled, or its progress thread busy in a long reduction)
// finds the beats of that stretch not yet taken, so the stretch is left out of every peer's
// silence. A process that was itself away does not count its peers gone for it; they count it
// gone if it was away for the timeout.
//
// A beat carries the sender's id (a digest of its address), which the receiver maps back to the
// peer it watches. Beats are taken from the transport's unexpected messages (no receive is ever
// posted for them) once per housekeeping period.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../base/clock.h"
#include "../transport/transport.h"

namespace ddl {

class Heartbeat {
 public:
  // `period` 0: off (nothing is sent, nobody is counted gone).
  Heartbeat(std::chrono::milliseconds period, std::chrono::milliseconds timeout)
      : period_(period), timeout_(timeout) {}
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  bool on() const { return period_.count() > 0; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::chrono::milliseconds period() const { return period_; }
  // The process's own address (its beats carry its digest).
  void setSelf(const std::string& address) { self_ = idOf(address); }
  // Counted uses: beat `peer` (at `address`); watch `address` (heard from now on, at `now`).
  void beat(const std::string& address, PeerId peer);
  void unbeat(const std::string& address);
  void watch(const std::string& address, TimePoint now);
  void unwatch(const std::string& address);

  // Takes the beats that arrived, sends what is due, and returns the watched peers silent for
  // the timeout (each once) with the words that say so. `lost(address)`: peers known gone
  // already (not beaten, not reported again).
  using IsLost = std::function<bool(const std::string&)>;
  std::vector<std::pair<std::string, std::string>> tick(Transport& transport, TimePoint now,
                                                        const IsLost& lost);
  // Sends the beats due, and nothing else: what a turning thread held up outside the process
  // (Runtime::callOutside) does meanwhile. It takes no beat in and counts no peer gone: its next
  // tick finds the stretch away, as after any absence, while its watchers hear it all along.
  void sendDue(Transport& transport, TimePoint now, const IsLost& lost);
  // When tick must run next (TimePoint::max(): never).
  TimePoint next() const;
  // When a beat of the process at `address` last arrived, if this process watches it (the time
  // the watch began, before any beat). Turning thread.
  std::optional<TimePoint> heard(const std::string& address) const;
  size_t watchedCount() const { return watched_.size(); }
  // Lets go of what the transport holds (before it closes).
  void stop(Transport& transport);

  // The digest beats carry for `address` (FNV-1a: the same in every process).
  static uint64_t idOf(const std::string& address);

 private:
  void receive(Transport& transport, TimePoint now);

  const std::chrono::milliseconds period_;
  const std::chrono::milliseconds timeout_;
  uint64_t self_ = 0;
  struct Target {
    PeerId peer;
    int uses;
  };
  std::map<std::string, Target> targets_;  // by address
  struct Watched {
    uint64_t id;  // idOf(address)
    std::string address;
    TimePoint heard;
    int uses;
    bool reported = false;
    std::chrono::nanoseconds awayAtHeard{0};  // away_ when it was last heard
  };
  // How long `w` has been silent while this process listened.
  std::chrono::nanoseconds silence(const Watched& w, TimePoint now) const {
    return now - w.heard - (away_ - w.awayAtHeard);
  }
  // Sorted by id. A vector, not a map: every tick walks it, and at 65 536 simulated ranks the
  // walk through a map's nodes was a fifth of the simulator's time.
  std::vector<Watched> watched_;
  std::vector<Watched>::iterator findWatched(uint64_t id) {
    auto it = std::lower_bound(watched_.begin(), watched_.end(), id,
                               [](const Watched& w, uint64_t id) { return w.id < id; });
    return it != watched_.end() && it->id == id ? it : watched_.end();
  }
  std::vector<Watched>::const_iterator findWatched(uint64_t id) const {
    return const_cast<Heartbeat*>(this)->findWatched(id);
  }
  TimePoint nextBeat_ = TimePoint::min();
  TimePoint nextSilence_ = TimePoint::max();  // the earliest a watched peer may fall silent
  TimePoint due_ = TimePoint::max();          // when the last tick asked for the next
  std::chrono::nanoseconds away_{0};          // time this process was away, in all
  // Beats in flight: the 8 bytes live here until the transport is done with them.
  struct Sent {
    Request request;
    uint64_t id = 0;
  };
  std::vector<std::unique_ptr<Sent>> sent_;
  uint64_t inbox_ = 0;
  std::unique_ptr<Request> receiving_;
  std::unique_ptr<Request> spare_;  // not posted: for the next look
};

}  // namespace ddl
