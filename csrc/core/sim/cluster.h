// A simulated cluster: the real engine, communicator, planner and algorithms of thousands of
// ranks in one process, turned by one event loop in virtual time (sim/network.h).
// Each rank has its own Engine (driven from outside, on the rank's virtual clock), its
// SimTransport and SimMemory, and its Communicator, created through the real creation path over
// an in-memory store that counts its requests. Nothing here re-implements what a real process
// does: the cluster only decides when each rank's engine turns.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "../group/communicator.h"
#include "memory.h"
#include "network.h"

namespace ddl {

// The machine the simulator assumes unless told (TORCH_DDL_LINKS syntax): 20 GB/s within a host,
// 100 Gbit/s NICs, a rack uplink at half of that; a message costs each side's processor 0.1 us
// within a host and 0.5 us across hosts. An assumption, not a measured machine; the command's
// default (torch_ddl.sim), the campaign's and the tests' (docs/sim.md).
inline constexpr const char* kSimulatedLinks =
    "0:2us:20GB:0.1us,1:5us:12.5GB:0.5us,2:8us:6GB:0.5us";

struct ClusterSpec {
  // Ranks of each host, in rank order (uneven allowed); or `ranks` in hosts of `ranksPerHost`.
  std::vector<int> hostSizes;
  int ranks = 0;
  int ranksPerHost = 1;
  int hostsPerRack = 0;  // 0: no rack level
  // Link figures per level, TORCH_DDL_LINKS syntax: the network's and the planner's alike.
  std::string links;
  double reduceBandwidth = 20e9;  // bytes/s a rank reduces (0: free)
  double copyBandwidth = 20e9;    // bytes/s a rank copies (0: free)
  // The store (torch's TCPStore): one server that answers requests one at a time. A request
  // answered (get, add, multi_get) takes storeMicros, plus storeKeyMicros for each key past the
  // first, and the rank waits for it; a set (TCPStore answers none) takes storeSetMicros of the
  // server and the rank goes on (0: at once). Measured here by benchmarks/store_service.py:
  // 31 us of the server's CPU a get, 2.2 a set, 112 a multi_get of 128 keys (docs/sim.md).
  double storeMicros = 31;
  double storeSetMicros = 2.2;
  double storeKeyMicros = 0.64;
  bool payload = true;
  // The ranks of a host map each other's memory (SimNetworkSpec::windows): allreduces of one
  // host take the shared-memory paths (staged, in one step, the caller's quick path, the ring
  // through slots) instead of messages. Only with the payload (those paths touch the bytes).
  bool sharedMemory = false;
  std::chrono::milliseconds timeout{60000};
  std::optional<PlanRequest> plan;  // default: the configuration's
};

class SimCluster {
 public:
  explicit SimCluster(const ClusterSpec& spec);
  ~SimCluster();
  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;

  int size() const { return network_->size(); }
  SimNetwork& network() { return *network_; }
  // Whether the ops started from now on carry their bytes (ClusterSpec::payload); none may be
  // in flight.
  void carryPayload(bool on);
  const SimNetworkSpec& layout() const { return network_->spec(); }
  // The levels' figures the planner and the network use.
  const LinkCosts& links() const { return links_; }
  // TORCH_DDL_TOPOLOGY's text for the racks ("" without racks), and rank r's locality.
  const std::string& rackMap() const { return rackMap_; }

  // Creates one group of every rank, as processes do (Creation::begin in rank order, the
  // event loop until every rank's exchange is done, finish); throws the first rank's error.
  void createGroup();
  Communicator& comm(int rank) { return *comms_.at(rank); }
  bool hasComm(int rank) const { return comms_.at(rank) != nullptr; }
  uint64_t storeRequests() const;
  // From now on the store's server takes `micros` to answer a request (a store that slows down).
  void slowStore(double micros);

