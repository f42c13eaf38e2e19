#include "config.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "tag.h"
#include "types.h"

namespace ddl {
namespace {

const std::vector<ConfigEntry> kTable = {
    {"TORCH_DDL_ALLREDUCE_ALGO", "auto",
     "allreduce algorithm: auto, multidim, leaders, direct, staged, shm_ring, ring or "
     "recursive_doubling (auto, one host: recursive doubling up to TORCH_DDL_SMALL_BYTES; above "
     "it, when every rank can map its neighbour's shared memory, direct if every rank's tensor is "
     "in a shared buffer (torch_ddl.empty_shared), else staged up to TORCH_DDL_STAGED_BYTES, else "
     "shm_ring; else ring. auto, several hosts: the plan the cost model finds cheapest, see "
     "python -m torch_ddl.info --plan. direct, staged and shm_ring alone fail where they cannot "
     "be used)"},
    {"TORCH_DDL_SMALL_BYTES", "4096",
     "auto, one host: allreduce of at most this many bytes uses recursive doubling, larger ones "
     "the shared-memory paths (where the ranks cannot map each other's memory: recursive "
     "doubling up to 64 KiB, a ring above)"},
    {"TORCH_DDL_DIRECT_MIN_BYTES", "1048576",
     "auto: an allreduce of at least this many bytes asks the peers whether every rank's tensor "
     "is in a shared buffer (then: direct); smaller ones ask only while the last answer was yes "
     "(65536 by default with TORCH_DDL_SHARED_ALLOCATOR=1)"},
    {"TORCH_DDL_SEGMENT_BYTES", "262144",
     "pipeline segment (bytes) of ring allreduce/allgather and tree broadcast; shm_ring slot"},
    {"TORCH_DDL_PIPELINE_DEPTH", "4",
     "receives in flight per ring step; shm_ring inboxes hold twice this many slots"},
    {"TORCH_DDL_RINGS", "0",
     "rings a large allreduce is split across, odd ones running the opposite direction (flat "
     "ring, and per colour of multidim); 0: 1 for the flat ring, the cost model's choice for "
     "multidim"},
    {"TORCH_DDL_SPIN_US", "50",
     "microseconds the progress thread, and a caller waiting for its op (turning the runtime "
     "itself while the thread is idle), poll before they sleep"},
    {"TORCH_DDL_SHARE_TENSORS", "1",
     "1: a CPU tensor of at least TORCH_DDL_DIRECT_MIN_BYTES allreduced a second time, whose "
     "memory is a block of its own (glibc's large allocations), is moved into shared memory in "
     "place (same address, same bytes), so that its allreduces take the direct path; so is a "
     "one-sided window's tensor that is such a block, as it registers; 0: never"},
    {"TORCH_DDL_DEVICE_SEGMENT_BYTES", "4194304",
     "TORCH_DDL_SEGMENT_BYTES for tensors in device (CUDA) memory, whose every message costs "
     "UCX a rendezvous"},
    {"TORCH_DDL_COLORS", "0",
     "colours of the multi-dimensional allreduce (colour c walks the dimensions starting at the "
     "c-th); 0: the cost model's choice"},
    {"TORCH_DDL_LEVEL_ORDER", "",
     "dimensions colour 0 of multidim walks first, comma-separated (0 within a host, 1 across "
     "hosts, 2 across racks); empty: innermost first"},
    {"TORCH_DDL_WAVES", "0",
     "waves each multidim lane is cut into, following each other through the levels so that one "
     "is on the network while the next is on the host; 0: the cost model's choice"},
    {"TORCH_DDL_HIERARCHICAL", "1",
     "1: across hosts, reduce_scatter and all_gather go level by level (regular grids: the same "
     "ranks per host) and broadcast enters each host once; 0: flat rings and trees"},
    {"TORCH_DDL_TOPOLOGY", "",
     "racks of hosts, 'rack: host host; rack: host ...' or @file with one rack per line; empty: "
     "no level above the host"},
    {"TORCH_DDL_LINKS", "",
     "link latency and bandwidth per dimension for the cost model, e.g. '1:50us:117MB,2:80us:40MB' "
     "(defaults 0:2us:5GB, 1:30us:1.25GB, 2:50us:1.25GB)"},
    {"TORCH_DDL_HOST_SLOTS", "1",
     "1: the host level of a multidim allreduce (CPU tensors) moves its bytes through "
     "shared-memory slots where the host's ranks can map each other's, as the one-host shm_ring "
     "does; 0: over UCX messages"},
    {"TORCH_DDL_PROBE_LINKS", "1",
     "1: a group that spans hosts measures the latency and bandwidth of each level above the "
     "host that TORCH_DDL_LINKS does not name, once at creation (two ranks, about 40 ms at "
     "1 Gbit/s), for the cost model; 0: the defaults"},
    {"TORCH_DDL_TRACE_ENTRIES", "2000",
     "operations the flight recorder keeps (all groups of the process, newest last); 0: none"},
    {"TORCH_DDL_TRACE_FILE", "/tmp/torch_ddl_trace_rank_",
     "where the flight recorder is dumped when an op fails (this prefix, then the rank), in the "
     "layout of torch's flight recorder; empty: only on demand (torch_ddl.dump_trace)"},
    {"TORCH_DDL_DEBUG", "",
     "a log, as NCCL_DEBUG: WARN (every fallback: a host ring over messages, a buffer not "
     "adopted, a peer's buffer not mapped), INFO (also each group's creation: its machine, link "
     "figures and, once per size class, the allreduce plan), TRACE (also one line per op); "
     "empty: none"},
    {"TORCH_DDL_DEBUG_FILE", "",
     "where the log goes (%h: host name, %p: process id); empty: standard error"},
    {"TORCH_DDL_HEARTBEAT_MS", "250",
     "every this many milliseconds a process sends each of a few peers (its successors and "
     "predecessors at distances 1, 2, 4, ... in each group) an 8-byte heartbeat; 0: none (a "
     "stopped process or a lost host is then found only by the transport or the op timeout)"},
    {"TORCH_DDL_HEARTBEAT_TIMEOUT_MS", "2000",
     "a watched peer (one at such a distance) silent this long is counted gone: its "
     "groups fail naming it, on every rank, and the news spreads to the others"},
    {"TORCH_DDL_STAGED_BYTES", "524288",
     "auto, one host: an allreduce above TORCH_DDL_SMALL_BYTES and up to this size "
     "(of a tensor not in a shared buffer) is staged: each rank copies it into a buffer every rank "
     "maps and reduces its share out of all of them, the ranks pacing each other through flags in "
     "shared memory, with no message; each rank's buffer takes twice this; 0: never (the ring)"},
    {"TORCH_DDL_STATUS", "1",
     "1: each process answers `python -m torch_ddl.status` (what it runs and awaits; nothing "
     "can be changed through it) on a TCP port of its own, whose address it publishes in the "
     "job's store; 0: it does not"},
    {"TORCH_DDL_STATUS_ADDR", "",
     "the address the status port binds to; empty: the one this host reaches the job's store "
     "from (loopback where the store is on this host at 127.0.0.1)"},
    {"TORCH_DDL_METRICS_PORT", "",
     "a port P: the process of local rank i (LOCAL_RANK, else its rank) serves Prometheus "
     "metrics on P + i (needs prometheus_client); empty: none"},
    {"TORCH_DDL_METRICS_ADDR", "127.0.0.1",
     "the address the metrics port binds to (0.0.0.0: every interface)"},
    {"TORCH_DDL_ALLGATHER_ALGO", "auto",
     "allgather algorithm: auto, ring or bruck (auto: per block size, the cheaper by the cost "
     "model of the rings (level by level across hosts) and, for blocks up to 64 KiB, Bruck's "
     "ceil(log2 P) rounds; ring: the rings); reduce_scatter takes the same schedules run "
     "backwards, chosen by the same model with its packing and reductions priced"},
    {"TORCH_DDL_DEVICE_STAGE_BYTES", "0",
     "an allreduce of a CUDA tensor of at most this many bytes is reduced in pinned host memory: "
     "copied there behind the caller's stream's earlier work, reduced by the host algorithms, "
     "copied back before its Work completes (UCX's device-memory messages cost about 150 us "
     "each whatever their size); 0: never (every CUDA allreduce moves device memory)"},
    {"TORCH_DDL_ALLTOALL_ALGO", "auto",
     "all_to_all algorithm: auto, pairwise or bruck (auto: pairwise below 1 024 ranks, Bruck's "
     "ceil(log2 P) rounds from there; pairwise: every pair at once, an endpoint to every rank)"},
    {"TORCH_DDL_GATHER_ALGO", "auto",
     "gather algorithm: auto, linear or tree (auto: linear below 64 ranks, a binomial tree from "
     "there while the largest subtree a rank forwards is at most 256 MiB; linear: every rank "
     "sends to the root at once, each looking the root's address up; tree: ceil(log2 P) rounds, "
     "a rank holding up to half the blocks in scratch)"},
    {"TORCH_DDL_SHARED_ALLOCATOR", "0",
     "1: at import, torch_ddl becomes torch's CPU allocator for every allocation of at least "
     "TORCH_DDL_DIRECT_MIN_BYTES (then 65536 unless set), served from shared memory the ranks "
     "of one host map, so that their allreduces take the direct path at once; the memory is "
     "kept for reuse, as a caching allocator keeps it (docs/shared-memory.md); 0: torch's own"},
    {"TORCH_DDL_ONCE_BYTES", "65536",
     "auto or staged, one host (0: never): an allreduce whose bytes times the group's ranks "
     "less one (what each rank reads of the others') are at most this, once the group's staging "
     "buffers are set up, is reduced in one step: each rank copies its tensor into its buffer, "
     "raises a flag, and once every rank's flag is up reduces all of them in rank order; a "
     "caller that waits for it and finds nothing else in flight does this on its own thread "
     "(docs/internals.md, \"Same-host allreduce of small tensors: one step\")"},
};

size_t parseSize(const ConfigEntry& entry, size_t minimum) {
  std::string text = configValue(entry);
  char* end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || text[0] == '-' || value < minimum) {
    throw Error(std::string("ddl: ") + entry.name + "=" + text +
                " is not an integer >= " + std::to_string(minimum));
  }
  return static_cast<size_t>(value);
}

bool parseFlag(const ConfigEntry& entry) {
  const std::string value = configValue(entry);
  if (value != "0" && value != "1") {
    throw Error("ddl: " + std::string(entry.name) + "=" + value + " is not 0 or 1");
  }
  return value == "1";
}

std::vector<int> parseLevelOrder(const ConfigEntry& entry) {
  const std::string order = configValue(entry);
  std::vector<int> levels;
  for (size_t at = 0; at < order.size();) {
    size_t comma = std::min(order.find(',', at), order.size());
    std::string item = order.substr(at, comma - at);
    if (item.empty() || item.size() > 2 ||
        item.find_first_not_of("0123456789") != std::string::npos) {
      throw Error("ddl: " + std::string(entry.name) + "=" + order +
                  " is not a comma-separated list of dimensions (e.g. 1,0)");
    }
    levels.push_back(std::stoi(item));
    at = comma + 1;
  }
  return levels;
}

int parseDebug(const ConfigEntry& entry) {
  std::string debug = configValue(entry);
  std::transform(debug.begin(), debug.end(), debug.begin(), ::toupper);
  if (debug.empty() || debug == "OFF") return 0;
  if (debug == "WARN") return 1;
  if (debug == "INFO") return 2;
  if (debug == "TRACE") return 3;
  throw Error("ddl: " + std::string(entry.name) + "=" + configValue(entry) +
              " is not one of WARN, INFO, TRACE (or empty)");
}

Config read() {
  Config c;
  const std::string algo = configValue(kTable[0]);
  const std::optional<AllreduceAlgorithm> named = algorithmNamed(algo);
  if (!named || *named == AllreduceAlgorithm::kTrivial || *named == AllreduceAlgorithm::kShared) {
    throw Error("ddl: TORCH_DDL_ALLREDUCE_ALGO=" + algo +
                " is not one of auto, multidim, leaders, direct, staged, shm_ring, ring, "
                "recursive_doubling");
  }
  c.allreduceAlgorithm = *named;
  c.smallBytes = parseSize(kTable[1], 0);
  c.directMinBytes = parseSize(kTable[2], 0);
  c.sharedAllocator = parseFlag(kTable[32]);
  if (c.sharedAllocator && std::getenv(kTable[2].name) == nullptr) {
    c.directMinBytes = kSharedAllocatorDirectMinBytes;
  }
  c.segmentBytes = parseSize(kTable[3], 1);
  c.deviceSegmentBytes = parseSize(kTable[8], 1);
  c.pipelineDepth = parseSize(kTable[4], 1);
  c.rings = parseSize(kTable[5], 0);
  c.colors = parseSize(kTable[9], 0);
  c.waves = parseSize(kTable[11], 0);
  if (std::max<size_t>(c.rings, 1) * std::max<size_t>(c.colors, 1) * std::max<size_t>(c.waves, 1) >
      tag::kPlanPhases) {
    throw Error("ddl: TORCH_DDL_RINGS x TORCH_DDL_COLORS x TORCH_DDL_WAVES must be at most " +
                std::to_string(tag::kPlanPhases));
  }
  c.levelOrder = parseLevelOrder(kTable[10]);
  c.hierarchical = parseFlag(kTable[12]);
  c.hostSlots = parseFlag(kTable[15]);
  c.probeLinks = parseFlag(kTable[16]);
  c.topology = configValue(kTable[13]);
  c.links = configValue(kTable[14]);
  c.spinMicros = static_cast<long>(parseSize(kTable[6], 0));
  c.shareTensors = parseFlag(kTable[7]);
  c.traceEntries = parseSize(kTable[17], 0);
  c.traceFile = configValue(kTable[18]);
  c.debug = parseDebug(kTable[19]);
  c.debugFile = configValue(kTable[20]);
  c.heartbeatMillis = static_cast<long>(parseSize(kTable[21], 0));
  c.heartbeatTimeoutMillis = static_cast<long>(parseSize(kTable[22], 1));
  c.stagedBytes = parseSize(kTable[23], 0);
  c.onceBytes = std::min({parseSize(kTable[33], 0), c.stagedBytes, size_t{1} << 30});
  c.statusServer = parseFlag(kTable[24]);
  c.statusAddress = configValue(kTable[25]);
  if (!configValue(kTable[26]).empty()) {
    c.metricsPort = parseSize(kTable[26], 1);
    if (c.metricsPort > 65535) {
      throw Error("ddl: TORCH_DDL_METRICS_PORT=" + configValue(kTable[26]) +
                  " is not a port (1 to 65535)");
    }
  }
  c.metricsAddress = configValue(kTable[27]);
  c.allgatherAlgorithm = configValue(kTable[28]);
  c.deviceStageBytes = parseSize(kTable[29], 0);
  c.alltoallAlgorithm = configValue(kTable[30]);
  if (c.alltoallAlgorithm != "auto" && c.alltoallAlgorithm != "pairwise" &&
      c.alltoallAlgorithm != "bruck") {
    throw Error("ddl: TORCH_DDL_ALLTOALL_ALGO=" + c.alltoallAlgorithm +
                " is not one of auto, pairwise, bruck");
  }
  c.gatherAlgorithm = configValue(kTable[31]);
  if (c.gatherAlgorithm != "auto" && c.gatherAlgorithm != "linear" && c.gatherAlgorithm != "tree") {
    throw Error("ddl: TORCH_DDL_GATHER_ALGO=" + c.gatherAlgorithm +
                " is not one of auto, linear, tree");
  }
  if (c.allgatherAlgorithm != "auto" && c.allgatherAlgorithm != "ring" &&
      c.allgatherAlgorithm != "bruck") {
    throw Error("ddl: TORCH_DDL_ALLGATHER_ALGO=" + c.allgatherAlgorithm +
                " is not one of auto, ring, bruck");
  }
  if (c.heartbeatMillis > 0 && c.heartbeatTimeoutMillis < 2 * c.heartbeatMillis) {
    throw Error("ddl: TORCH_DDL_HEARTBEAT_TIMEOUT_MS=" + configValue(kTable[22]) +
                " must be at least twice TORCH_DDL_HEARTBEAT_MS=" + configValue(kTable[21]));
  }
  return c;
}

// Published once and replaced (never freed) by reloadConfig, so readers take no lock.
std::mutex gMutex;
std::atomic<const Config*> gConfig{nullptr};

}  // namespace

