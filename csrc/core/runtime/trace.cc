#include "trace.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ddl {
namespace {

// A pickle (protocol 2) of dicts, lists, tuples, strings, integers, booleans and None: all a
// dump holds, written without Python.
class Pickle {
 public:
  Pickle() { out_ += "\x80\x02"; }
  std::string finish() { return out_ + "."; }
  void none() { out_ += 'N'; }
  void boolean(bool v) { out_ += v ? '\x88' : '\x89'; }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      append(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      out_ += '\x8a';
      out_ += '\x08';
      append(static_cast<uint64_t>(v), 8);
    }
  }
  void integerOrNone(bool known, int64_t v) {
    if (known) {
      integer(v);
    } else {
      none();
    }
  }
  void string(const std::string& s) {
    out_ += 'X';
    append(s.size(), 4);
    out_ += s;
  }
  void beginDict() { out_ += "}("; }
  void endDict() { out_ += 'u'; }
  void beginList() { out_ += "]("; }
  void endList() { out_ += 'e'; }
  void tuple2() { out_ += '\x86'; }
  void key(const char* k) { string(k); }

 private:
  void append(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

// torch's dtype names, as its flight recorder writes them.
const char* torchDtype(uint8_t type) {
  if (type == CallPrint::kUnset) return "";
  switch (static_cast<DataType>(type)) {
    case DataType::kFloat32:
      return "Float";
    case DataType::kFloat64:
      return "Double";
    case DataType::kFloat16:
      return "Half";
    case DataType::kBFloat16:
      return "BFloat16";
    case DataType::kInt8:
      return "Char";
    case DataType::kUInt8:
      return "Byte";
    case DataType::kInt16:
      return "Short";
    case DataType::kInt32:
      return "Int";
    case DataType::kInt64:
      return "Long";
    case DataType::kBool:
      return "Bool";
  }
  return "";
}

std::string torchName(const TraceEntry& e, int rank) {
  const std::string name = e.name;
  if (name == "monitored_barrier") return "barrier";
  if (name == "send") return "send " + std::to_string(rank) + "->" + std::to_string(e.peer);
  if (name == "recv") return "recv " + std::to_string(rank) + "<-" + std::to_string(e.peer);
  return name;
}

const char* stateName(TraceEntry::State s) {
  switch (s) {
    case TraceEntry::State::kScheduled:
      return "scheduled";
    case TraceEntry::State::kStarted:
      return "started";
    case TraceEntry::State::kCompleted:
    case TraceEntry::State::kFailed:
      return "completed";
  }
  return "";
}

// One entry, as torch's flight recorder writes one (its rank and size in its group, the group's
// name, and its number among the point-to-point entries, 0 for a collective).
void writeEntry(Pickle& p, const TraceEntry& e, int rank, int size, const std::string& groupName,
                int64_t p2pSeq) {
  p.beginDict();
  p.key("record_id");
  p.integer(static_cast<int64_t>(e.record));
  p.key("pg_id");
  p.integer(e.groupId);
  p.key("process_group");
  p.string(std::to_string(e.groupId));
  p.string(groupName);
  p.tuple2();
  p.key("collective_seq_id");
  p.integer(e.pointToPoint ? 0 : e.sequence);
  p.key("p2p_seq_id");
  p.integer(p2pSeq);
  p.key("op_id");
  p.integer(static_cast<int64_t>(e.record));
  p.key("profiling_name");
  p.string("ddl:" + torchName(e, rank));
  p.key("time_created_ns");
  p.integer(e.createdNs);
  // Elements per rank's input, and of the output (all ranks' blocks where they gather).
  const int64_t count = static_cast<int64_t>(e.print.count);
  const bool gathers = e.print.collective == Collective::kAllgather;
  const bool scatters = e.print.collective == Collective::kReduceScatter;
  p.key("input_sizes");
  p.beginList();
  p.beginList();
  p.integer(scatters ? count * size : count);
  p.endList();
  p.endList();
  p.key("output_sizes");
  p.beginList();
  p.beginList();
  p.integer(gathers ? count * size : count);
  p.endList();
  p.endList();
  const std::string dtype = torchDtype(e.print.type);
  p.key("input_dtypes");
  p.beginList();
  if (!dtype.empty()) p.string(dtype);
  p.endList();
  p.key("output_dtypes");
  p.beginList();
  if (!dtype.empty()) p.string(dtype);
  p.endList();
  p.key("state");
  p.string(stateName(e.state));
  p.key("time_discovered_started_ns");
  p.integerOrNone(e.startedNs != 0, e.startedNs);
  p.key("time_discovered_completed_ns");
  p.integerOrNone(e.endedNs != 0, e.endedNs);
  p.key("duration_ms");
  p.integerOrNone(e.endedNs && e.startedNs, (e.endedNs - e.startedNs) / 1000000);
  p.key("retired");
  p.boolean(e.state == TraceEntry::State::kCompleted || e.state == TraceEntry::State::kFailed);
  p.key("timeout_ms");
  p.integer(e.timeoutMs);
  p.key("is_p2p");
  p.boolean(e.pointToPoint);
  p.key("frames");
  p.beginList();
  p.endList();
  p.key("ddl_call");
  p.string(e.pointToPoint ? std::string(e.name) + " with rank " + std::to_string(e.peer)
                          : e.print.describe());
  p.key("ddl_failed");
  p.boolean(e.state == TraceEntry::State::kFailed);
  p.key("ddl_error");
  p.string(e.error);
  p.key("ddl_awaited");
  p.string(e.awaited);
  p.endDict();
}

}  // namespace

void FlightRecorder::describeGroup(uint32_t groupId, const std::string& name, int rank, int size) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_[groupId] = GroupInfo{name, rank, size};
}

