// Every TORCH_DDL_* environment variable, in one table: name, default, one-line description.
// The values are read once per process, on first use; a malformed value is an error that names
// the variable. `python -m torch_ddl.info` prints the table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithm.h"

namespace ddl {

struct Config {
  AllreduceAlgorithm allreduceAlgorithm = AllreduceAlgorithm::kAuto;
  size_t smallBytes = 0;            // allreduce at most this large uses recursive doubling (auto)
  size_t directMinBytes = 0;        // allreduce at least this large always offers the direct path
  size_t segmentBytes = 0;          // pipeline segment of ring and tree algorithms
  size_t deviceSegmentBytes = 0;    // the same for buffers in device memory
  size_t pipelineDepth = 0;         // receives in flight per ring step
  size_t rings = 0;                 // rings a large allreduce is split across (0: the planner's)
  size_t colors = 0;                // colours of the multi-dimensional ring (0: the planner's)
  size_t waves = 0;                 // waves per multidim lane (0: the planner's)
  bool hierarchical = true;         // reduce-scatter, allgather, broadcast level by level
  bool hostSlots = true;            // multidim: the host level over shared-memory slots
  bool probeLinks = true;           // measure link costs above the host at group creation
  std::vector<int> levelOrder;      // dimensions of colour 0, innermost first when empty
  std::string topology;             // TORCH_DDL_TOPOLOGY: racks of hosts (topology.h)
  std::string links;                // TORCH_DDL_LINKS: link costs per dimension (allreduce_plan.h)
  long spinMicros = 0;              // busy-poll time before the progress thread or a waiter sleeps
  bool shareTensors = true;         // adopt large, reused allreduce tensors (shm/shared_buffers.h)
  size_t traceEntries = 0;          // operations the flight recorder keeps (trace.h)
  std::string traceFile;            // dump prefix on failure ("": on demand only)
  int debug = 0;                    // TORCH_DDL_DEBUG: 0 off, 1 WARN, 2 INFO, 3 TRACE (log.h)
  std::string debugFile;            // TORCH_DDL_DEBUG_FILE ("": stderr; %h host, %p pid)
  long heartbeatMillis = 0;         // TORCH_DDL_HEARTBEAT_MS (runtime/heartbeat.h; 0: off)
  long heartbeatTimeoutMillis = 0;  // a watched peer silent this long is gone
  size_t stagedBytes = 0;           // one host: allreduces up to this large are staged (0: never)
  size_t onceBytes = 0;             // and in one step while (ranks - 1) x bytes <= this
  bool statusServer = true;         // answer torch_ddl.status (torch_ddl/status.py)
  std::string statusAddress;        // where its port binds ("": towards the job's store)
  size_t metricsPort = 0;           // Prometheus metrics on this port + local rank (0: none)
  std::string metricsAddress;       // where the metrics port binds
  std::string allgatherAlgorithm = "auto";  // auto, ring or bruck
  std::string alltoallAlgorithm = "auto";   // auto, pairwise or bruck
  std::string gatherAlgorithm = "auto";     // auto, linear or tree
  size_t deviceStageBytes = 0;   // CUDA allreduces up to this large go through host memory
  bool sharedAllocator = false;  // torch's CPU allocator from shared memory (shm/shared_arena.h)
};

// TORCH_DDL_DIRECT_MIN_BYTES's default where TORCH_DDL_SHARED_ALLOCATOR=1.
constexpr size_t kSharedAllocatorDirectMinBytes = 65536;

// The settings that choose what an op runs (which algorithm, in what pieces), and so must be
// the same on every rank of a group: a rank that planned another path would wait for messages
// its peers never send. One "NAME=value" line each, values as parsed (so "04096" is 4096), and
// a value longer than kLongestAgreedValue (a rack map of many hosts) as its length and digest,
// so that every rank reads little from the store. Group creation compares every rank's with
// rank 0's (group/creation.cc).
constexpr size_t kLongestAgreedValue = 64;
std::string agreedSettings(const Config& c);
// Their names.
std::vector<std::string> agreedSettingNames();
// The lines of agreedSettings(c) whose value is not the table's default (most often none): with
// the table, agreedSettingsFrom gives the whole text again. A reconfigure handle carries them.
std::string agreedSettingsDeparting(const Config& c);
std::string agreedSettingsFrom(const std::string& departing);
// FNV-1a of a text: the same in every build.
uint64_t settingsDigest(const std::string& text);
// Where two texts of agreedSettings differ: each setting's name and value in `mine` and in
// `theirs` ("(not said)" where one text lacks it), in the table's order.
struct SettingDifference {
  std::string name, mine, theirs;
};
std::vector<SettingDifference> settingDifferences(const std::string& mine,
                                                  const std::string& theirs);
// The differences in words: "NAME is A <mine> and B <theirs>; ..." ("" where there are none).
std::string differenceWords(const std::vector<SettingDifference>& differences,
                            const std::string& mine, const std::string& theirs);

struct ConfigEntry {
  const char* name;
  const char* defaultValue;
  const char* description;
};

const std::vector<ConfigEntry>& configTable();
// The value in effect (the environment's, else the default).
std::string configValue(const ConfigEntry& entry);
const Config& config();
// Re-reads the environment (tests change it between cases).
void reloadConfig();

}  // namespace ddl
