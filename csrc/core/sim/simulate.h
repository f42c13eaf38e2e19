// One simulated run, as `python -m torch_ddl.sim` asks for it: a cluster of the given shape
// creates a group and runs one collective, optionally with a rank killed part-way through it,
// and reports what it cost (virtual time, the cost model's prediction, store requests, the most
// endpoints a rank opened, messages) and, with payload, whether every rank's result is right.
#pragma once

#include <cstdint>
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
  // A rank that dies once `killFraction` of the fault-free op's time has passed (-1: none).
  int killRank = -1;
  double killFraction = 0.5;
};

struct SimReport {
  int ranks = 0;
  std::string algorithm;  // the plan (allreduce) or the collective's name
  size_t bytes = 0;
  double simMicros = 0;    // virtual time from the op's start to the last rank's end
  double modelMicros = 0;  // the cost model's prediction for the same plan (allreduce; else 0)
  uint64_t storeRequests = 0;
  int maxEndpoints = 0;
  uint64_t messages = 0;  // every message of the run: creation, the op, failures
  uint64_t creationMessages = 0;
  double creationMicros = 0;
  uint64_t events = 0;
  uint64_t digest = 0;  // of every message delivered: equal runs give equal digests
  // The fraction of the op's time the busiest link of each level (a rank's port, a NIC, an
  // uplink) was busy during it: how much the level's largest busy time grew over the op.
  double busiest[3] = {0, 0, 0};
  bool checked = false;  // results compared with the reference (payload on, no fault)
  std::string mismatch;  // the first wrong result, "" when every rank's is right
  // With a rank killed: of the survivors, how many raised an error naming it, by when (from
  // the op's start), and how many messages the failure caused (notices).
  int survivors = 0;
  int named = 0;
  double namedByMicros = 0;
  uint64_t failureMessages = 0;
  double killedAtMicros = 0;
  uint64_t killDigest = 0;   // the digest of the run with the kill
  std::string firstError;    // one survivor's error, for the record
  std::string unnamedError;  // a survivor that did not name the dead rank, and why ("": none)
  // Survivors whose op ended well (the dead rank's part had reached them): they are counted by
  // the error of their next call (a barrier), which the failed group refuses.
  int completed = 0;
  double wallSeconds = 0;
};

SimReport simulate(const SimRequest& request);

}  // namespace ddl
