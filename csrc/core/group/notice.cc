#include "notice.h"

#include <algorithm>
#include <cctype>
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
  uint16_t ranges;  // of gone ranks, each (first, count) in two entries after the header
  // Then runs of witnesses, each (witness, count) in two entries, over the gone ranks in order;
  // those past the last run: the sender.
  uint16_t witnessRuns;
};
// Entries of two bytes; of four ("ddlw") where a rank or a count does not fit two (a wide group,
// above 2^16 ranks: base/tag.h), so that a group of 2^16 ranks or fewer sends what it always did.
constexpr uint32_t kNoticeMagic = 0x6e646c64;      // "ddln"
constexpr uint32_t kWideNoticeMagic = 0x77646c64;  // "ddlw"

// Ranges of gone ranks and runs of witnesses one notice carries at most, leaving room for some
// words: more ranges (ranks gone in over 900 places; 450 in the wide form) are cut to the first
// ones, a part of the news that is still true (a notice longer than kMaxBytes would be cut by
// its receive and dropped whole); runs that do not fit leave their ranks to the sender.
constexpr size_t maxRanges(size_t entryBytes) {
  return (Notice::kMaxBytes - sizeof(NoticeHeader) - 512) / (2 * entryBytes);
}

// The witness runs of `notice`'s first `covered` gone ranks, after `used` ranges.
std::vector<uint32_t> witnessRuns(const Notice& notice, size_t covered, size_t used, size_t most) {
  std::vector<uint32_t> runs;
  const size_t n = std::min(covered, notice.witnesses.size());
  size_t last = 0;  // past the last witness that is not the sender
  for (size_t i = 0; i < n; ++i) {
    if (notice.witnesses[i] != notice.from) last = i + 1;
  }
  for (size_t i = 0; i < last && used + runs.size() / 2 < most;) {
    size_t j = i;
    while (j + 1 < last && notice.witnesses[j + 1] == notice.witnesses[i]) ++j;
    runs.push_back(static_cast<uint32_t>(notice.witnesses[i]));
    runs.push_back(static_cast<uint32_t>(j - i + 1));
    i = j + 1;
  }
  return runs;
}

// The ranges of gone ranks and the witness runs after them, at most `most` pairs of ranges.
std::vector<uint32_t> entries(const Notice& notice, size_t most, uint16_t* ranges, uint16_t* runs) {
  std::vector<uint32_t> out;
  size_t covered = 0;  // gone ranks the ranges carry
  for (size_t i = 0; i < notice.gone.size() && out.size() < 2 * most;) {
    size_t j = i;
    while (j + 1 < notice.gone.size() && notice.gone[j + 1] == notice.gone[j] + 1) ++j;
    out.push_back(static_cast<uint32_t>(notice.gone[i]));
    out.push_back(static_cast<uint32_t>(j - i + 1));
    i = j + 1;
    covered = i;
  }
  *ranges = static_cast<uint16_t>(out.size() / 2);
  const std::vector<uint32_t> witnessed = witnessRuns(notice, covered, out.size() / 2, most);
  *runs = static_cast<uint16_t>(witnessed.size() / 2);
  out.insert(out.end(), witnessed.begin(), witnessed.end());
  return out;
}

template <typename Entry>
void put(const std::vector<uint32_t>& values, char* at) {
  for (uint32_t v : values) {
    const auto e = static_cast<Entry>(v);
    std::memcpy(at, &e, sizeof(e));
    at += sizeof(e);
  }
}

template <typename Entry>
std::vector<uint32_t> take(const char* at, size_t count) {
  std::vector<uint32_t> values(count);
  for (uint32_t& v : values) {
    Entry e;
    std::memcpy(&e, at, sizeof(e));
    v = e;
    at += sizeof(e);
  }
  return values;
}

// Whether `notice` needs the entries of four bytes.
bool wideForm(const Notice& notice) {
  auto past = [](int r) { return r > 0xffff; };
  return std::any_of(notice.gone.begin(), notice.gone.end(), past) ||
         std::any_of(notice.witnesses.begin(), notice.witnesses.end(), past) ||
         notice.gone.size() > 0xffff;
}

}  // namespace

std::string Notice::encode() const {
  const bool wide = wideForm(*this);
  const size_t entryBytes = wide ? sizeof(uint32_t) : sizeof(uint16_t);
  NoticeHeader header{wide ? kWideNoticeMagic : kNoticeMagic,
                      sequence,
                      incarnation,
                      from,
                      static_cast<uint8_t>(type),
                      static_cast<uint8_t>(tree ? 1 : 0),
                      static_cast<uint8_t>(kind),
                      0,
                      0};
  const std::vector<uint32_t> values =
      entries(*this, maxRanges(entryBytes), &header.ranges, &header.witnessRuns);
  std::string bytes(sizeof(header) + values.size() * entryBytes, '\0');
  std::memcpy(bytes.data(), &header, sizeof(header));
  if (wide) {
    put<uint32_t>(values, bytes.data() + sizeof(header));
  } else {
    put<uint16_t>(values, bytes.data() + sizeof(header));
  }
  if (bytes.size() < kMaxBytes) bytes += text.substr(0, kMaxBytes - bytes.size());
  return bytes;
}

