// One simulated run, as `python -m torch_ddl.sim` asks for it: a cluster of the given shape
// creates a group and runs one collective, optionally with a set of ranks killed at once
// part-way through it (then, optionally, the survivors shrink and run 20 collectives of mixed
// kinds on the group they formed), and reports what it cost (virtual time, the cost model's
// prediction, store requests, the most endpoints a rank opened, messages) and, with payload,
// whether every rank's result is right.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cluster.h"

namespace ddl {

struct SimRequest {
  ClusterSpec cluster;
  std::string collective = "allreduce";  // allreduce, broadcast, allgather, reduce_scatter,
                                         // reduce, gather, scatter, alltoall, barrier
  size_t bytes = 0;                      // per rank (float32 elements: bytes / 4)
  uint64_t seed = 1;                     // the inputs
  // Ranks that die at once when `killFraction` of the fault-free op's time has passed (none:
  // no fault).
  std::vector<int> killRanks;
  double killFraction = 0.5;
  // Ranks cut off from the rest (quietly: nothing fails, heartbeats find it) at
  // `partitionFraction` of the op's time.
  std::vector<int> partitionRanks;
  double partitionFraction = 0.5;
  // A rank that stops turning at `stallFraction` of the op's time for `stallMillis` (< 0: for
  // good); -1: none.
  int stallRank = -1;
  double stallFraction = 0.5;
  double stallMillis = -1;
  // A rank that computes `slowFactor` times slower, a host whose NIC is `slowLinkFactor` times
  // slower, from the start (-1: none): they cost time, and nothing fails.
  int slowRank = -1;
  double slowFactor = 1;
  int slowLinkHost = -1;
  double slowLinkFactor = 1;
  bool faulted() const { return !killRanks.empty() || !partitionRanks.empty() || stallRank >= 0; }
  // Microseconds after the op's start at which every rank is looked at as
  // `python -m torch_ddl.status` would (SimReport::status); < 0: never.
  double statusAtMicros = -1;
  // After the fault, the survivors shrink the group, each excluding the ranks it knows are gone,
  // and run kShrinkOps collectives of mixed kinds on the group they formed.
  bool shrink = false;
  static constexpr int kShrinkOps = 20;
  // Each of them carries payload (where the cluster does) while its inputs or outputs come to at
  // most this many bytes in all (SimCall::payloadBytes); past it, it runs and ends without it.
  uint64_t payloadLimit = UINT64_MAX;
  // An all_to_all holds a block of every peer on every rank: P^2 in one process, whatever the
  // payload. Past this many members the shrunk group's all_to_all is a send/recv ring instead.
  static constexpr int kShrinkAlltoallMembers = 8192;
  static constexpr int kShrinkAttempts = SimCluster::Shrink::kAttempts;
  // Lines that tell how a long run goes, as it goes (none where empty): the fault-free op's end,
  // the second cluster's group formed, the fault's reckoning, the shrink, each of its
  // collectives; each with the virtual time, the wall time and the process's peak memory so far.
  std::function<void(const std::string&)> progress;
  // Every survivor should know every killed rank within this much virtual time of the kill:
  // the heartbeat's timeout (the default, 2 s) and a second for the news.
  std::chrono::milliseconds newsBound{3000};
};

struct SimReport {
  int ranks = 0;
  std::string algorithm;  // the plan (allreduce) or the collective's name
  size_t bytes = 0;
  double simMicros = 0;    // virtual time from the op's start to the last rank's end
  double modelMicros = 0;  // the cost model's prediction for the same plan or schedule (else 0)
  uint64_t storeRequests = 0;
  int maxEndpoints = 0;
  uint64_t messages = 0;    // every message of the run: creation, the op, failures
  uint64_t opMessages = 0;  // the op's own: its data and call prints
  uint64_t creationMessages = 0;
  double creationMicros = 0;
  uint64_t events = 0;
  uint64_t digest = 0;  // of every message delivered: equal runs give equal digests
  // The fraction of the op's time the busiest link of each level (a rank's port, a NIC, an
  // uplink) was busy during it: how much the level's largest busy time grew over the op.
  double busiest[3] = {0, 0, 0};
  bool checked = false;  // results compared with the reference (payload on)
  std::string mismatch;  // the first wrong result, "" when every rank's is right
  // With ranks killed: of the survivors, how many know every rank of the set is gone (within
  // newsBound), by when (from the kill), and how many messages the failure caused (notices).
  // With a partition: of all ranks, how many know every rank of the other side gone; with a
  // stall, of the others, how many know the stalled rank gone.
  int survivors = 0;
  int named = 0;
  double namedByMicros = 0;
  uint64_t failureMessages = 0;
  double killedAtMicros = 0;
  uint64_t killDigest = 0;   // the digest of the run with the kill (and the shrink after it)
  std::string firstError;    // one survivor's error, for the record
  std::string unnamedError;  // a survivor that does not know the whole set, and why ("": none)
  // With the shrink: how many groups the survivors formed (by id), of how many members, the
  // virtual time from the shrink calls to the last one's end, and of the collectives after it
  // how many were right on every member.
  int shrinkGroups = 0;
  int shrinkMembers = 0;
  double shrinkMicros = 0;
  uint64_t shrinkMessages = 0;  // delivered from the shrink's start until its group formed
  int shrinkOpsOk = 0;
  int shrinkOpsChecked = 0;  // of those, the ones that carried payload and had it checked
  int shrinkAttempts = 0;
  std::string shrinkError;  // the first failure of the shrink or of a collective after it
  // Survivors whose op ended well (the dead rank's part had reached them): they are counted by
  // the error of their next call (a barrier), which the failed group refuses.
  int completed = 0;
  double wallSeconds = 0;
  // With statusAtMicros: each rank's row (SimCluster::statusRows), taken at statusTakenMicros
  // after the op's start (the first event from the time asked).
  std::vector<std::string> status;
  double statusTakenMicros = 0;
};

SimReport simulate(const SimRequest& request);

}  // namespace ddl
