#include "notice.h"

#include <algorithm>
#include <cstring>

#include "../base/tag.h"

namespace ddl {

namespace {

struct NoticeHeader {
  uint32_t magic;
  uint32_t sequence;
  uint64_t incarnation;
  int32_t from;
  uint8_t type;
  uint8_t tree;
  uint8_t kind;     // StatusKind
  uint16_t ranges;  // of gone ranks, each (first, count) in two uint16 after the header
  // Then runs of witnesses, each (witness, count) in two uint16, over the gone ranks in order;
  // those past the last run: the sender.
  uint16_t witnessRuns;
};
constexpr uint32_t kNoticeMagic = 0x6e646c64;  // "ddln"

// Ranges of gone ranks and runs of witnesses one notice carries at most, leaving room for some
// words: more ranges (ranks gone in over 900 places) are cut to the first ones, a part of the
// news that is still true (a notice longer than kMaxBytes would be cut by its receive and
// dropped whole); runs that do not fit leave their ranks to the sender.
constexpr size_t kMaxRanges = (Notice::kMaxBytes - sizeof(NoticeHeader) - 512) / 4;

// The witness runs of `notice`'s first `covered` gone ranks, after `used` ranges.
std::vector<uint16_t> witnessRuns(const Notice& notice, size_t covered, size_t used) {
  std::vector<uint16_t> runs;
  const size_t n = std::min(covered, notice.witnesses.size());
  size_t last = 0;  // past the last witness that is not the sender
  for (size_t i = 0; i < n; ++i) {
    if (notice.witnesses[i] != notice.from) last = i + 1;
  }
  for (size_t i = 0; i < last && used + runs.size() / 2 < kMaxRanges;) {
    size_t j = i;
    while (j + 1 < last && notice.witnesses[j + 1] == notice.witnesses[i]) ++j;
    runs.push_back(static_cast<uint16_t>(notice.witnesses[i]));
    runs.push_back(static_cast<uint16_t>(j - i + 1));
    i = j + 1;
  }
  return runs;
}

}  // namespace

std::string Notice::encode() const {
  std::vector<uint16_t> ranges;
  size_t covered = 0;  // gone ranks the ranges carry
  for (size_t i = 0; i < gone.size() && ranges.size() < 2 * kMaxRanges;) {
    size_t j = i;
    while (j + 1 < gone.size() && gone[j + 1] == gone[j] + 1) ++j;
    ranges.push_back(static_cast<uint16_t>(gone[i]));
    ranges.push_back(static_cast<uint16_t>(j - i + 1));
    i = j + 1;
    covered = i;
  }
  const std::vector<uint16_t> runs = witnessRuns(*this, covered, ranges.size() / 2);
  ranges.insert(ranges.end(), runs.begin(), runs.end());
  NoticeHeader header{kNoticeMagic,
                      sequence,
                      incarnation,
                      from,
                      static_cast<uint8_t>(type),
                      static_cast<uint8_t>(tree ? 1 : 0),
                      static_cast<uint8_t>(kind),
                      static_cast<uint16_t>((ranges.size() - runs.size()) / 2),
                      static_cast<uint16_t>(runs.size() / 2)};
  std::string bytes(sizeof(header) + ranges.size() * sizeof(uint16_t), '\0');
  std::memcpy(bytes.data(), &header, sizeof(header));
  if (!ranges.empty()) {
    std::memcpy(bytes.data() + sizeof(header), ranges.data(), ranges.size() * sizeof(uint16_t));
  }
  if (bytes.size() < kMaxBytes) bytes += text.substr(0, kMaxBytes - bytes.size());
  return bytes;
}

std::optional<Notice> Notice::decode(const char* data, size_t bytes) {
  NoticeHeader header;
  if (bytes < sizeof(header)) return std::nullopt;
  std::memcpy(&header, data, sizeof(header));
  const size_t rangeBytes =
      (size_t{header.ranges} + size_t{header.witnessRuns}) * 2 * sizeof(uint16_t);
  if (header.magic != kNoticeMagic || header.type > static_cast<uint8_t>(Type::kWaiting) ||
      bytes < sizeof(header) + rangeBytes) {
    return std::nullopt;
  }
  Notice notice;
  notice.sequence = header.sequence;
  notice.incarnation = header.incarnation;
  notice.type = static_cast<Type>(header.type);
  notice.from = header.from;
  notice.tree = header.tree != 0;
  notice.kind =
      header.kind < kStatusKinds ? static_cast<StatusKind>(header.kind) : StatusKind::kOther;
  std::vector<uint16_t> ranges(size_t{header.ranges} * 2);
  std::vector<uint16_t> runs(size_t{header.witnessRuns} * 2);
  if (!ranges.empty()) {
    std::memcpy(ranges.data(), data + sizeof(header), ranges.size() * sizeof(uint16_t));
  }
  if (!runs.empty()) {
    std::memcpy(runs.data(), data + sizeof(header) + ranges.size() * sizeof(uint16_t),
                runs.size() * sizeof(uint16_t));
  }
  // Ranges as encode() makes them: ascending, apart, each of ranks of the largest group.
  int64_t next = 0;  // the lowest rank the next range may start at
  for (size_t i = 0; i + 1 < ranges.size(); i += 2) {
    const int64_t first = ranges[i], count = ranges[i + 1];
    if (count == 0 || first < next || first + count > int64_t{tag::kMaxRanks}) return std::nullopt;
    for (int64_t k = 0; k < count; ++k) notice.gone.push_back(static_cast<int>(first + k));
    next = first + count + 1;
  }
  // Witness runs: ranks of the group, covering no more than the gone ranks.
  for (size_t i = 0; i + 1 < runs.size(); i += 2) {
    const size_t witness = runs[i], count = runs[i + 1];
    if (count == 0 || witness >= tag::kMaxRanks ||
        notice.witnesses.size() + count > notice.gone.size()) {
      return std::nullopt;
    }
    notice.witnesses.insert(notice.witnesses.end(), count, static_cast<int>(witness));
  }
  notice.text.assign(data + sizeof(header) + rangeBytes, bytes - sizeof(header) - rangeBytes);
  return notice;
}

}  // namespace ddl
