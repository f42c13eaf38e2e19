// Flight recorder: the last TORCH_DDL_TRACE_ENTRIES operations of every group of a runtime (the
// process's, or a simulated rank's)
// (collective, sequence number, count, dtype, reduce op, root, state, when it was created,
// started and ended, and, for one that failed, its error and the peers it still waited for).
// Recording costs a lock and a few stores per op, in entries kept in a ring (nothing allocated once
// it is full), at times the runtime read from its clock anyway (no read of its own). The trace is
// written when an op fails (to TORCH_DDL_TRACE_FILE + rank, at most every 100 ms) and on demand, as
// a pickle laid out like torch's own flight recorder dumps (version, pg_config, entries with
// process_group, collective_seq_id, profiling_name "ddl:all_reduce", input_sizes, state, time_*_ns,
// ...), so that `python -m torch_ddl.info --trace` can line up the ranks' dumps and name the first
// operation where they diverge.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../base/clock.h"
#include "call_print.h"

namespace ddl {

struct TraceEntry {
  enum class State { kScheduled, kStarted, kCompleted, kFailed };
  uint64_t record = 0;  // process-wide, in the order ops were created
  uint32_t groupId = 0;
  uint32_t sequence = 0;  // collective sequence number (point to point: the user tag)
  bool pointToPoint = false;
  int peer = -1;  // point to point: the other rank
  const char* name = "";
  CallPrint print;
  int64_t timeoutMs = 0;
  State state = State::kScheduled;
  int64_t createdNs = 0, startedNs = 0, endedNs = 0;
  std::string error;    // failed: what ended it
  std::string awaited;  // failed: the peers it still waited for
};

class FlightRecorder {
 public:
  // Keeps the last `capacity` ops (0: records nothing); dumps go to `file` + rank on failure.
  FlightRecorder(size_t capacity, std::string file) : capacity_(capacity), file_(std::move(file)) {}

  // A group as the dump describes it (rank within it, size, the global ranks where known).
  void describeGroup(uint32_t groupId, const std::string& name, int rank, int size);
  // Sets the rank the dump file is named by (the first one wins; env RANK takes precedence).
  void noteRank(int rank);

  // The wall clock's time at the runtime clock's zero: what turns the times below into the wall
  // clock's (as torch's dumps give them). Set as the recorder is made and, in a real process, at
  // every housekeeping, which follows the wall clock's adjustments.
  void setWallOffset(std::chrono::nanoseconds offset) { wallOffset_.store(offset.count()); }

  // Returns the record id (0: not recorded, the recorder is off). `at`: the runtime's clock.
  uint64_t created(uint32_t groupId, uint32_t sequence, const char* name, const CallPrint& print,
                   bool pointToPoint, int peer, std::chrono::milliseconds timeout, TimePoint at);
  void started(uint64_t record, TimePoint at);
  void ended(uint64_t record, TimePoint at, const std::string& error, const std::string& awaited);
  // An op that ran and completed outside the runtime (group/quick.cc), in one entry.
  void completed(uint32_t groupId, uint32_t sequence, const char* name, const CallPrint& print,
                 std::chrono::milliseconds timeout, TimePoint began, TimePoint ended);

  std::vector<TraceEntry> entries() const;
  // The dump, as pickle bytes.
  std::string dump() const;
  // Writes the dump to `path` (default: TORCH_DDL_TRACE_FILE + rank); returns the path written,
  // or "" when there is nowhere to write it.
  std::string write(const std::string& path = "") const;
  // On failure: writes the default dump unless one was written less than a second ago.
  void writeOnFailure();

 private:
  TraceEntry* find(uint64_t record);
  int64_t wallNs(TimePoint at) const;
  // The entries kept, oldest first, each as `fn` sees it (under the lock).
  template <typename Fn>
  void forEach(Fn fn) const;
  std::string defaultPath() const;

  const size_t capacity_;
  const std::string file_;
  std::atomic<int64_t> wallOffset_{0};
  mutable std::mutex mutex_;
  // Record r at ring_[(r - 1) % capacity_]: the last capacity_ records, ring_ growing to that.
  std::vector<TraceEntry> ring_;
  uint64_t next_ = 1;
  struct GroupInfo {
    std::string name;
    int rank;
    int size;
  };
  std::map<uint32_t, GroupInfo> groups_;
  int rank_ = -1;
  std::chrono::steady_clock::time_point lastFailureDump_{};
};

}  // namespace ddl
