// The wire forms of creation's messages (group/bootstrap.h): cards, addresses, spans and the
// machine, each decoder bounding what it reads; the span's sums and rank 0's machine from them.
#include <algorithm>
#include <functional>

#include "../base/tag.h"
#include "../base/types.h"
#include "../base/wire.h"
#include "bootstrap.h"  // (the declarations: this file implements its wire forms)

namespace ddl {
namespace {

constexpr uint64_t kMaxRuns = 1 << 20;
constexpr uint64_t kMaxLevels = 8;
constexpr size_t kMaxErrorBytes = 4096;
constexpr size_t kMaxNameBytes = 256;

void writeRuns(Writer& w, const Span::Runs& runs) {
  w.number(runs.continues ? 1 : 0);
  w.number(runs.runs.size());
  for (auto [size, blocks] : runs.runs) {
    w.number(static_cast<uint64_t>(size));
    w.number(static_cast<uint64_t>(blocks));
  }
}

// Runs of blocks that add up to `count` ranks.
bool readRuns(Reader& r, int count, Span::Runs* runs) {
  runs->continues = r.number() != 0;
  const uint64_t n = r.number();
  if (n > kMaxRuns || n > static_cast<uint64_t>(count)) return false;
  uint64_t ranks = 0;
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    const uint64_t size = r.number(), blocks = r.number();
    if (size < 1 || blocks < 1 || size > static_cast<uint64_t>(count) ||
        blocks > static_cast<uint64_t>(count)) {
      return false;
    }
    ranks += size * blocks;
    if (ranks > static_cast<uint64_t>(count)) return false;
    runs->runs.emplace_back(static_cast<int>(size), static_cast<int>(blocks));
  }
  return r.ok() && ranks == static_cast<uint64_t>(count);
}

// Adds a run of `blocks` blocks of `size` ranks after `runs`.
void pushRun(std::vector<std::pair<int, int>>& runs, int size, int blocks) {
  if (!runs.empty() && runs.back().first == size) {
    runs.back().second += blocks;
  } else {
    runs.emplace_back(size, blocks);
  }
}

// `next` after `runs`: where next's first block holds ranks before it, it is the same block as
// runs' last.
void appendRuns(Span::Runs& runs, const Span::Runs& next) {
  size_t from = 0;
  int carried = 0;  // ranks of runs' last block, taken off it to be joined with next's first
  if (next.continues && !runs.runs.empty() && !next.runs.empty()) {
    carried = runs.runs.back().first;
    if (--runs.runs.back().second == 0) runs.runs.pop_back();
    auto [size, blocks] = next.runs[0];
    pushRun(runs.runs, carried + size, 1);
    if (blocks > 1) pushRun(runs.runs, size, blocks - 1);
    from = 1;
  }
  for (size_t i = from; i < next.runs.size(); ++i) {
    pushRun(runs.runs, next.runs[i].first, next.runs[i].second);
  }
}

std::vector<Level::Run> levelRuns(const std::vector<std::pair<int, int>>& runs) {
  std::vector<Level::Run> out;
  int first = 0;
  for (auto [size, blocks] : runs) {
    out.push_back(Level::Run{first, size, blocks});
    first += size * blocks;
  }
  return out;
}

}  // namespace

std::string encodeCards(const std::vector<RankCard>& cards) {
  Writer w;
  w.number(cards.size());
  for (const RankCard& c : cards) {
    w.number(static_cast<uint64_t>(c.rank));
    w.text(c.address);
    w.text(c.identity);
    w.text(c.locality);
    w.number(c.idTaken ? 1 : 0);
  }
  return w.take();
}

bool decodeCards(const std::string& bytes, std::vector<RankCard>* cards) {
  Reader r(bytes);
  const uint64_t n = r.number();
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    RankCard c;
    const uint64_t rank = r.number();
    if (rank > tag::kMaxRanks) return false;
    c.rank = static_cast<int>(rank);
    c.address = r.text();
    c.identity = r.text();
    c.locality = r.text();
    c.idTaken = r.number() != 0;
    cards->push_back(std::move(c));
  }
  return r.ok(true);
}