const std::vector<ConfigEntry>& configTable() { return kTable; }

namespace {

// agreedSettings as (name, value) pairs, in the table's order.
std::vector<std::pair<std::string, std::string>> agreedPairs(const Config& c) {
  auto number = [](size_t v) { return std::to_string(v); };
  auto flag = [](bool v) { return std::string(v ? "1" : "0"); };
  std::string order;
  for (int level : c.levelOrder) order += (order.empty() ? "" : ",") + std::to_string(level);
  const std::pair<const ConfigEntry&, std::string> agreed[] = {
      {kTable[0], algorithmName(c.allreduceAlgorithm)},
      {kTable[1], number(c.smallBytes)},
      {kTable[2], number(c.directMinBytes)},
      {kTable[3], number(c.segmentBytes)},
      {kTable[4], number(c.pipelineDepth)},
      {kTable[5], number(c.rings)},
      {kTable[8], number(c.deviceSegmentBytes)},
      {kTable[9], number(c.colors)},
      {kTable[10], order},
      {kTable[11], number(c.waves)},
      {kTable[12], flag(c.hierarchical)},
      {kTable[13], c.topology},
      {kTable[14], c.links},
      {kTable[15], flag(c.hostSlots)},
      {kTable[16], flag(c.probeLinks)},
      {kTable[23], number(c.stagedBytes)},
      {kTable[33], number(c.onceBytes)},
      {kTable[28], c.allgatherAlgorithm},
      {kTable[29], number(c.deviceStageBytes)},
      {kTable[30], c.alltoallAlgorithm},
      {kTable[31], c.gatherAlgorithm},
  };
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& [entry, value] : agreed) {
    std::string line = value;
    std::replace(line.begin(), line.end(), '\n', ' ');
    if (line.size() > kLongestAgreedValue) {  // a rack map of many hosts: its digest
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx",
                    static_cast<unsigned long long>(settingsDigest(line)));
      line = std::to_string(line.size()) + " characters, FNV-1a " + hex;
    }
    pairs.emplace_back(entry.name, std::move(line));
  }
  return pairs;
}

}  // namespace