std::vector<std::string> Notice::encodePieces() const {
  const size_t most = maxRanges(wideForm(*this) ? sizeof(uint32_t) : sizeof(uint16_t));
  std::vector<std::string> pieces;
  size_t begin = 0;
  do {
    // The longest stretch from `begin` whose ranges fit one notice (its witness runs fill what
    // room is left, as encode() does).
    size_t end = begin, ranges = 0;
    for (; end < gone.size(); ++end) {
      const bool range = end == begin || gone[end] != gone[end - 1] + 1;
      if (ranges + range > most) break;
      ranges += range;
    }
    if (begin == 0 && end == gone.size()) return {encode()};
    Notice piece = *this;
    piece.gone.assign(gone.begin() + begin, gone.begin() + end);
    piece.witnesses.clear();
    for (size_t i = begin; i < end && i < witnesses.size(); ++i) {
      piece.witnesses.push_back(witnesses[i]);
    }
    pieces.push_back(piece.encode());
    begin = end;
  } while (begin < gone.size());
  return pieces;
}

Notice Notice::without(const std::vector<int>& known) const {
  Notice rest = *this;
  rest.gone.clear();
  rest.witnesses.clear();
  for (size_t i = 0; i < gone.size(); ++i) {
    if (std::binary_search(known.begin(), known.end(), gone[i])) continue;
    rest.gone.push_back(gone[i]);
    rest.witnesses.push_back(i < witnesses.size() ? witnesses[i] : from);
  }
  return rest;
}

std::string newsWords(int r, int witness, int from, const std::string& text) {
  const std::string subject = "rank " + std::to_string(r) + " is gone";
  const bool about = text.compare(0, subject.size(), subject) == 0 &&
                     (text.size() == subject.size() ||
                      !std::isdigit(static_cast<unsigned char>(text[subject.size()])));
  if (witness == from && about) return "rank " + std::to_string(from) + " reports: " + text;
  std::string words = "rank " + std::to_string(witness) + " counts it gone";
  if (witness != from) {
    words += " (news from rank " + std::to_string(from) + (about ? ": " + text : "") + ")";
  }
  return words;
}

std::optional<Notice> Notice::decode(const char* data, size_t bytes) {
  NoticeHeader header;
  if (bytes < sizeof(header)) return std::nullopt;
  std::memcpy(&header, data, sizeof(header));
  const bool wide = header.magic == kWideNoticeMagic;
  const size_t entryBytes = wide ? sizeof(uint32_t) : sizeof(uint16_t);
  const size_t count = (size_t{header.ranges} + size_t{header.witnessRuns}) * 2;
  const size_t rangeBytes = count * entryBytes;
  if ((header.magic != kNoticeMagic && !wide) ||
      header.type > static_cast<uint8_t>(Type::kWaiting) || bytes < sizeof(header) + rangeBytes) {
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
  const std::vector<uint32_t> values = wide ? take<uint32_t>(data + sizeof(header), count)
                                            : take<uint16_t>(data + sizeof(header), count);
  const size_t rangeEntries = size_t{header.ranges} * 2;
  // Ranges as encode() makes them: ascending, apart, each of ranks of the largest group the form
  // is for (two bytes: 2^16 ranks).
  const int64_t ranks = wide ? int64_t{tag::kMaxRanks} : int64_t{1} << 16;
  int64_t next = 0;  // the lowest rank the next range may start at
  for (size_t i = 0; i + 1 < rangeEntries; i += 2) {
    const int64_t first = values[i], n = values[i + 1];
    if (n == 0 || first < next || first + n > ranks) return std::nullopt;
    for (int64_t k = 0; k < n; ++k) notice.gone.push_back(static_cast<int>(first + k));
    next = first + n + 1;
  }
  // Witness runs: ranks of the group, covering no more than the gone ranks.
  for (size_t i = rangeEntries; i + 1 < values.size(); i += 2) {
    const size_t witness = values[i], n = values[i + 1];
    if (n == 0 || static_cast<int64_t>(witness) >= ranks ||
        notice.witnesses.size() + n > notice.gone.size()) {
      return std::nullopt;
    }
    notice.witnesses.insert(notice.witnesses.end(), n, static_cast<int>(witness));
  }
  notice.text.assign(data + sizeof(header) + rangeBytes, bytes - sizeof(header) - rangeBytes);
  return notice;
}

}  // namespace ddl