std::string encodeEntries(const std::vector<std::pair<int, std::string>>& entries) {
  Writer w;
  w.number(entries.size());
  for (const auto& [rank, text] : entries) {
    w.number(static_cast<uint64_t>(rank));
    w.text(text);
  }
  return w.take();
}

bool decodeEntries(const std::string& bytes, int size,
                   std::vector<std::pair<int, std::string>>* entries) {
  Reader r(bytes);
  const uint64_t n = r.number();
  if (n > static_cast<uint64_t>(size)) return false;
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    const uint64_t rank = r.number();
    std::string text = r.text();
    if (rank >= static_cast<uint64_t>(size) || text.size() > kMaxCardBytes) return false;
    entries->emplace_back(static_cast<int>(rank), std::move(text));
  }
  return r.ok(true);
}

Span Span::of(int rank, bool sameHost, bool sameRack, bool racked, bool idTaken, std::string error,
              Host host) {
  Span s;
  if (!sameHost) s.hostList.push_back(std::move(host));
  s.first = rank;
  s.count = 1;
  s.hosts.continues = sameHost;
  s.hosts.runs = {{1, 1}};
  s.racked = racked;
  if (racked) {
    s.racks.continues = sameRack;
    s.racks.runs = {{1, 1}};
  }
  if (idTaken) {
    s.idTaken = {rank};
    s.idTakenCount = 1;
  }
  s.error = std::move(error);
  return s;
}

void Span::append(const Span& next) {
  count += next.count;
  appendRuns(hosts, next.hosts);
  if (racked) appendRuns(racks, next.racks);
  for (int r : next.idTaken) {
    if (static_cast<int>(idTaken.size()) < kMaxNamed) idTaken.push_back(r);
  }
  idTakenCount += next.idTakenCount;
  if (error.empty()) error = next.error;
  listsHosts =
      listsHosts && next.listsHosts && hostList.size() + next.hostList.size() <= kMaxListed;
  if (listsHosts) {
    hostList.insert(hostList.end(), next.hostList.begin(), next.hostList.end());
  } else {
    hostList.clear();
  }
}

std::string encodeSpan(const Span& s) {
  Writer w;
  w.number(static_cast<uint64_t>(s.first));
  w.number(static_cast<uint64_t>(s.count));
  writeRuns(w, s.hosts);
  w.number(s.racked ? 1 : 0);
  if (s.racked) writeRuns(w, s.racks);
  w.number(static_cast<uint64_t>(s.idTakenCount));
  w.number(s.idTaken.size());
  for (int r : s.idTaken) w.number(static_cast<uint64_t>(r));
  w.text(s.error);
  w.number(s.listsHosts ? 1 : 0);
  w.number(s.hostList.size());
  for (const Span::Host& h : s.hostList) {
    w.text(h.name);
    w.number(h.key);
  }
  return w.take();
}

bool decodeSpan(const std::string& bytes, int size, Span* s) {
  Reader r(bytes);
  const uint64_t first = r.number(), count = r.number();
  if (!r.ok() || count < 1 || first >= static_cast<uint64_t>(size) ||
      count > static_cast<uint64_t>(size) - first) {
    return false;
  }
  s->first = static_cast<int>(first);
  s->count = static_cast<int>(count);
  if (!readRuns(r, s->count, &s->hosts)) return false;
  s->racked = r.number() != 0;
  if (s->racked && !readRuns(r, s->count, &s->racks)) return false;
  const uint64_t taken = r.number(), named = r.number();
  if (taken > count || named > taken || named > static_cast<uint64_t>(Span::kMaxNamed)) {
    return false;
  }
  s->idTakenCount = static_cast<int>(taken);
  for (uint64_t i = 0; i < named && r.ok(); ++i) {
    const uint64_t rank = r.number();
    if (rank >= static_cast<uint64_t>(size)) return false;
    s->idTaken.push_back(static_cast<int>(rank));
  }
  s->error = r.text();
  if (!r.ok() || s->error.size() > kMaxErrorBytes) return false;
  s->listsHosts = r.number() != 0;
  const uint64_t hosts = r.number();
  // Every host block that starts in the span, when it lists them; none otherwise.
  uint64_t starting = s->hosts.continues ? 0 : 1;
  for (auto [size, blocks] : s->hosts.runs) starting += static_cast<uint64_t>(blocks);
  starting -= 1;
  if (hosts != (s->listsHosts ? starting : 0) || hosts > Span::kMaxListed) return false;
  for (uint64_t i = 0; i < hosts && r.ok(); ++i) {
    Span::Host h;
    h.name = r.text();
    h.key = r.number();
    if (h.name.size() > kMaxNameBytes) return false;
    s->hostList.push_back(std::move(h));
  }
  return r.ok(true);
}

