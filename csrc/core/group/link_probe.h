// The link probe: at the creation of a group that spans hosts, the cost model's latency and
// bandwidth of every dimension (allreduce_plan.h, LinkCosts) are measured, unless
// TORCH_DDL_LINKS names them or TORCH_DDL_PROBE_LINKS=0.
//
// 0. The host level, on every host at once (the load a host stage meets: the other hosts'
//    ranks are busy too): each host's ranks form a ring in rank order; its first rank times a
//    token's laps (latency: a lap over the ranks) and ring steps in which every rank sends
//    1 MiB to the next, receives 1 MiB and adds it to its own (bandwidth: 1 MiB over a step less
//    the latency), and passes on the medians; every rank takes the slowest host's figures (the
//    largest latency, the smallest bandwidth). Hosts of one rank take no part. About 2 ms at
//    5 GB/s.
// 1. Per dimension d >= 1, in order: the first ring of dimension d (topology.h) lends its first two
//    ranks, the measurer and the responder; every other rank only waits for the result.
// 2. Latency: kPings round trips of 8 bytes; the median round trip, halved.
// 3. Bandwidth: the measurer sends kSmallBytes, then (when that took less than kFastEnough)
//    kLargeBytes, each answered by a 1-byte acknowledgement; bandwidth = bytes / (time - one
//    round trip), the larger transfer's. At 1 Gbit/s the probe takes about 40 ms, and never more
//    than kSmallBytes at the link's rate plus 8 round trips on a slow one.
// 4. The figures travel up the group's creation tree (bootstrap.h) and back down, the slowest
//    of each subtree on the way up, so every rank plans with the same ones and no rank reads
//    the store: 2 (P - 1) messages of 16 bytes per level, which also keep the probes of two
//    levels from running at once.
// A process measures a host's level (by host and ranks on it) and the link between two hosts
// (by dimension) once: where the leading rank of a later group's probe measured them before, it
// tells the others so (the token's first lap; a first message to the responder) and passes on
// what it has. The other ranks need no memory of their own.
// Messages travel as point-to-point messages of reserved tags, before any user operation.
#pragma once

#include <string>

#include "../topology/allreduce_plan.h"
#include "../topology/topology.h"

namespace ddl {

class Communicator;

// Fills the dimensions of `links` that need it (see above); every rank of the group calls it.
// Throws when a peer does not answer within the group's timeout.
void probeLinks(Communicator& comm, const Topology& topology, LinkCosts* links);

}  // namespace ddl