  // Starts an operation on every live rank at the current virtual time (`start` gets the options
  // to pass: their Work records its end) and runs until every one has ended, or `limit` of
  // virtual time has passed.
  struct Outcome {
    TimePoint began;
    std::vector<std::optional<TimePoint>> ended;  // by rank; empty where it has not
    std::vector<std::string> errors;              // by rank; "" for success
    std::vector<Status> statuses;                 // by rank: how each op ended
    bool finished = false;                        // every live rank's op ended
  };
  using Start = std::function<std::shared_ptr<Work>(int rank, Communicator&, CallOptions)>;
  Outcome run(const Start& start, std::chrono::milliseconds limit);
  // The same over another group's communicators, by the cluster rank each runs on (null: that
  // rank takes no part).
  Outcome run(const std::vector<Communicator*>& members, const Start& start,
              std::chrono::milliseconds limit);
  // Runs the event loop until `done()` holds or `limit` of virtual time has passed.
  bool runUntil(const std::function<bool()>& done, std::chrono::milliseconds limit);
  // Ranks whose op runs on: not dead, and not stalled for good (a rank the run must wait for).
  // Once false for a rank it stays false for the rest of a run (a run looks at it no more).
  std::function<bool(int)> waitFor;
  // Called once, inside run(), at the first event at or after `when` (a look at the ranks while
  // their ops run: python -m torch_ddl.sim --status-at).
  void lookAt(TimePoint when, std::function<void()> look) {
    lookWhen_ = when;
    look_ = std::move(look);
  }
  // Each rank as `python -m torch_ddl.status` sees a process (runtime/status.h), one JSON object
  // per rank: {"rank", "host", "state": "ok", "answer": {...}} or state "dead" (killed) or
  // "stopped" (stalled: it would not answer).
  std::vector<std::string> statusRows();
  // The group of every rank (createGroup), by cluster rank.
  std::vector<Communicator*> members();

  // The survivors of a failed group shrink, as a job does: each rank in `trying` excludes the
  // ranks its group knows are gone; where an attempt fails because the views differ or a member
  // turns out gone (the news was still on its way), it tries again a moment later with what it
  // knows then; one without a quorum gives up. Each attempt runs until every shrink that
  // `waitFor` waits for has ended, or `limit`.
  struct Shrink {
    static constexpr int kAttempts = 5;
    std::vector<std::shared_ptr<Communicator>> groups;  // by cluster rank (null: none formed)
    std::vector<int> unfinished;                        // ranks whose shrink never ended
    int attempts = 0;
    std::string lastError;           // "rank R: why"
    std::set<uint32_t> ids() const;  // of the groups formed
    // The ranks of a group formed, by cluster rank (null: none), for run(); its size (0: none).
    std::vector<Communicator*> members() const;
    int size() const;
    // The cluster rank of each rank of the group formed: every rank its members agreed on, also
    // one whose own shrink failed (the agreement's answer never reached it: a partition that
    // struck meanwhile), which the others' ops then name.
    std::vector<int> ranks;
  };
  // `refuser` (a cluster rank, -1: none) first calls with arguments its rank refuses (itself
  // among the excluded), as a job's bug might, then again rightly: the others, told, retry.
  Shrink shrink(std::vector<bool> trying, std::chrono::milliseconds limit, int refuser = -1);

  // Every rank of the group `of` (by cluster rank; null: none) splits it into a group of
  // `ranks` (its ranks; empty: all of them), as split_group does (the ranks left out call too,
  // and form none); runs until every split `waitFor` waits for has ended, or `limit`. The
  // groups formed, by cluster rank (null: none; `error` says why, for one).
  std::vector<std::shared_ptr<Communicator>> split(const std::vector<Communicator*>& of,
                                                   std::chrono::milliseconds limit,
                                                   std::string* error,
                                                   const std::vector<int>& ranks = {});

  // The most endpoints any rank has opened.
  int maxEndpoints() const;
  // Over every rank: allreduces its callers ran on their own thread (group/quick.cc), and those
  // they began so but handed to an op.
  uint64_t quickOps() const;
  uint64_t handedOps() const;

 private:
  // Runs until every derivation in `pending` (by rank) that waitFor waits for has ended, or
  // `limit` of virtual time has passed.
  void awaitDerivations(const std::vector<std::unique_ptr<Derivation>>& pending,
                        std::chrono::milliseconds limit);
  class Store;
  std::unique_ptr<SimNetwork> network_;
  std::unique_ptr<SimMemory> memory_;
  std::shared_ptr<Store> store_;
  LinkCosts links_;
  std::string rackMap_;
  std::vector<Locality> localities_;
  std::vector<std::unique_ptr<SimClock>> clocks_;
  // The process's settings, but no flight-recorder dumps: a simulated rank that fails would
  // write (and overwrite) a real process's file for each rank number.
  Config settings_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::shared_ptr<Communicator>> comms_;
  ClusterSpec spec_;
  TimePoint lookWhen_ = TimePoint::max();
  std::function<void()> look_;
};

}  // namespace ddl
