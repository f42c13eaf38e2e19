// The figures the cost model weighs, per dimension of the machine (topology.h): each level's
// latency and bandwidth, as probed (group/link_probe.h), given (TORCH_DDL_LINKS) or defaulted.
#pragma once

#include <string>
#include <vector>

namespace ddl {

// Latency (seconds) and bandwidth (bytes per second, per direction) of one dimension's links,
// and the time a rank's processor spends on each message it sends or receives over them (LogP's
// o: the transport's and the engine's work for one message, which no other message of the rank
// overlaps).
struct LinkCost {
  double latency = 0;
  double bandwidth = 0;
  double overhead = 0;  // seconds, each side of a message
  // Where the figures come from: "default", "TORCH_DDL_LINKS" or "probed" (group/link_probe.h).
  std::string origin = "default";
};
// By dimension. Defaults: 0 (shared memory) 2 us, 5 GB/s, 0.1 us a message; 1 (hosts) 30 us,
// 1.25 GB/s (10 Gbit/s), 3 us a message (TCP); 2 and above (racks) 50 us, 1.25 GB/s, 3 us.
struct LinkCosts {
  std::vector<LinkCost> byDimension;
  // Bytes per second a rank reduces (TORCH_DDL_LINKS entry "reduce:8GB"); 0: reductions cost
  // nothing beyond the links, as where the host level was probed (its figures include them).
  double reduceBandwidth = 0;
  // The segment rings send messages in (TORCH_DDL_SEGMENT_BYTES): a step's reduction overlaps
  // its arrival but for its last segment.
  double segmentBytes = 262144;
  const LinkCost& at(int dimension) const;
  // "0:2us:5000MB,1:61us:117MB (1 probed)": the figures, and which were not defaults.
  std::string describe() const;
};
LinkCosts defaultLinks();
// "1:50us:117MB,2:100us:40MB:1us" (TORCH_DDL_LINKS): per dimension, its latency (s, ms, us or
// ns), bandwidth (bytes/s with optional K, M, G, each 1000x; e.g. 117MB or 1.2GB) and optionally
// the overhead of a message (a time; the default's where not given); dimensions not named keep
// their defaults; "reduce:8GB" sets reduceBandwidth. Throws naming the malformed entry.
LinkCosts parseLinks(const std::string& spec);

}  // namespace ddl