std::string agreedSettings(const Config& c) {
  std::string text;
  for (const auto& [name, value] : agreedPairs(c)) text += name + "=" + value + "\n";
  return text;
}

uint64_t settingsDigest(const std::string& text) {
  uint64_t digest = 14695981039346656037ull;
  for (unsigned char ch : text) digest = (digest ^ ch) * 1099511628211ull;
  return digest;
}

namespace {

const char* tableDefault(const std::string& name) {
  for (const ConfigEntry& entry : kTable) {
    if (name == entry.name) return entry.defaultValue;
  }
  return "";
}

}  // namespace

std::string differenceWords(const std::vector<SettingDifference>& differences,
                            const std::string& mine, const std::string& theirs) {
  auto shown = [](const std::string& value) {
    return value.size() <= 100 ? value : value.substr(0, 100) + "...";
  };
  std::string words;
  bool direct = false;
  for (const SettingDifference& d : differences) {
    if (words.size() > 2000) break;
    words += (words.empty() ? "" : "; ") + d.name + " is " + shown(d.mine) + " " + mine + " and " +
             shown(d.theirs) + " " + theirs;
    direct |= d.name == "TORCH_DDL_DIRECT_MIN_BYTES";
  }
  if (direct) {
    words += " (TORCH_DDL_SHARED_ALLOCATOR=1 makes it " +
             std::to_string(kSharedAllocatorDirectMinBytes) + " where it is not set)";
  }
  return words;
}