void FlightRecorder::noteRank(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank_ < 0) rank_ = rank;
}

int64_t FlightRecorder::wallNs(TimePoint at) const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count() +
         wallOffset_.load(std::memory_order_relaxed);
}

uint64_t FlightRecorder::created(uint32_t groupId, uint32_t sequence, const char* name,
                                 const CallPrint& print, bool pointToPoint, int peer,
                                 std::chrono::milliseconds timeout, TimePoint at) {
  const size_t capacity = capacity_;
  if (capacity == 0) return 0;
  const int64_t createdNs = wallNs(at);
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t record = next_++;
  if (ring_.size() < capacity) ring_.emplace_back();
  TraceEntry& e = ring_[(record - 1) % capacity];
  e.record = record;
  e.groupId = groupId;
  e.sequence = sequence;
  e.name = name;
  e.print = print;
  e.pointToPoint = pointToPoint;
  e.peer = peer;
  e.timeoutMs = timeout.count();
  e.state = TraceEntry::State::kScheduled;
  e.createdNs = createdNs;
  e.startedNs = e.endedNs = 0;
  e.error.clear();  // keeps what the strings hold: nothing is allocated again
  e.awaited.clear();
  return record;
}

TraceEntry* FlightRecorder::find(uint64_t record) {
  if (record == 0 || record >= next_ || next_ - record > ring_.size()) return nullptr;
  return &ring_[(record - 1) % capacity_];
}

template <typename Fn>
void FlightRecorder::forEach(Fn fn) const {
  const uint64_t first = next_ - ring_.size();
  for (uint64_t r = first; r < next_; ++r) fn(ring_[(r - 1) % capacity_]);
}

void FlightRecorder::started(uint64_t record, TimePoint at) {
  if (record == 0) return;
  const int64_t now = wallNs(at);
  std::lock_guard<std::mutex> lock(mutex_);
  if (TraceEntry* e = find(record)) {
    e->state = TraceEntry::State::kStarted;
    e->startedNs = now;
  }
}

void FlightRecorder::ended(uint64_t record, TimePoint at, const std::string& error,
                           const std::string& awaited) {
  if (record == 0) return;
  const int64_t now = wallNs(at);
  std::lock_guard<std::mutex> lock(mutex_);
  if (TraceEntry* e = find(record)) {
    e->state = error.empty() ? TraceEntry::State::kCompleted : TraceEntry::State::kFailed;
    if (e->startedNs == 0) e->startedNs = now;
    e->endedNs = now;
    e->error = error;
    e->awaited = awaited;
  }
}

void FlightRecorder::completed(uint32_t groupId, uint32_t sequence, const char* name,
                               const CallPrint& print, std::chrono::milliseconds timeout,
                               TimePoint began, TimePoint ended) {
  const uint64_t record = created(groupId, sequence, name, print, false, -1, timeout, began);
  if (record == 0) return;
  const int64_t startedNs = wallNs(began), endedNs = wallNs(ended);
  std::lock_guard<std::mutex> lock(mutex_);
  if (TraceEntry* e = find(record)) {
    e->state = TraceEntry::State::kCompleted;
    e->startedNs = startedNs;
    e->endedNs = endedNs;
  }
}

std::vector<TraceEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TraceEntry> kept;
  kept.reserve(ring_.size());
  forEach([&kept](const TraceEntry& e) { kept.push_back(e); });
  return kept;
}

std::string FlightRecorder::dump() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Pickle p;
  p.beginDict();
  p.key("version");
  p.string("2.10");
  p.key("backend");
  p.string("ddl");
  p.key("rank");
  p.integer(rank_);
  p.key("pg_config");
  p.beginDict();
  for (const auto& [id, g] : groups_) {
    p.string(std::to_string(id));
    p.beginDict();
    p.key("name");
    p.string(std::to_string(id));
    p.key("desc");
    p.string(g.name);
    p.key("ranks");
    std::string ranks = "[";
    for (int r = 0; r < g.size; ++r) ranks += (r ? ", " : "") + std::to_string(r);
    p.string(ranks + "]");
    p.endDict();
  }
  p.endDict();
  p.key("entries");
  p.beginList();
  uint64_t p2p = 0;
  forEach([&](const TraceEntry& e) {
    auto group = groups_.find(e.groupId);
    const int rank = group == groups_.end() ? -1 : group->second.rank;
    const int size = group == groups_.end() ? 1 : group->second.size;
    writeEntry(p, e, rank, size, group == groups_.end() ? "" : group->second.name,
               e.pointToPoint ? static_cast<int64_t>(++p2p) : 0);
  });
  p.endList();
  p.endDict();
  return p.finish();
}

std::string FlightRecorder::defaultPath() const {
  const std::string& prefix = file_;
  if (prefix.empty()) return "";
  int rank;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rank = rank_;
  }
  if (const char* env = std::getenv("RANK")) rank = std::atoi(env);
  return prefix + std::to_string(rank >= 0 ? rank : static_cast<int>(getpid()));
}

std::string FlightRecorder::write(const std::string& path) const {
  const std::string target = path.empty() ? defaultPath() : path;
  if (target.empty()) return "";
  const std::string bytes = dump();
  const std::string temporary = target + ".tmp" + std::to_string(getpid());
  FILE* f = std::fopen(temporary.c_str(), "wb");
  if (f == nullptr) return "";
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok || std::rename(temporary.c_str(), target.c_str()) != 0) {
    std::remove(temporary.c_str());
    return "";
  }
  return target;
}

void FlightRecorder::writeOnFailure() {
  if (capacity_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (lastFailureDump_ != std::chrono::steady_clock::time_point{} &&
        now - lastFailureDump_ < std::chrono::milliseconds(100)) {
      return;
    }
    lastFailureDump_ = now;
  }
  write();
}

}  // namespace ddl
