// The machine of a group made of some of another group's ranks (topology.h: restrictTopology).
#include <algorithm>
#include <string>
#include <vector>

#include "../base/status.h"
#include "topology.h"

namespace ddl {

namespace {

// A restricted level joins the topology where it groups anything (the host level always).
void addRestricted(Topology& t, Level level) {
  const bool groups =
      t.levels.empty() || (level.blocks() > 1 && level.blocks() < t.levels.back().blocks());
  if (groups) t.levels.push_back(std::move(level));
}

// `old`, held as runs, less `leftOut` (ascending ranks of its group): runs again, the blocks left
// with no rank dropped, in O(runs + ranks left out).
Level restrictRuns(const Level& old, const std::vector<int>& leftOut) {
  std::vector<Level::Run> runs;
  std::vector<std::string> names;
  int ranks = 0;     // of the new level so far
  int oldBlock = 0;  // the first block of the run walked
  size_t k = 0;      // the next rank left out
  // Blocks [from, from + count) of the run, each keeping `size` ranks.
  auto keep = [&](int from, int count, int size) {
    if (count < 1 || size < 1) return;
    runs.push_back(Level::Run{ranks, size, count});
    ranks += size * count;
    for (int b = from; b < from + count && !old.blockNames.empty(); ++b) {
      names.push_back(old.blockNames[static_cast<size_t>(oldBlock + b)]);
    }
  };
  for (const Level::Run& run : old.runs()) {
    const int end = run.firstRank + run.blocks * run.blockSize;
    int b = 0;
    while (k < leftOut.size() && leftOut[k] < end) {
      const int hit = (leftOut[k] - run.firstRank) / run.blockSize;  // a block that loses ranks
      keep(b, hit - b, run.blockSize);
      int lost = 0;
      for (; k < leftOut.size() && leftOut[k] < run.firstRank + (hit + 1) * run.blockSize; ++k) {
        ++lost;
      }
      keep(hit, 1, run.blockSize - lost);
      b = hit + 1;
    }
    keep(b, run.blocks - b, run.blockSize);
    oldBlock += run.blocks;
  }
  Level level(old.name, runs);
  level.blockNames = std::move(names);
  return level;
}

}  // namespace

Topology restrictTopology(const Topology& topology, const std::vector<int>& members) {
  Topology t;
  t.size = static_cast<int>(members.size());
  for (size_t k = 0; k < topology.levels.size(); ++k) {
    const Level& old = topology.levels[k];
    std::vector<int> blockOf;
    std::vector<std::string> names;
    // New block by old one (-1: none yet): a shrink restricts the machine on every member, and a
    // map here made that O(P log P) a member.
    std::vector<int> renumbered(static_cast<size_t>(old.blocks()), -1);
    int blocks = 0;
    blockOf.reserve(members.size());
    for (int m : members) {
      if (m < 0 || m >= topology.size) {
        throw Error("ddl: rank " + std::to_string(m) + " is not in a group of " +
                    std::to_string(topology.size));
      }
      const int oldBlock = old.blockOf(m);
      int& now = renumbered.at(static_cast<size_t>(oldBlock));
      if (now < 0) {
        now = blocks++;
        if (!old.blockNames.empty()) names.push_back(old.blockName(oldBlock));
      }
      blockOf.push_back(now);
    }
    Level level(old.name, blockOf);
    level.blockNames = std::move(names);
    addRestricted(t, std::move(level));
  }
  checkTopology(t);
  return t;
}

Topology restrictTopology(const Topology& topology, const RankSet& members) {
  const bool runs = members.allButSome() && members.n() == topology.size &&
                    std::none_of(topology.levels.begin(), topology.levels.end(),
                                 [](const Level& level) { return level.interleaved(); });
  if (!runs) return restrictTopology(topology, members.list());
  Topology t;
  t.size = members.size();
  for (const Level& old : topology.levels) addRestricted(t, restrictRuns(old, members.leftOut()));
  checkTopology(t);
  return t;
}

}  // namespace ddl
