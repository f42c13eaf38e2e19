// The machine a group runs on, as data: levels of locality, each a partition of the group's
// ranks, innermost first. Level 0 groups the ranks of one host (they share memory); level 1, when
// the user describes racks (TORCH_DDL_TOPOLOGY), groups hosts into racks; the whole group sits
// above the last level. Levels are nested: the ranks of one block of level k lie in one block of
// level k+1.
//
// Hosts are found from facts every rank publishes at group creation (Locality): ranks are on one
// host when they can map each other's shared memory and share a network namespace — never from
// rank order or LOCAL_WORLD_SIZE, and not from host names alone (hosts emulated with namespaces
// share a kernel and a boot id, containers may share a host name).
//
// The grid view gives each rank coordinates (its index in its host, its host's index in its
// rack, ...). A dimension ring links the ranks that agree on every coordinate but one: dimension
// 0 rings are the hosts, dimension 1 rings join the ranks of equal local index across the hosts of
// a rack, and so on. When every block of a level has the same shape the grid is regular; uneven
// hosts (3 ranks on one, 1 on another) make dimension rings of different lengths, which the
// planner (allreduce_plan.h) handles.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../base/rank_set.h"

namespace ddl {

// What one rank publishes about where it runs.
struct Locality {
  std::string hostName;  // gethostname(): the UTS namespace's name
  // Boot id, network namespace and the device of /dev/shm (a private /dev/shm is another
  // device): ranks whose keys are equal can map each other's shared memory over one network
  // stack.
  std::string machineKey;

  static Locality self();
  std::string encode() const;
  static Locality decode(const std::string& text);
  bool sameHost(const Locality& other) const {
    return hostName == other.hostName && machineKey == other.machineKey;
  }
};

// A level of locality: a partition of the group's ranks into blocks (its hosts, its racks),
// numbered in order of their lowest rank. Launchers place the ranks of a block together, so a
// level is held as runs of equal blocks of consecutive ranks: one run for a regular machine,
// whatever its size. A level whose blocks interleave (ranks placed round-robin) holds every
// rank's block instead.
class Level {
 public:
  struct Run {
    int firstRank = 0;  // the lowest rank of its first block
    int blockSize = 1;  // ranks in each of its blocks
    int blocks = 1;
    bool operator==(const Run&) const = default;
  };

  std::string name;  // "host", "rack", "level2", ...
  // By block, for messages and `info --plan`; empty where the names were not gathered
  // (blockName then names a block by its ranks).
  std::vector<std::string> blockNames;

  Level() = default;
  // From the block of each group rank.
  Level(std::string name, const std::vector<int>& blockOfRank);
  // From runs that cover ranks 0, 1, ... in order.
  Level(std::string name, const std::vector<Run>& runs);

  int blocks() const { return blocks_; }
  int ranks() const { return ranks_; }
  // The block of group rank `rank`.
  int blockOf(int rank) const;
  // The ranks of block `block`, in order.
  std::vector<int> membersOf(int block) const;
  // The lowest rank of block `block`: O(log runs), O(ranks) where the blocks interleave.
  int firstRankOf(int block) const;
  std::string blockName(int block) const;
  // Runs of blocks of consecutive ranks; empty when the blocks interleave.
  const std::vector<Run>& runs() const { return runs_; }
  bool interleaved() const { return !byRank_.empty(); }
  bool operator==(const Level& other) const;

 private:
  void addRun(Run run);
  size_t runOfBlock(int block) const;  // runs only
  std::vector<Run> runs_;
  std::vector<int> firstBlockOfRun_;  // by run
  std::vector<int> byRank_;           // interleaved levels only: each rank's block
  int blocks_ = 0;
  int ranks_ = 0;
};

struct Topology {
  int size = 1;
  std::vector<Level> levels;  // levels[0] is the host level; never empty

