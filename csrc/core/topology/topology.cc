#include "topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "../base/algorithm.h"
#include "../base/types.h"

namespace ddl {
namespace {

std::string readFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string linkTarget(const char* path) {
  char buffer[128] = {};
  ssize_t n = readlink(path, buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, n) : std::string("?");
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Groups ranks by `key` (blocks numbered in order of their lowest rank).
Level levelFrom(const std::string& name, const std::vector<std::string>& keyOf,
                const std::vector<std::string>& nameOf) {
  std::vector<std::string> names;
  std::vector<int> blockOf;
  std::map<std::string, int> index;
  for (size_t r = 0; r < keyOf.size(); ++r) {
    auto [it, added] = index.emplace(keyOf[r], static_cast<int>(names.size()));
    if (added) names.push_back(nameOf[r]);
    blockOf.push_back(it->second);
  }
  Level level(name, blockOf);
  level.blockNames = std::move(names);
  return level;
}

}  // namespace

Level::Level(std::string levelName, const std::vector<int>& blockOfRank)
    : name(std::move(levelName)) {
  const int n = static_cast<int>(blockOfRank.size());
  // Consecutive: every rank in its predecessor's block or the next one.
  bool consecutive = blockOfRank.empty() || blockOfRank[0] == 0;
  for (size_t r = 1; r < blockOfRank.size() && consecutive; ++r) {
    const int step = blockOfRank[r] - blockOfRank[r - 1];
    consecutive = step == 0 || step == 1;
  }
  if (!consecutive) {
    ranks_ = n;
    byRank_ = blockOfRank;
    for (int b : blockOfRank) blocks_ = std::max(blocks_, b + 1);
    return;
  }
  int first = 0;
  for (int r = 1; r <= n; ++r) {
    if (r < n && blockOfRank[r] == blockOfRank[r - 1]) continue;
    addRun(Run{first, r - first, 1});
    first = r;
  }
}

Level::Level(std::string levelName, const std::vector<Run>& runs) : name(std::move(levelName)) {
  for (const Run& run : runs) {
    if (run.firstRank != ranks_ || run.blockSize < 1 || run.blocks < 1) {
      throw Error("ddl: topology level " + name + ": a run of " + std::to_string(run.blocks) +
                  " blocks of " + std::to_string(run.blockSize) + " ranks from rank " +
                  std::to_string(run.firstRank) + " does not follow rank " +
                  std::to_string(ranks_ - 1));
    }
    addRun(run);
  }
}

void Level::addRun(Run run) {
  if (!runs_.empty() && runs_.back().blockSize == run.blockSize) {
    runs_.back().blocks += run.blocks;
  } else {
    runs_.push_back(run);
    firstBlockOfRun_.push_back(blocks_);
  }
  blocks_ += run.blocks;
  ranks_ = run.firstRank + run.blockSize * run.blocks;
}

int Level::blockOf(int rank) const {
  if (!byRank_.empty()) return byRank_.at(static_cast<size_t>(rank));
  if (rank < 0 || rank >= ranks_) {
    throw Error("ddl: rank " + std::to_string(rank) + " is outside topology level " + name +
                " of " + std::to_string(ranks_) + " ranks");
  }
  auto it = std::upper_bound(runs_.begin(), runs_.end(), rank,
                             [](int r, const Run& run) { return r < run.firstRank; });
  const size_t i = static_cast<size_t>(it - runs_.begin()) - 1;
  return firstBlockOfRun_[i] + (rank - runs_[i].firstRank) / runs_[i].blockSize;
}

std::vector<int> Level::membersOf(int block) const {
  std::vector<int> members;
  if (!byRank_.empty()) {
    for (int r = 0; r < ranks_ && r < static_cast<int>(byRank_.size()); ++r) {
      if (byRank_[r] == block) members.push_back(r);
    }
    return members;
  }
  if (block < 0 || block >= blocks_) return members;
  const int first = firstRankOf(block);
  for (int r = first; r < first + runs_[runOfBlock(block)].blockSize; ++r) members.push_back(r);
  return members;
}

size_t Level::runOfBlock(int block) const {
  auto it = std::upper_bound(firstBlockOfRun_.begin(), firstBlockOfRun_.end(), block);
  return static_cast<size_t>(it - firstBlockOfRun_.begin()) - 1;
}

int Level::firstRankOf(int block) const {
  if (block < 0 || block >= blocks_) {
    throw Error("ddl: block " + std::to_string(block) + " is outside topology level " + name +
                " of " + std::to_string(blocks_) + " blocks");
  }
  if (!byRank_.empty()) {
    return static_cast<int>(std::find(byRank_.begin(), byRank_.end(), block) - byRank_.begin());
  }
  const size_t i = runOfBlock(block);
  return runs_[i].firstRank + (block - firstBlockOfRun_[i]) * runs_[i].blockSize;
}

std::string Level::blockName(int block) const {
  if (block >= 0 && static_cast<size_t>(block) < blockNames.size()) return blockNames[block];
  const std::vector<int> members = membersOf(block);
  if (members.empty()) return name + " " + std::to_string(block);
  if (members.size() == 1) return name + " of rank " + std::to_string(members[0]);
  return name + " of ranks " + std::to_string(members.front()) + "-" +
         std::to_string(members.back());
}

bool Level::operator==(const Level& other) const {
  return name == other.name && blockNames == other.blockNames && ranks_ == other.ranks_ &&
         blocks_ == other.blocks_ && runs_ == other.runs_ && byRank_ == other.byRank_;
}

Locality Locality::self() {
  Locality l;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  l.hostName = host;
  struct stat shm {};
  std::string shmDevice = stat("/dev/shm", &shm) == 0 ? std::to_string(shm.st_dev) : "?";
  l.machineKey = readFirstLine("/proc/sys/kernel/random/boot_id") + "/" +
                 linkTarget("/proc/self/ns/net") + "/shm:" + shmDevice;
  return l;
}

std::string Locality::encode() const { return hostName + "\n" + machineKey; }

Locality Locality::decode(const std::string& text) {
  size_t cut = text.find('\n');
  if (cut == std::string::npos) throw Error("ddl: malformed locality record '" + text + "'");
  return Locality{text.substr(0, cut), text.substr(cut + 1)};
}

Topology Topology::singleHost(int size, const std::string& hostName) {
  Topology t;
  t.size = size;
  Level host("host", std::vector<Level::Run>{{0, size, 1}});
  host.blockNames = {hostName};
  t.levels.push_back(std::move(host));
  return t;
}

std::vector<std::vector<int>> Topology::members(int level) const {
  std::vector<std::vector<int>> blocks(levels[level].blocks());
  for (int r = 0; r < size; ++r) blocks[levels[level].blockOf(r)].push_back(r);
  return blocks;
}

std::string Topology::describe() const {
  std::ostringstream out;
  for (size_t k = 0; k < levels.size(); ++k) {
    if (k > 0) out << "; ";
    const Level& level = levels[k];
    auto blocks = members(static_cast<int>(k));
    out << level.blocks() << " " << level.name << (level.blocks() == 1 ? "" : "s") << " (";
    for (int b = 0; b < level.blocks(); ++b) {
      if (b > 0) out << ", ";
      out << level.blockName(b) << ":";
      if (k == 0) {
        for (int r : blocks[b]) out << " " << r;
      } else {
        std::set<int> inner;
        for (int r : blocks[b]) inner.insert(levels[k - 1].blockOf(r));
        for (int i : inner) out << " " << levels[k - 1].blockName(i);
      }
    }
    out << ")";
  }
  return out.str();
}

namespace {

// The text of a spec: itself, or the file "@path" names.
std::string rackMapText(const std::string& spec) {
  if (spec.empty() || spec[0] != '@') return spec;
  std::ifstream in(spec.substr(1));
  if (!in)
    throw Error("ddl: TORCH_DDL_TOPOLOGY names " + spec.substr(1) + ", which cannot be read");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

RackMap parseRackMapText(const std::string& text) {
  RackMap racks;
  std::string entry;
  std::string all;
  for (char c : text) all += (c == ';') ? '\n' : c;
  std::istringstream lines(all);
  while (std::getline(lines, entry)) {
    entry = trim(entry.substr(0, entry.find('#')));
    if (entry.empty()) continue;
    size_t colon = entry.find(':');
    std::string rack = colon == std::string::npos ? "" : trim(entry.substr(0, colon));
    if (rack.empty() || rack.find_first_of(" \t,") != std::string::npos) {
      throw Error("ddl: TORCH_DDL_TOPOLOGY entry '" + entry +
                  "' is not 'rack: host host ...' (e.g. 'r0: node1 node2; r1: node3 node4')");
    }
    std::string hosts = entry.substr(colon + 1);
    std::replace(hosts.begin(), hosts.end(), ',', ' ');
    std::istringstream names(hosts);
    std::string host;
    int count = 0;
    while (names >> host) {
      auto [it, added] = racks.emplace(host, rack);
      if (!added && it->second != rack) {
        throw Error("ddl: TORCH_DDL_TOPOLOGY puts host " + host + " in racks " + it->second +
                    " and " + rack);
      }
      ++count;
    }
    if (count == 0) throw Error("ddl: TORCH_DDL_TOPOLOGY rack " + rack + " names no host");
  }
  return racks;
}

}  // namespace

RackMap parseRackMap(const std::string& spec) { return parseRackMapText(rackMapText(spec)); }

std::shared_ptr<const RackMap> sharedRackMap(const std::string& spec) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const RackMap>> parsed;  // by text, the latest few
  const std::string text = rackMapText(spec);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = parsed.find(text);
    if (it != parsed.end()) return it->second;
  }
  auto racks = std::make_shared<const RackMap>(parseRackMapText(text));  // throws when malformed
  std::lock_guard<std::mutex> lock(mutex);
  if (parsed.size() >= 8) parsed.clear();
  parsed.emplace(text, racks);
  return racks;
}

Topology buildTopology(const std::vector<Locality>& ranks, const RackMap& racks) {
  Topology t;
  t.size = static_cast<int>(ranks.size());
  std::vector<std::string> hostKey, hostName;
  for (const Locality& l : ranks) {
    hostKey.push_back(l.hostName + "\n" + l.machineKey);
    hostName.push_back(l.hostName);
  }
  t.levels.push_back(levelFrom("host", hostKey, hostName));
  // Hosts that share a name but not memory (containers) keep their own blocks; name them apart.
  Level& host = t.levels[0];
  std::map<std::string, int> seen;
  for (std::string& name : host.blockNames) {
    int n = seen[name]++;
    if (n > 0) name += "#" + std::to_string(n);
  }
  if (!racks.empty()) {
    std::vector<std::string> rackOf;
    for (int r = 0; r < t.size; ++r) {
      auto it = racks.find(hostName[r]);
      if (it == racks.end()) {
        throw Error("ddl: TORCH_DDL_TOPOLOGY does not name host " + hostName[r] + " (rank " +
                    std::to_string(r) + ")");
      }
      rackOf.push_back(it->second);
    }
    Level rack = levelFrom("rack", rackOf, rackOf);
    bool groups = rack.blocks() > 1 && rack.blocks() < host.blocks();
    if (groups) t.levels.push_back(std::move(rack));
  }
  checkTopology(t);
  return t;
}

bool everyLevelOneRun(const Topology& t) {
  return std::all_of(t.levels.begin(), t.levels.end(), [](const Level& level) {
    return !level.interleaved() && level.runs().size() == 1;
  });
}

int splitInner(int extent) {
  constexpr int kSplitFrom = 16;
  int inner = 0;
  for (int a = 2; extent >= kSplitFrom && a * a <= extent; ++a) {
    if (extent % a == 0) inner = a;
  }
  return inner;
}

Topology splitDimension(const Topology& topology, int k, int inner) {
  const int levels = static_cast<int>(topology.levels.size());
  if (!everyLevelOneRun(topology)) {
    throw Error("ddl: only a machine of equal blocks at every level splits a dimension");
  }
  if (k < 1 || k > levels) {
    throw Error("ddl: dimension " + std::to_string(k) + " is not a network dimension of " +
                std::to_string(levels + 1));
  }
  const int below = topology.levels[k - 1].runs()[0].blockSize;
  const int above = k < levels ? topology.levels[k].runs()[0].blockSize : topology.size;
  const int extent = above / below;
  if (inner < 2 || inner >= extent || extent % inner != 0) {
    throw Error("ddl: dimension " + std::to_string(k) + " of " + std::to_string(extent) +
                " does not split into rings of " + std::to_string(inner));
  }
  Topology split = topology;
  const Level level(topology.levels[k - 1].name + "x" + std::to_string(inner),
                    std::vector<Level::Run>{{0, below * inner, topology.size / (below * inner)}});
  split.levels.insert(split.levels.begin() + k, level);
  checkTopology(split);
  return split;
}

void checkTopology(const Topology& t) {
  if (t.levels.empty()) throw Error("ddl: a topology needs a host level");
  for (size_t k = 0; k < t.levels.size(); ++k) {
    const Level& level = t.levels[k];
    if (level.ranks() != t.size) {
      throw Error("ddl: topology level " + level.name + " places " + std::to_string(level.ranks()) +
                  " of " + std::to_string(t.size) + " ranks");
    }
    if (!level.blockNames.empty() && static_cast<int>(level.blockNames.size()) != level.blocks()) {
      throw Error("ddl: topology level " + level.name + " names " +
                  std::to_string(level.blockNames.size()) + " of its " +
                  std::to_string(level.blocks()) + " blocks");
    }
    if (!level.interleaved() && k == 0) continue;  // runs: every block holds a rank
    if (!level.interleaved() && !t.levels[k - 1].interleaved()) {
      // Blocks of consecutive ranks on both: nested where no inner block straddles the start of
      // an outer one (O(blocks), where the check below is O(P)).
      const Level& inner = t.levels[k - 1];
      for (const Level::Run& run : level.runs()) {
        for (int b = 0; b < run.blocks; ++b) {
          const int start = run.firstRank + b * run.blockSize;
          if (start > 0 && inner.blockOf(start) == inner.blockOf(start - 1)) {
            throw Error("ddl: topology level " + level.name + " splits " + inner.name + " " +
                        inner.blockName(inner.blockOf(start)));
          }
        }
      }
      continue;
    }
    std::vector<int> used(level.blocks(), 0);
    std::vector<int> outerOf(k > 0 ? t.levels[k - 1].blocks() : 0, -1);  // by inner block
    for (int r = 0; r < t.size; ++r) {
      int b = level.blockOf(r);
      if (b < 0 || b >= level.blocks()) {
        throw Error("ddl: topology level " + level.name + " puts rank " + std::to_string(r) +
                    " in block " + std::to_string(b) + " of " + std::to_string(level.blocks()));
      }
      ++used[b];
      if (k > 0) {  // nested: every rank of one inner block lies in one outer block
        const Level& inner = t.levels[k - 1];
        int& outer = outerOf[inner.blockOf(r)];
        if (outer >= 0 && outer != b) {
          throw Error("ddl: topology level " + level.name + " splits " + inner.name + " " +
                      inner.blockName(inner.blockOf(r)));
        }
        outer = b;
      }
    }
    for (int b = 0; b < level.blocks(); ++b) {
      if (used[b] == 0) throw Error("ddl: topology level " + level.name + " has an empty block");
    }
  }
}

Grid gridOf(const Topology& t) {
  const int levels = static_cast<int>(t.levels.size());
  Grid grid;
  grid.dims.assign(levels + 1, 1);
  grid.coords.assign(t.size, std::vector<int>(levels + 1, 0));
  // Coordinate k: the index of the rank's level-(k-1) block (k = 0: the rank itself) among those
  // of its level-k block (k = levels: the whole group), in order of their lowest rank.
  // Levels nest, so an inner block lies in one outer block: its index there is found by the
  // inner block alone (a search among the outer block's inner ones was O(P) a rank on machines
  // of many uneven hosts, and every rank's link probe asks for the grid).
  for (int k = 0; k <= levels; ++k) {
    const int outers = k < levels ? t.levels[k].blocks() : 1;
    const int inners = k == 0 ? t.size : t.levels[k - 1].blocks();
    std::vector<int> indexOf(inners, -1);  // by inner block
    std::vector<int> seen(outers, 0);      // by outer block: inner blocks met so far
    for (int r = 0; r < t.size; ++r) {
      const int outer = k < levels ? t.levels[k].blockOf(r) : 0;
      const int inner = k == 0 ? r : t.levels[k - 1].blockOf(r);
      if (indexOf[inner] < 0) indexOf[inner] = seen[outer]++;
      grid.coords[r][k] = indexOf[inner];
    }
    int extent = 0;
    for (int n : seen) {
      if (n == 0) continue;
      if (extent != 0 && n != extent) grid.regular = false;
      extent = std::max(extent, n);
    }
    grid.dims[k] = extent;
  }
  return grid;
}

std::vector<int> gridDims(const Topology& t) {
  if (!everyLevelOneRun(t)) return gridOf(t).dims;
  std::vector<int> dims;
  int inner = 1;
  for (const Level& level : t.levels) {
    const int block = level.runs()[0].blockSize;
    dims.push_back(block / inner);
    inner = block;
  }
  dims.push_back(t.size / inner);
  return dims;
}

int dimensionBetween(const Topology& t, int a, int b) {
  for (size_t k = 0; k < t.levels.size(); ++k) {
    if (t.levels[k].blockOf(a) == t.levels[k].blockOf(b)) return static_cast<int>(k);
  }
  return static_cast<int>(t.levels.size());
}

std::vector<int> ringPartners(const Topology& t, int rank) {
  std::vector<int> out;
  auto add = [&](int r) {
    if (r != rank && std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  };
  // The host's first rank (its leader, in the leaders' plans and trees), and for it the others.
  const std::vector<int> mates = t.levels[0].membersOf(t.levels[0].blockOf(rank));
  if (mates.front() == rank) {
    for (int r : mates) add(r);
  } else {
    add(mates.front());
  }
  // The leaders' trees (hosts at distances 2^j) and recursive doubling, whose partners are
  // elsewhere where the hosts are not a power of two: looked up as the first op ran, 1 024 of
  // 1 536 leaders queued at the store's one server (a 1 KiB allreduce of 12 288 ranks took 31.8 ms
  // where the model says 0.11). Wherever the hosts are equal, whatever the racks.
  const Level& hostLevel = t.levels[0];
  if (mates.front() == rank && !hostLevel.interleaved() && hostLevel.runs().size() == 1) {
    const int host = hostLevel.runs()[0].blockSize, hosts = t.size / host;
    for (int d = 1; d < hosts; d *= 2) {
      add((rank + d * host) % t.size);
      add(((rank - d * host) % t.size + t.size) % t.size);
    }
    for (int p : recursiveDoublingPartners(rank / host, hosts)) add(p * host);
  }
  // Recursive doubling over the whole group, where the fold moves the partners off the distances
  // 2^j: a 1 KiB allreduce of 192 ranks took 3.9 ms where the model says 42 us, its ranks looking
  // them up at the store as it ran.
  if ((t.size & (t.size - 1)) != 0) {
    for (int p : recursiveDoublingPartners(rank, t.size)) add(p);
  }
  if (!everyLevelOneRun(t)) return out;
  int stride = 1;
  for (size_t k = 0; k <= t.levels.size(); ++k) {
    const int block = k < t.levels.size() ? t.levels[k].runs()[0].blockSize : t.size;
    const int extent = block / stride;
    const int base = rank - rank % block, low = rank % stride;
    const int position = (rank % block) / stride;
    for (int d = 1; d < extent; d *= 2) {
      add(base + ((position + d) % extent) * stride + low);
      add(base + ((position - d % extent + extent) % extent) * stride + low);
    }
    // The dimension split in two (splitDimension): its short rings' wraps, its long rings'
    // neighbours.
    if (const int inner = k > 0 ? splitInner(extent) : 0; inner > 0) {
      const int group = position - position % inner;
      add(base + (group + (position % inner + 1) % inner) * stride + low);
      add(base + (group + (position % inner + inner - 1) % inner) * stride + low);
      add(base + ((position + inner) % extent) * stride + low);
      add(base + ((position - inner + extent) % extent) * stride + low);
    }
    stride = block;
  }
  return out;
}

std::vector<std::vector<int>> dimensionRings(const Topology& t, const Grid& grid, int k) {
  std::map<std::vector<int>, std::vector<int>> rings;
  for (int r = 0; r < t.size; ++r) {
    std::vector<int> key = grid.coords[r];
    key[k] = -1;
    rings[key].push_back(r);
  }
  std::vector<std::vector<int>> out;
  for (auto& [key, ranks] : rings) {
    if (ranks.size() < 2) continue;
    std::sort(ranks.begin(), ranks.end(),
              [&](int a, int b) { return grid.coords[a][k] < grid.coords[b][k]; });
    out.push_back(ranks);
  }
  // Deterministic order on every rank: by lowest member.
  std::sort(out.begin(), out.end(), [](const std::vector<int>& a, const std::vector<int>& b) {
    return *std::min_element(a.begin(), a.end()) < *std::min_element(b.begin(), b.end());
  });
  return out;
}

}  // namespace ddl
