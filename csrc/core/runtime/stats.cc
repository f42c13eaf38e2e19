#include "stats.h"

#include <cstdio>
#include <sstream>

namespace ddl {

const char* OpStats::className(int sizeClass) {
  static const char* const kNames[] = {"le1KiB", "le64KiB", "le1MiB", "le16MiB", "gt16MiB"};
  return kNames[sizeClass];
}

int OpStats::classOf(uint64_t bytes) {
  int c = 0;
  while (c < static_cast<int>(kClassBytes.size()) && bytes > kClassBytes[c]) ++c;
  return c;
}

void OpStats::ended(uint32_t groupId, const std::string& groupName, int rank, int size,
                    const std::string& name, uint32_t sequence, uint64_t bytes, double seconds,
                    StatusKind kind, TimePoint now, const std::string& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The last group and collective looked up, kept (entries are never erased): a loop of one
  // call finds them without a search.
  if (lastGroup_ == nullptr || lastGroupId_ != groupId) {
    lastGroup_ = &groups_[groupId];
    lastGroupId_ = groupId;
  }
  Group& g = *lastGroup_;
  if (g.name != groupName) g = Group{groupName, rank, size};  // a new group under a used id
  const int sizeClass = classOf(bytes);
  if (lastCounts_ == nullptr || lastClass_ != sizeClass || lastName_ != name) {
    lastCounts_ = &counts_[{name, sizeClass}];
    lastClass_ = sizeClass;
    lastName_ = name;
  }
  Counts& c = *lastCounts_;
  ++c.ops;
  c.bytes += bytes;
  c.seconds += seconds;
  size_t b = 0;
  while (b < kBounds.size() && seconds > kBounds[b]) ++b;
  ++c.buckets[b];
  if (kind != StatusKind::kOk) {
    ++c.failed;
    ++g.failed;
    ++failures_[static_cast<int>(kind)];
    g.lastError = error.substr(0, kErrorChars);
    g.lastFailedSequence = sequence;
    return;
  }
  ++g.completed;
  g.lastSequence = sequence;
  g.lastName = name;
  g.lastEnded = now;
}

std::map<uint32_t, OpStats::Group> OpStats::groups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_;
}

std::map<std::pair<std::string, int>, OpStats::Counts> OpStats::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

std::array<uint64_t, kStatusKinds> OpStats::failures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failures_;
}

std::string OpStats::json(TimePoint now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  out << "{\"ops\": [";
  bool first = true;
  for (const auto& [key, c] : counts_) {
    out << (first ? "" : ", ") << "{\"collective\": " << jsonString(key.first)
        << ", \"size_class\": \"" << className(key.second) << "\", \"ops\": " << c.ops
        << ", \"bytes\": " << c.bytes << ", \"failed\": " << c.failed
        << ", \"seconds\": " << c.seconds << ", \"buckets\": [";
    for (size_t b = 0; b < c.buckets.size(); ++b) out << (b ? ", " : "") << c.buckets[b];
    out << "]}";
    first = false;
  }
  out << "], \"quick_ops\": " << quickOps() << ", \"handed_ops\": " << handedOps()
      << ", \"bucket_bounds\": [";
  for (size_t b = 0; b < kBounds.size(); ++b) out << (b ? ", " : "") << kBounds[b];
  out << "], \"failures\": {";
  first = true;
  for (int k = 1; k < kStatusKinds; ++k) {
    out << (first ? "" : ", ") << jsonString(statusKindName(static_cast<StatusKind>(k))) << ": "
        << failures_[k];
    first = false;
  }
  out << "}, \"groups\": [";
  first = true;
  for (const auto& [id, g] : groups_) {
    out << (first ? "" : ", ") << "{\"id\": " << id << ", \"name\": " << jsonString(g.name)
        << ", \"rank\": " << g.rank << ", \"size\": " << g.size
        << ", \"completed\": " << g.completed << ", \"failed\": " << g.failed
        << ", \"last_completed\": " << g.lastSequence << ", \"last_op\": " << jsonString(g.lastName)
        << ", \"last_ended_s\": ";
    if (g.lastSequence >= 0) {
      out << secondsBetween(g.lastEnded, now);
    } else {
      out << "null";
    }
    out << ", \"last_failed\": " << g.lastFailedSequence
        << ", \"last_error\": " << jsonString(g.lastError) << "}";
    first = false;
  }
  out << "]}";
  return out.str();
}

double secondsBetween(TimePoint from, TimePoint to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace ddl