std::string agreedSettingsDeparting(const Config& c) {
  std::string text;
  for (const auto& [name, value] : agreedPairs(c)) {
    if (value != tableDefault(name)) text += name + "=" + value + "\n";
  }
  return text;
}

std::string agreedSettingsFrom(const std::string& departing) {
  std::string text;
  for (const std::string& name : agreedSettingNames()) {
    const std::string key = name + "=";
    std::string said = tableDefault(name);
    for (size_t at = 0; at < departing.size();) {
      const size_t end = std::min(departing.find('\n', at), departing.size());
      if (departing.compare(at, key.size(), key) == 0) {
        said = departing.substr(at + key.size(), end - at - key.size());
      }
      at = end + 1;
    }
    text += key + said + "\n";
  }
  return text;
}

std::vector<std::string> agreedSettingNames() {
  std::vector<std::string> names;
  for (const auto& [name, value] : agreedPairs(config())) names.push_back(name);
  return names;
}

std::vector<SettingDifference> settingDifferences(const std::string& mine,
                                                  const std::string& theirs) {
  auto lines = [](const std::string& text) {
    std::vector<std::pair<std::string, std::string>> out;
    for (size_t at = 0; at < text.size();) {
      const size_t end = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, end - at);
      const size_t equals = line.find('=');
      if (equals != std::string::npos)
        out.emplace_back(line.substr(0, equals), line.substr(equals + 1));
      at = end + 1;
    }
    return out;
  };
  const auto ours = lines(mine), others = lines(theirs);
  auto find = [](const std::vector<std::pair<std::string, std::string>>& in,
                 const std::string& name) -> std::optional<std::string> {
    for (const auto& [n, v] : in) {
      if (n == name) return v;
    }
    return std::nullopt;
  };
  std::vector<SettingDifference> differences;
  for (const ConfigEntry& entry : kTable) {
    const auto a = find(ours, entry.name), b = find(others, entry.name);
    if (a == b) continue;
    differences.push_back({entry.name, a.value_or("(not said)"), b.value_or("(not said)")});
  }
  return differences;
}

std::string configValue(const ConfigEntry& entry) {
  const char* value = std::getenv(entry.name);
  return value != nullptr ? value : entry.defaultValue;
}

const Config& config() {
  const Config* current = gConfig.load(std::memory_order_acquire);
  if (current != nullptr) return *current;
  std::lock_guard<std::mutex> lock(gMutex);
  if (gConfig.load() == nullptr) gConfig.store(new Config(read()));
  return *gConfig.load();
}

void reloadConfig() {
  std::lock_guard<std::mutex> lock(gMutex);
  gConfig.store(new Config(read()));
}

}  // namespace ddl