  // One host holding every rank.
  static Topology singleHost(int size, const std::string& hostName = "localhost");
  int hosts() const { return levels[0].blocks(); }
  // The ranks of each block of `level`, in rank order.
  std::vector<std::vector<int>> members(int level) const;
  // "2 hosts (a: 0 1, b: 2 3)" and, per level above, its blocks.
  std::string describe() const;
};

// Host names to rack names: from TORCH_DDL_TOPOLOGY, either the text itself or "@path" naming a
// file holding it. Lines (or ';'-separated entries) "rack: host host ..." (commas or spaces
// between hosts); '#' starts a comment. Throws on malformed text, naming the entry.
using RackMap = std::map<std::string, std::string>;
RackMap parseRackMap(const std::string& spec);
// The same, parsed once for all the groups of a process that are given the same text (a file's
// text is read each time): a simulated cluster's thousands of ranks share one map.
std::shared_ptr<const RackMap> sharedRackMap(const std::string& spec);

// Builds the levels from every rank's locality (by group rank) and the user's rack map. Hosts
// that the map does not name are an error when it names any (a silent rack of its own would skew
// every plan). A level that would not group anything (every rack one host, one rack in all) is
// left out.
Topology buildTopology(const std::vector<Locality>& ranks, const RackMap& racks = {});

// The machine of a group made of `members` of `topology`'s group (by old rank, in the order of
// their new ranks): the blocks that keep a member, numbered again in order; a level above the
// hosts that no longer groups anything is left out, as buildTopology does.
Topology restrictTopology(const Topology& topology, const std::vector<int>& members);
// The same for a RankSet: a shrink's (every rank but a few) on levels held as runs costs
// O(runs + ranks left out), not O(P) on each of P members.
Topology restrictTopology(const Topology& topology, const RankSet& members);

// Every level one run of equal blocks of consecutive ranks: a regular machine, whose grid is known
// from its levels alone (gridDims, ringPartners, splitDimension).
bool everyLevelOneRun(const Topology& topology);

// Where the planner also weighs a network dimension of `extent` blocks split in two (racks in the
// group, hosts in a rack; allreduceCandidates): the blocks of its first rings, the divisor of
// `extent` nearest its square root from below, from 16 blocks on; 0 where it does not.
int splitInner(int extent);

// The same machine with network dimension k (1 <= k <= levels, topology.h's grid) seen as two: a
// level inserted below level k (above the last level for k = levels) groups `inner` consecutive
// blocks of level k-1, so that dimension k's rings of d blocks become rings of `inner` blocks,
// then rings of d / inner. Only for a machine whose every level is one run of equal blocks, and
// `inner` a divisor of d strictly between 1 and d; throws ddl::Error otherwise.
Topology splitDimension(const Topology& topology, int k, int inner);

// Throws ddl::Error unless the levels are nested partitions of [0, size).
void checkTopology(const Topology& topology);

// Coordinates: coords[rank][k] is the rank's index within its block of level k among the blocks
// of level k-1 (k = 0: its index among the ranks of its host). dims[k] is the largest extent.
struct Grid {
  std::vector<int> dims;
  std::vector<std::vector<int>> coords;
  bool regular = true;  // every block of every level has the same shape
};
Grid gridOf(const Topology& topology);
// The dimension of a message from rank a to rank b: 0 on one host, else the lowest level whose
// block holds both, plus one (the number of levels where only the whole group does).
int dimensionBetween(const Topology& topology, int a, int b);
// Its dims alone: O(levels) on a regular machine (every level one run of equal blocks), where
// gridOf is O(P); gridOf's otherwise.
std::vector<int> gridDims(const Topology& topology);

// The ranks `rank` meets in the rings and Bruck's rounds of a regular machine's dimensions (the
// positions of its dimension rings at distances 2^j each way, wraps included, and those of the
// rings of a dimension split in two: splitInner); on a host's first rank, where the hosts are
// equal, the other hosts' first ranks at distances 2^j (the leaders' trees) and its partners in
// the leaders' recursive doubling (recursiveDoublingPartners); where P is not a power of two, its
// partners in recursive doubling over the whole group; and a host's first rank and its
// other ranks to each other: what the plans send to besides the group-wide distances 2^j. The
// rings' only where every level is one run of equal blocks (a rank of an uneven or interleaved
// machine looks its other peers up as it first sends).
std::vector<int> ringPartners(const Topology& topology, int rank);

// The dimension rings of dimension k: ranks that agree on every coordinate but coordinate k,
// each ring in order of that coordinate. Rings of one rank are left out.
std::vector<std::vector<int>> dimensionRings(const Topology& topology, const Grid& grid, int k);

}  // namespace ddl