std::string encodeMachine(const Bootstrapped& m) {
  Writer w;
  w.text(m.error.detail);
  w.number(m.incarnation);
  w.number(m.topology.levels.size());
  for (const Level& level : m.topology.levels) {
    w.text(level.name);
    w.number(level.blockNames.size());
    for (const std::string& name : level.blockNames) w.text(name);
    // Runs, or (blocks that interleave) every rank's block.
    w.number(level.interleaved() ? 1 : 0);
    if (level.interleaved()) {
      for (int r = 0; r < level.ranks(); ++r) w.number(static_cast<uint64_t>(level.blockOf(r)));
      continue;
    }
    w.number(level.runs().size());
    for (const Level::Run& run : level.runs()) {
      w.number(static_cast<uint64_t>(run.blockSize));
      w.number(static_cast<uint64_t>(run.blocks));
    }
  }
  return w.take();
}

bool decodeMachine(const std::string& bytes, int size, Bootstrapped* m) {
  Reader r(bytes);
  if (std::string words = r.text(); !words.empty()) {
    if (words.size() > kMaxErrorBytes) return false;
    m->error = Status(StatusKind::kInvalidArgument, std::move(words));
  }
  m->incarnation = r.number();
  const uint64_t levels = r.number();
  if (!r.ok() || levels > kMaxLevels || (levels == 0 && m->error.ok())) return false;
  Topology t;
  t.size = size;
  for (uint64_t k = 0; k < levels && r.ok(); ++k) {
    std::string name = r.text();
    const uint64_t named = r.number();
    if (!r.ok() || named > static_cast<uint64_t>(size) || name.size() > 64) return false;
    std::vector<std::string> names;
    for (uint64_t b = 0; b < named && r.ok(); ++b) {
      names.push_back(r.text());
      if (names.back().size() > kMaxNameBytes) return false;
    }
    if (r.number() != 0) {  // every rank's block
      std::vector<int> blockOf;
      for (int i = 0; i < size && r.ok(); ++i) {
        const uint64_t block = r.number();
        if (block >= static_cast<uint64_t>(size)) return false;
        blockOf.push_back(static_cast<int>(block));
      }
      if (!r.ok()) return false;
      t.levels.emplace_back(std::move(name), blockOf);
      t.levels.back().blockNames = std::move(names);
      continue;
    }
    const uint64_t n = r.number();
    if (n > kMaxRuns || n > static_cast<uint64_t>(size)) return false;
    std::vector<std::pair<int, int>> runs;
    uint64_t ranks = 0;
    for (uint64_t i = 0; i < n && r.ok(); ++i) {
      const uint64_t blockSize = r.number(), blocks = r.number();
      if (blockSize < 1 || blocks < 1 || blockSize > static_cast<uint64_t>(size) ||
          blocks > static_cast<uint64_t>(size)) {
        return false;
      }
      ranks += blockSize * blocks;
      if (ranks > static_cast<uint64_t>(size)) return false;
      runs.emplace_back(static_cast<int>(blockSize), static_cast<int>(blocks));
    }
    if (!r.ok() || ranks != static_cast<uint64_t>(size)) return false;
    t.levels.emplace_back(std::move(name), levelRuns(runs));
    t.levels.back().blockNames = std::move(names);
  }
  if (!r.ok(true)) return false;
  if (m->error.ok()) {
    try {
      checkTopology(t);
    } catch (const Error&) {
      return false;
    }
    m->topology = std::move(t);
  }
  return true;
}

