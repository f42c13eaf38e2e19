// The link probe: at the creation of a group that spans hosts, the cost model's latency and
// bandwidth of every dimension (topology/allreduce_plan.h, LinkCosts) are measured, unless
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
// The probe is part of the creation op (group/creation.cc): its messages travel under the
// group's sequence 0 in steps of their own (tag::kProbeStep), and its times are read from the
// runtime's clock, so it runs in the simulator as it does in a process.
#pragma once

#include <string>

#include "../base/config.h"
#include "../base/task.h"
#include "../runtime/op.h"
#include "../topology/allreduce_plan.h"
#include "../topology/topology.h"

namespace ddl {

class Engine;

// Whether a group on `topology` with `links` has figures to measure (see above).
bool linksToProbe(const Config& settings, const Topology& topology, const LinkCosts& links);
// Fills the dimensions of `links` that need it; every rank of the group runs it, in an op of the
// group. Fails the op when a peer does not answer within its deadline.
Task probeLinks(Op& op, Engine& engine, const Topology& topology, LinkCosts* links);

}  // namespace ddl
