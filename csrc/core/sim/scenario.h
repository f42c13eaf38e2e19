// A fault scenario: one world drawn from one seed (FoundationDB's simulation, TigerBeetle's
// VOPR): the machine (ranks, hosts of uneven sizes, racks), a sequence of operations (a training
// step's buckets, barriers, all_to_all, sends and receives), the faults and when they strike,
// and how the survivors respond. Everything random comes from the seed, so the seed alone
// replays the scenario, bit for bit (sim/campaign.h runs and checks it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "calls.h"
#include "cluster.h"

namespace ddl {

struct Fault {
  enum class Kind : uint8_t {
    kKill,       // one process dies (its host lives on: its connections are reset)
    kKillHost,   // a whole host dies (nobody is told: heartbeats find it)
    kKillRack,   // every host of a rack dies
    kCut,        // the link between two ranks is cut (quietly)
    kPartition,  // the machine splits into two sides that cannot talk (quietly)
    kStall,      // a rank stops turning for `millis`, then resumes (or never: millis < 0)
    kSlowRank,   // a rank computes `factor` times slower
    kSlowLink,   // a host's NIC is `factor` times slower
    kDisagree,   // a rank calls something else in op `op` (`how`: collective, size, dtype, root)
  };
  Kind kind = Kind::kKill;
  std::vector<int> ranks;  // killed, one side, stalled, slow or disagreeing (a cut: its two ends)
  int op = 0;              // the op during which it strikes
  double micros = 0;       // after that op started (virtual)
  double millis = 0;       // a stall's length
  double factor = 1;       // a slow rank's or link's
  int host = -1;           // a slow link's
  std::string how;         // a disagreement's
  std::string describe() const;  // "kill 5-7 (host 1) in op 2 at 120 us"
};
const char* faultKindName(Fault::Kind kind);
inline constexpr int kFaultKinds = static_cast<int>(Fault::Kind::kDisagree) + 1;

struct Scenario {
  uint64_t seed = 0;  // the scenario's own: it alone draws everything below
  ClusterSpec cluster;
  std::vector<SimCall> ops;  // in order
  std::vector<Fault> faults;
  // The group's first op number: 0, or a few ops before the tag's sequence field wraps (2^16)
  // or an op's number does (2^32), as in a job that has run for long. Drawn apart from the rest
  // (the worlds of seeds drawn before it are unchanged).
  uint64_t firstOp = 0;
  // A rank whose first shrink call names arguments it refuses, then calls again (-1: none).
  int refuser = -1;
  // Group lifecycles: after the ops on the shrunk group, its ranks split it, fail an op of the
  // split (one rank calls another collective), destroy it with that op's leftovers in flight,
  // split again and run an op on the new group.
  bool lifecycle = false;
  // Windows, before the ops (the group still whole): every rank makes `windows` windows at once
  // (1 or 2) and runs `windowRounds` rounds of a put and a signal to a peer and a wait for a
  // peer's, checking what each wait covers; in round `lateRound`, rank `lateSignaler` signals a
  // round late (its peer's wait times out, a later wait takes it); half way every rank
  // deregisters and registers anew. 0 windows: none.
  int windows = 0;
  int windowRounds = 0;
  size_t windowFloats = 0;  // a rank's block in a peer's memory
  int lateSignaler = -1, lateRound = -1;
  // Two groups: every op also runs at once on a second group of every rank (split from the
  // first), each rank starting the two in an order of its own, as two threads of it would.
  bool twoGroups = false;
  // A slow reduction: rank `slowReducer` reduces and copies `slowReduction` times slower than
  // the others (10^3 - 10^5 times: up to about 13 s a call, in the largest ops) from the start
  // (-1: none). Its heartbeats must still leave: every algorithm gives up its turn between
  // blocks of its reductions and copies (Op::turnDue), and a block (a ring's segment, 256 KiB)
  // takes at most 1.3 s at 10^5, within the heartbeats' timeout of 2 s.
  int slowReducer = -1;
  double slowReduction = 1;
  // A hostile peer: as op `hostileOp` starts, rank `hostile` sends its neighbours malformed,
  // truncated and oversized control messages, data of the wrong size under the op's tag, and
  // replays of what it sent before (-1: none). It runs the ops as the others do.
  int hostile = -1;
  int hostileOp = 0;
  // What it sends (bits): kReplays, kPrints (call prints), kControl (notices, agreement words,
  // heartbeats), kData (the op's data slots).
  enum : int { kReplays = 1, kPrints = 2, kControl = 4, kData = 8 };
  int hostileSends = 0;
  // A slow store (drawn only where asked: ScenarioLimits::slowStore): from the windows and ops
  // on (creation done), the store's one server takes `slowStoreMicros` to answer each request
  // (0: the measured figure), so that every rank asking once queues 0.5 - 4 s there, past the
  // heartbeats' timeout at the long end. A rank that looks a peer up waits its turn there,
  // beating meanwhile (Runtime::callOutside) but learning nothing.
  double slowStoreMicros = 0;
  // Where an all_to_all is among the ops: half the time it runs Bruck's rounds
  // (cluster.plan->alltoall), which auto takes from 1 024 ranks only. Drawn apart from the rest.
  bool alltoallBruck = false;
  // Host groups (sim/host_groups.h): every host of two or more ranks splits off a group of its
  // own, and after op i each runs allreduce hostOps[i] on it (empty: none). Drawn apart from the
  // rest, in shared-memory worlds.
  std::vector<SimCall> hostOps;
  bool shrink = true;          // the survivors' response to a failed group: shrink, or give up
  std::vector<SimCall> after;  // on the group the shrink formed
  int ranks() const;
  std::string describe() const;
};

// A campaign's limits: scenarios drawn larger are passed over (the next seed is drawn). And
// the paths drawn only where asked: a slow store (in half the scenarios), which a rank's
// learning of deaths does not yet survive (docs/faults.md).
struct ScenarioLimits {
  int maxRanks = 8192;
  bool slowStore = false;
};

// The seed of the `index`-th draw of the campaign of `campaignSeed`. A scenario is its seed's
// alone (most worlds small: 2 % are drawn from 129 to 1 024 ranks, 0.3 % from 1 025 to 8 192),
// so that `python -m torch_ddl.sim --scenario SEED` replays it.
uint64_t scenarioSeed(uint64_t campaignSeed, uint64_t index);
// `slowStore`: a slow store is drawn too (ScenarioLimits); without it, the worlds are as before.
Scenario drawScenario(uint64_t seed, bool slowStore = false);

}  // namespace ddl