Bootstrapped machineFrom(const Span& whole, int size, uint32_t groupId, const RackMap& rackMap) {
  Bootstrapped m;
  auto fail = [&m](std::string words) {
    m.error = Status(StatusKind::kInvalidArgument, std::move(words));
    return m;
  };
  if (whole.first != 0 || whole.count != size) {
    return fail("ddl: creating the group: " + std::to_string(whole.count) + " of " +
                std::to_string(size) + " ranks answered");
  }
  if (whole.idTakenCount > 0) {
    std::string taken;
    for (int r : whole.idTaken) taken += (taken.empty() ? "" : ", ") + std::to_string(r);
    if (whole.idTakenCount > static_cast<int>(whole.idTaken.size())) {
      taken += " and " + std::to_string(whole.idTakenCount - whole.idTaken.size()) + " more";
    }
    return fail("ddl: cannot create another group: its id " + std::to_string(groupId) +
                " (group ids are taken modulo " + std::to_string(tag::kGroupIds) +
                ") is still held by a live group on rank(s) " + taken +
                " of the new group; destroy the groups the job no longer uses");
  }
  if (!whole.error.empty()) return fail(whole.error);
  try {
    if (whole.listsHosts) {
      // Every host listed: the localities by rank (a host's name, its locality's hash), as
      // buildTopology groups them.
      std::vector<Locality> localities;
      localities.reserve(static_cast<size_t>(size));
      size_t host = 0;
      for (auto [blockSize, blocks] : whole.hosts.runs) {
        for (int b = 0; b < blocks; ++b, ++host) {
          if (host >= whole.hostList.size()) return fail("ddl: creating the group: hosts missing");
          const Span::Host& h = whole.hostList[host];
          for (int i = 0; i < blockSize; ++i) localities.push_back({h.name, std::to_string(h.key)});
        }
      }
      m.topology = buildTopology(localities, rackMap);
      return m;
    }
    Topology t;
    t.size = size;
    t.levels.emplace_back("host", levelRuns(whole.hosts.runs));
    if (whole.racked) {
      Level racks("rack", levelRuns(whole.racks.runs));
      // A level that would not group anything (every rack one host, one rack in all) is left
      // out, as buildTopology does.
      if (racks.blocks() > 1 && racks.blocks() < t.levels[0].blocks()) {
        t.levels.push_back(std::move(racks));
      }
    }
    checkTopology(t);
    m.topology = std::move(t);
  } catch (const Error& e) {
    return fail(e.what());
  }
  return m;
}

GroupDirectory directoryFrom(const std::vector<RankCard>& cards, const RackMap& racks,
                             uint32_t groupId) {
  GroupDirectory d;
  const size_t n = cards.size();
  d.addresses.resize(n);
  d.identities.resize(n);
  d.topology.size = static_cast<int>(n);
  std::vector<Locality> localities(n);
  std::vector<bool> seen(n, false);
  std::string taken;
  for (const RankCard& c : cards) {
    if (c.rank < 0 || static_cast<size_t>(c.rank) >= n || seen[c.rank]) {
      d.error = Status(StatusKind::kInvalidArgument,
                       "ddl: creating the group: rank " + std::to_string(c.rank) +
                           " answered twice or is not a rank of a group of " + std::to_string(n));
      return d;
    }
    seen[c.rank] = true;
    d.addresses[c.rank] = c.address;
    d.identities[c.rank] = c.identity;
    localities[c.rank] = Locality::decode(c.locality);
    if (c.idTaken) taken += (taken.empty() ? "" : ", ") + std::to_string(c.rank);
  }
  if (!taken.empty()) {
    d.error = Status(StatusKind::kInvalidArgument,
                     "ddl: cannot create another group: its id " + std::to_string(groupId) +
                         " (group ids are taken modulo " + std::to_string(tag::kGroupIds) +
                         ") is still held by a live group on rank(s) " + taken +
                         " of the new group; destroy the groups the job no longer uses");
    return d;
  }
  try {
    d.topology = buildTopology(localities, racks);
  } catch (const Error& e) {
    d.error = Status(StatusKind::kInvalidArgument, e.what());
  }
  return d;
}

}  // namespace ddl
