// Topologies and allreduce plans: discovery from locality facts, racks, the grid, every plan
// checked by replay over simulated topologies (1 to 3 levels, uneven, interleaved, 1 to 16
// ranks), the cost model's choices, and the multi-dimensional allreduce run over the loopback
// transport from plans for simulated topologies, against the expected sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <sstream>

#include "../../csrc/core/group/link_probe.h"
#include "collective_checks.h"
#include "harness.h"
#include "values.h"

namespace ddl::test {
namespace {

// Ranks on hosts "h<i>" (hostOf[rank] = i), hosts in racks "r<j>" when rackOf is given.
Topology simulated(const std::vector<int>& hostOf, const std::vector<int>& rackOf = {}) {
  std::vector<Locality> ranks;
  for (int h : hostOf) ranks.push_back(Locality{"h" + std::to_string(h), "m" + std::to_string(h)});
  RackMap racks;
  for (size_t h = 0; h < rackOf.size(); ++h) {
    racks["h" + std::to_string(h)] = "r" + std::to_string(rackOf[h]);
  }
  return buildTopology(ranks, racks);
}

struct Shape {
  std::vector<int> hostOf;
  std::vector<int> rackOf;
};

// Regular, uneven, interleaved and three-level shapes.
std::vector<Shape> shapes() {
  return {
      {{0}},
      {{0, 1}},
      {{0, 0, 1, 1}},
      {{0, 1, 0, 1}},
      {{0, 0, 0, 1}},
      {{1, 0, 0, 0}},
      {{0, 0, 1, 1, 1, 2}},
      {{0, 0, 0, 0, 1, 1, 1, 1}},
      {{0, 1, 2, 0, 1, 2, 0, 1, 2}},
      {{0, 0, 1, 1, 2, 2, 3, 3}, {0, 0, 1, 1}},
      {{0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4}, {0, 0, 1, 1, 1}},
      {{0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 0, 1, 2}, {0, 0, 1, 1}},
      {{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7}, {0, 0, 1, 1, 2, 2, 3, 3}},
  };
}

TEST(Topology, HostsComeFromLocalityNotRankOrder) {
  Topology t = simulated({0, 1, 0, 0});
  ASSERT_EQ(t.hosts(), 2);
  EXPECT_EQ(t.members(0), (std::vector<std::vector<int>>{{0, 2, 3}, {1}}));
  Grid g = gridOf(t);
  EXPECT_FALSE(g.regular);
  EXPECT_EQ(g.dims, (std::vector<int>{3, 2}));
  EXPECT_EQ(dimensionRings(t, g, 1), (std::vector<std::vector<int>>{{0, 1}}));
  EXPECT_EQ(dimensionRings(t, g, 0), (std::vector<std::vector<int>>{{0, 2, 3}}));
  EXPECT_EQ(t.describe(), "2 hosts (h0: 0 2 3, h1: 1)");
}

TEST(Topology, SameHostNameButNotSameMemoryIsAnotherHost) {
  Topology t = buildTopology({{"node", "a"}, {"node", "a"}, {"node", "b"}});
  ASSERT_EQ(t.hosts(), 2);
  EXPECT_EQ(t.levels[0].blockNames, (std::vector<std::string>{"node", "node#1"}));
}

TEST(Topology, LocalityRoundTripsAndNamesThisHost) {
  Locality self = Locality::self();
  EXPECT_FALSE(self.hostName.empty());
  EXPECT_TRUE(Locality::decode(self.encode()).sameHost(self));
  EXPECT_THROW(Locality::decode("no newline"), Error);
}

// A group of some of a group's ranks sees the machine that creation would find for them.
// gridDims reads a regular machine's extents off its runs; on every shape, and on large regular
// ones (whose gridOf is O(P)), they are gridOf's.
TEST(Topology, GridDimsAreTheGridsDims) {
  std::vector<Topology> machines;
  for (const Shape& shape : shapes()) machines.push_back(simulated(shape.hostOf, shape.rackOf));
  for (int hostSize : {1, 3, 8}) {
    for (int hostsPerRack : {1, 2, 5}) {
      std::vector<int> hostOf, rackOf;
      for (int r = 0; r < hostSize * hostsPerRack * 4; ++r) hostOf.push_back(r / hostSize);
      for (int h = 0; h < hostsPerRack * 4; ++h) rackOf.push_back(h / hostsPerRack);
      machines.push_back(simulated(hostOf, rackOf));
      machines.push_back(simulated(hostOf));
    }
  }
  for (const Topology& t : machines) EXPECT_EQ(gridDims(t), gridOf(t).dims) << t.describe();
}

TEST(Topology, ARestrictedTopologyIsWhatTheMembersWouldFind) {
  for (const Shape& shape : shapes()) {
    const int n = static_cast<int>(shape.hostOf.size());
    const Topology whole = simulated(shape.hostOf, shape.rackOf);
    for (int gone = 0; gone < n && n > 1; ++gone) {
      std::vector<int> members, hostOf;
      for (int r = 0; r < n; ++r) {
        if (r == gone) continue;
        members.push_back(r);
        hostOf.push_back(shape.hostOf[r]);
      }
      const Topology restricted = restrictTopology(whole, members);
      const Topology found = simulated(hostOf, shape.rackOf);
      ASSERT_EQ(restricted.size, found.size);
      ASSERT_EQ(restricted.levels.size(), found.levels.size())
          << found.describe() << " without " << gone;
      for (size_t k = 0; k < found.levels.size(); ++k) {
        EXPECT_TRUE(restricted.levels[k] == found.levels[k]) << found.describe();
        EXPECT_EQ(restricted.levels[k].blockNames, found.levels[k].blockNames);
      }
    }
  }
  EXPECT_THROW(restrictTopology(simulated({0, 1}), {0, 2}), Error);
}

// A shrink's members (every rank but a few) restrict the machine from its runs: the same levels as
// the members written out, whichever ranks (a rank, a whole host, hosts' edges) are left out.
TEST(Topology, RestrictingToAllButAFewIsRestrictingToThemListed) {
  std::mt19937 random(20261205);
  std::vector<Topology> machines;
  for (const Shape& shape : shapes()) machines.push_back(simulated(shape.hostOf, shape.rackOf));
  std::vector<int> hostOf, rackOf;
  for (int r = 0; r < 96; ++r) hostOf.push_back(r < 40 ? r / 8 : 5 + (r - 40) / 4);
  for (int h = 0; h < 19; ++h) rackOf.push_back(h / 3);
  machines.push_back(simulated(hostOf, rackOf));
  int checked = 0;
  for (const Topology& whole : machines) {
    for (int trial = 0; trial < 40; ++trial) {
      const int n = whole.size;
      std::vector<int> leftOut;
      if (trial < n && trial % 2 == 0) {  // a whole host
        leftOut = whole.levels[0].membersOf(whole.levels[0].blockOf(trial));
      } else {
        for (int r = 0; r < n; ++r) {
          if (random() % 5 == 0) leftOut.push_back(r);
        }
      }
      if (static_cast<int>(leftOut.size()) >= n) continue;
      const RankSet members = RankSet::allBut(n, leftOut);
      const Topology runs = restrictTopology(whole, members);
      const Topology listed = restrictTopology(whole, members.list());
      ASSERT_EQ(runs.size, listed.size);
      ASSERT_EQ(runs.levels.size(), listed.levels.size()) << whole.describe();
      for (size_t k = 0; k < listed.levels.size(); ++k) {
        EXPECT_TRUE(runs.levels[k] == listed.levels[k])
            << whole.describe() << " as " << listed.describe();
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(Topology, RacksFromTheUsersMap) {
  RackMap racks = parseRackMap("r0: h0, h1  # first\n r1: h2 h3; r2: h4");
  EXPECT_EQ(racks.size(), 5u);
  EXPECT_EQ(racks["h3"], "r1");
  Topology t = simulated({0, 0, 1, 1, 2, 2, 3, 3}, {0, 0, 1, 1});
  ASSERT_EQ(t.levels.size(), 2u);
  EXPECT_EQ(t.levels[1].blocks(), 2);
  Grid g = gridOf(t);
  EXPECT_TRUE(g.regular);
  EXPECT_EQ(g.dims, (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(dimensionRings(t, g, 2),
            (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // One rack in all, or one host per rack, adds no level.
  EXPECT_EQ(simulated({0, 1, 2}, {0, 0, 0}).levels.size(), 1u);
  EXPECT_EQ(simulated({0, 1, 2}, {0, 1, 2}).levels.size(), 1u);
}

TEST(Topology, BadRackMapsSayWhatIsWrong) {
  auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { parseRackMap("h0 h1"); }).find("'h0 h1'"), std::string::npos);
  EXPECT_NE(message([] { parseRackMap("r0: h0; r1: h0"); }).find("host h0 in racks r0 and r1"),
            std::string::npos);
  EXPECT_NE(message([] { parseRackMap("r0:"); }).find("names no host"), std::string::npos);
  EXPECT_NE(message([] { parseRackMap("@/nonexistent/topology"); }).find("cannot be read"),
            std::string::npos);
  EXPECT_NE(message([] {
              simulated({0, 1}, {0});
            }).find("does not name host h1 (rank 1)"),
            std::string::npos);
  Topology bad = simulated({0, 0, 1, 1});
  bad.levels.push_back(Level("rack", std::vector<int>{0, 1, 1, 1}));
  bad.levels.back().blockNames = {"a", "b"};
  EXPECT_NE(message([&] { checkTopology(bad); }).find("splits host h0"), std::string::npos);
  // Racks of runs that straddle a host of the second run; racks that nest are taken.
  Topology uneven = simulated({0, 0, 1, 1, 1, 2, 2, 2});
  uneven.levels.push_back(Level("rack", std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_NE(message([&] { checkTopology(uneven); }).find("splits host h1"), std::string::npos);
  uneven.levels.back() = Level("rack", std::vector<int>{0, 0, 0, 0, 0, 1, 1, 1});
  EXPECT_EQ(message([&] { checkTopology(uneven); }), "no error");
  // The shared map is parsed once per text and fails as parseRackMap does.
  EXPECT_EQ(sharedRackMap("r0: h0 h1; r1: h2"), sharedRackMap("r0: h0 h1; r1: h2"));
  EXPECT_EQ(*sharedRackMap("r0: h0 h1; r1: h2"), parseRackMap("r0: h0 h1; r1: h2"));
  EXPECT_NE(message([] { sharedRackMap("r0:"); }).find("names no host"), std::string::npos);
}

TEST(Topology, ALevelHoldsRunsOfEqualBlocksOrEveryRanksBlock) {
  // Hosts of 4, 4, 4, 2, 3, 3: three runs, whatever the number of ranks.
  const Level hosts("host",
                    std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 4, 4, 4, 5, 5, 5});
  EXPECT_FALSE(hosts.interleaved());
  EXPECT_EQ(hosts.runs(), (std::vector<Level::Run>{{0, 4, 3}, {12, 2, 1}, {14, 3, 2}}));
  EXPECT_EQ(hosts.blocks(), 6);
  EXPECT_EQ(hosts.ranks(), 20);
  EXPECT_EQ(hosts.blockOf(0), 0);
  EXPECT_EQ(hosts.blockOf(11), 2);
  EXPECT_EQ(hosts.blockOf(13), 3);
  EXPECT_EQ(hosts.blockOf(19), 5);
  EXPECT_EQ(hosts.membersOf(4), (std::vector<int>{14, 15, 16}));
  EXPECT_EQ(hosts.blockName(3), "host of ranks 12-13");
  EXPECT_THROW(hosts.blockOf(20), Error);
  // The same from runs; a run that does not follow the one before is refused, naming it.
  EXPECT_TRUE(Level("host", std::vector<Level::Run>{
                                {0, 4, 2}, {8, 4, 1}, {12, 2, 1}, {14, 3, 2}}) == hosts);
  try {
    Level("host", std::vector<Level::Run>{{0, 4, 2}, {9, 2, 1}});
    ADD_FAILURE() << "a run that does not follow was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("from rank 9 does not follow rank 7"), std::string::npos)
        << e.what();
  }
  // Blocks that interleave (ranks placed round-robin) are held rank by rank.
  const Level alternate("host", std::vector<int>{0, 1, 0, 1});
  EXPECT_TRUE(alternate.interleaved());
  EXPECT_EQ(alternate.blocks(), 2);
  EXPECT_EQ(alternate.blockOf(2), 0);
  EXPECT_EQ(alternate.membersOf(1), (std::vector<int>{1, 3}));
  // 65 536 ranks in hosts of 8: one run.
  std::vector<int> big(65536);
  for (int r = 0; r < 65536; ++r) big[r] = r / 8;
  const Level many("host", big);
  EXPECT_EQ(many.runs().size(), 1u);
  EXPECT_EQ(many.blockOf(65535), 8191);
}

// Ranks in hosts of `perHost`, hosts in racks of `hostsPerRack`, as runs (the simulator's
// machines).
Topology regular(int ranks, int perHost, int hostsPerRack) {
  Topology t;
  t.size = ranks;
  t.levels.emplace_back("host", std::vector<Level::Run>{{0, perHost, ranks / perHost}});
  const int rack = perHost * hostsPerRack;
  t.levels.emplace_back("rack", std::vector<Level::Run>{{0, rack, ranks / rack}});
  return t;
}

TEST(Topology, ADimensionSplitInTwoIsTwoDimensionsOfTheSameRanks) {
  const Topology t = regular(512, 2, 16);  // 16 racks
  EXPECT_EQ(gridDims(t), (std::vector<int>{2, 16, 16}));
  // The racks (dimension 2) as rings of 4 racks, then rings of every 4th rack.
  const Topology racks = splitDimension(t, 2, 4);
  EXPECT_EQ(gridDims(racks), (std::vector<int>{2, 16, 4, 4}));
  EXPECT_EQ(gridOf(racks).dims, gridDims(racks));
  const Grid grid = gridOf(racks);
  EXPECT_EQ(dimensionRings(racks, grid, 2).front(), (std::vector<int>{0, 32, 64, 96}));
  EXPECT_EQ(dimensionRings(racks, grid, 3).front(), (std::vector<int>{0, 128, 256, 384}));
  // The hosts of a rack (dimension 1) as rings of 4 hosts, then of every 4th.
  const Topology hosts = splitDimension(t, 1, 4);
  EXPECT_EQ(gridDims(hosts), (std::vector<int>{2, 4, 4, 16}));
  EXPECT_EQ(dimensionRings(hosts, gridOf(hosts), 2).front(), (std::vector<int>{0, 8, 16, 24}));
  // Only network dimensions, only divisors strictly between 1 and the extent, only runs.
  EXPECT_THROW(splitDimension(t, 0, 2), Error);
  EXPECT_THROW(splitDimension(t, 3, 2), Error);
  EXPECT_THROW(splitDimension(t, 2, 3), Error);
  EXPECT_THROW(splitDimension(t, 2, 1), Error);
  EXPECT_THROW(splitDimension(t, 2, 16), Error);
  EXPECT_THROW(splitDimension(simulated({0, 0, 1, 1, 1, 2}), 1, 3), Error);
  // What the planner weighs: from 16 blocks, rings of the divisor nearest the square root.
  EXPECT_EQ(splitInner(15), 0);
  EXPECT_EQ(splitInner(16), 4);
  EXPECT_EQ(splitInner(17), 0);
  EXPECT_EQ(splitInner(32), 4);
  EXPECT_EQ(splitInner(48), 6);
  EXPECT_EQ(splitInner(256), 16);
}

// Every peer a rank meets in the rings of the plan auto picks is one it was told of at creation
// (ringPartners), so that no rank asks the store for an address during an op. The split rings'
// wraps were not: a 64 KiB allreduce of 256 ranks in racks of 16 hosts took 4.2 ms in the
// simulator, where the model (and, once told, the simulation) says 184 us.
TEST(Topology, EveryRingPeerOfThePlansIsAPartnerFromCreation) {
  const LinkCosts links = parseLinks("0:2us:20GB,1:5us:12.5GB,2:8us:6GB");
  for (const Topology& t : {regular(256, 2, 16), regular(1024, 8, 32), regular(512, 1, 64)}) {
    for (size_t bytes : {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20}) {
      const AllreducePlan plan = planAllreduce(t, links, bytes / 4, 4, PlanRequest{});
      SCOPED_TRACE(t.describe() + ", " + std::to_string(bytes) + " bytes: " + plan.describe());
      std::vector<std::set<int>> partners(t.size);
      for (int r = 0; r < t.size; ++r) {
        for (int p : ringPartners(t, r)) partners[r].insert(p);
      }
      int missing = 0;
      for (const Lane& lane : plan.lanes) {
        for (const Stage& stage : lane.stages) {
          for (const StageRing& ring : stage.rings) {
            const size_t n = ring.order.size();
            for (size_t i = 0; i < n; ++i) {
              const int from = ring.order[i], to = ring.order[(i + 1) % n];
              if (t.levels[0].blockOf(from) == t.levels[0].blockOf(to)) continue;
              missing += partners[from].count(to) == 0 || partners[to].count(from) == 0;
            }
          }
        }
      }
      EXPECT_EQ(missing, 0);
    }
  }
}

// Auto weighs the multidim plans over the machine with its wide levels split in two: the same
// bytes over the same links in fewer steps. 512 ranks, a host each, 64 hosts a rack: the rack
// level's rings of 64 hosts become rings of 8, then of 8.
TEST(Plan, AWideLevelSplitInTwoCarriesTheSameBytesInFewerSteps) {
  const Topology t = regular(512, 1, 64);
  const LinkCosts links = parseLinks("0:2us:20GB,1:5us:12.5GB,2:8us:6GB");
  const AllreducePlan split = planAllreduce(t, links, 16384, 4, PlanRequest{});
  ASSERT_EQ(split.splits.size(), 1u) << split.describe();
  EXPECT_EQ(split.splits[0].dimension, 1);
  EXPECT_EQ(split.splits[0].inner * split.splits[0].outer, 64);
  EXPECT_NE(split.describe().find("split1=8x8"), std::string::npos) << split.describe();
  checkPlan(split, t.size);
  PlanRequest whole;
  whole.algorithm = AllreduceAlgorithm::kMultiDim;  // forced multidim: the levels as they are
  whole.colors = split.colors;
  whole.rings = split.rings;
  whole.waves = split.waves;
  const AllreducePlan unsplit = planAllreduce(t, links, 16384, 4, whole);
  EXPECT_TRUE(unsplit.splits.empty());
  EXPECT_LT(stepsNeeded(split), stepsNeeded(unsplit));
  EXPECT_LT(split.predicted, 0.8 * unsplit.predicted);
  // A machine of uneven hosts keeps its levels whole.
  const AllreducePlan uneven =
      planAllreduce(simulated({0, 0, 1, 1, 1, 2}), links, 16384, 4, PlanRequest{});
  EXPECT_TRUE(uneven.splits.empty());
}

// The planner prices the candidates one at a time and keeps only the cheapest whole (it let the
// others' stages go); its pick is the first of every candidate held whole, stages and all.
TEST(Plan, ThePlannersPickIsTheFirstOfTheCandidatesHeldWhole) {
  const LinkCosts links = parseLinks("0:2us:20GB,1:5us:12.5GB,2:8us:6GB");
  for (const Topology& t : {regular(256, 2, 16), regular(512, 4, 8), regular(64, 8, 2)}) {
    for (size_t count : {size_t{1031}, size_t{1} << 18, size_t{1} << 22}) {
      const AllreducePlan pick = planAllreduce(t, links, count, 4, PlanRequest{});
      const AllreducePlan first = allreduceCandidates(t, links, count, 4, PlanRequest{}).front();
      SCOPED_TRACE(t.describe() + ", " + std::to_string(count) + ": " + pick.describe());
      EXPECT_EQ(pick.describe(), first.describe());
      EXPECT_EQ(pick.predicted, first.predicted);
      ASSERT_EQ(pick.lanes.size(), first.lanes.size());
      for (size_t l = 0; l < pick.lanes.size(); ++l) {
        EXPECT_EQ(pick.lanes[l].stages.size(), first.lanes[l].stages.size());
      }
      if (pick.algorithm == AllreduceAlgorithm::kMultiDim) checkPlan(pick, t.size);
    }
  }
}

// The planner's ranking takes each place against the cheapest of what is left: a plan within
// 0.1 % of it is its equal and the earlier of equals goes first, but a plan dearer than that
// never goes first through a chain of plans each within 0.1 % of the next (a sort by the
// pairwise rule put the whole levels, 0.16 % dearer, first at 65 536 ranks).
TEST(Plan, TheCheapestFirstTakesEachPlaceAgainstTheCheapestLeft) {
  // 1.0015 is 0.15 % dearer than 1.0; 1.0008 is within 0.1 % of both.
  EXPECT_EQ(cheapestFirst({1.0015, 1.0008, 1.0}), (std::vector<size_t>{1, 2, 0}));
  EXPECT_EQ(cheapestFirst({1.0, 1.0005, 0.9}), (std::vector<size_t>{2, 0, 1}));
  EXPECT_EQ(cheapestFirst({2.0, 1.0, 1.0}), (std::vector<size_t>{1, 2, 0}));
  EXPECT_EQ(cheapestFirst({}), std::vector<size_t>{});
  // Whatever the predictions, the first is within 0.1 % of the cheapest.
  std::mt19937_64 random(20261205);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> predicted;
    for (int i = 0; i < 12; ++i) predicted.push_back(1.0 + 0.0004 * (random() % 8));
    const std::vector<size_t> order = cheapestFirst(predicted);
    const double cheapest = *std::min_element(predicted.begin(), predicted.end());
    EXPECT_LE(predicted[order.front()] * 0.999, cheapest);
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], i);
  }
}

TEST(Plan, EveryShapeColourAndRingCountReplaysToOneFullSum) {
  for (const Shape& shape : shapes()) {
    Topology t = simulated(shape.hostOf, shape.rackOf);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
      for (int colors = 1; colors <= 3; ++colors) {
        for (int rings = 1; rings <= 2; ++rings) {
          for (int waves : {1, 3}) {
            AllreducePlan plan = planMultiDim(t, count, 4, colors, rings, {}, waves);
            SCOPED_TRACE(t.describe() + " count " + std::to_string(count) + " " + plan.describe());
            EXPECT_NO_THROW(checkPlan(plan, t.size));
            EXPECT_EQ(plan.lanes.size(), static_cast<size_t>(colors * rings * waves));
          }
        }
      }
    }
  }
}

// The index a checked plan carries names, for every rank, the rings a look at every ring finds,
// in the same order, on even and uneven machines (the closing stage of uneven hosts included).
TEST(Plan, MemberIndexFindsTheRingsTheScanFinds) {
  for (const std::vector<int>& hosts :
       {std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 0, 0, 1, 1, 2, 2, 2, 2},
        std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 4}}) {
    const Topology t = simulated(hosts);
    AllreducePlan plan = planMultiDim(t, 1001, 4, 2, 2, {}, 2);
    AllreducePlan indexed = plan;
    indexMembers(indexed, t.size);
    for (size_t l = 0; l < plan.lanes.size(); ++l) {
      for (size_t s = 0; s < plan.lanes[l].stages.size(); ++s) {
        const Stage& scanned = plan.lanes[l].stages[s];
        ASSERT_TRUE(scanned.memberFrom.empty());
        for (int r = 0; r < t.size; ++r) {
          EXPECT_EQ(ringsWith(indexed.lanes[l].stages[s], r), ringsWith(scanned, r))
              << "lane " << l << " stage " << s << " rank " << r;
        }
      }
    }
  }
}

TEST(Plan, RegularGridStagesCarryWhatSurvivedTheLevelBelow) {
  Topology t = simulated({0, 0, 1, 1});
  AllreducePlan plan = planMultiDim(t, 1000, 4, 1, 1);
  ASSERT_EQ(plan.lanes.size(), 1u);
  const Lane& lane = plan.lanes[0];
  ASSERT_EQ(lane.stages.size(), 2u);  // no closing stage on a regular grid
  EXPECT_EQ(lane.stages[0].dimension, 0);
  ASSERT_EQ(lane.stages[0].rings.size(), 2u);
  EXPECT_EQ(lane.stages[0].rings[0].order, (std::vector<int>{0, 1}));
  EXPECT_EQ(lane.stages[1].dimension, 1);
  ASSERT_EQ(lane.stages[1].rings.size(), 2u);
  EXPECT_EQ(lane.stages[1].rings[0].order, (std::vector<int>{0, 2}));
  // The network stage reduces half the buffer per ring: what each rank held after its host.
  EXPECT_EQ(lane.stages[1].rings[0].chunks[0].length + lane.stages[1].rings[0].chunks[1].length,
            500u);
  // Two colours: colour 1 starts across hosts.
  AllreducePlan colored = planMultiDim(t, 1000, 4, 2, 1);
  EXPECT_EQ(colored.lanes[1].order, (std::vector<int>{1, 0}));
  EXPECT_EQ(colored.lanes[1].stages[0].dimension, 1);
  EXPECT_NO_THROW(checkPlan(colored, 4));
  // Odd rings run backwards.
  AllreducePlan twoRings = planMultiDim(t, 1000, 4, 1, 2);
  EXPECT_TRUE(twoRings.lanes[1].reversed);
  EXPECT_EQ(twoRings.lanes[1].stages[0].rings[0].order, (std::vector<int>{1, 0}));
}

TEST(Plan, UnevenHostsInRotatedOrderCloseOverTheWholeGroup) {
  Topology t = simulated({0, 0, 0, 1});
  AllreducePlan plan = planMultiDim(t, 999, 4, 1, 1, {1, 0});
  EXPECT_EQ(plan.lanes[0].stages.back().dimension, -1);
  EXPECT_NO_THROW(checkPlan(plan, 4));
}

TEST(Plan, CheckRejectsBrokenPlans) {
  Topology t = simulated({0, 0, 1, 1});
  AllreducePlan good = planMultiDim(t, 100, 4, 1, 1);
  AllreducePlan dropped = good;
  dropped.lanes[0].stages.pop_back();
  EXPECT_THROW(checkPlan(dropped, 4), Error);
  AllreducePlan repeated = good;
  repeated.lanes[0].stages[0].rings[0].order = {0, 0};
  EXPECT_THROW(checkPlan(repeated, 4), Error);
  AllreducePlan sharedSteps = good;
  sharedSteps.lanes[0].stages[1].rings[0].firstStep = 0;
  sharedSteps.lanes[0].stages[0].rings[0].order = {0, 1};
  EXPECT_THROW(checkPlan(sharedSteps, 4), Error);
  AllreducePlan twice = planMultiDim(t, 100, 4, 2, 1);
  twice.lanes[1].phase = 0;
  EXPECT_THROW(checkPlan(twice, 4), Error);
  AllreducePlan waves = planMultiDim(t, 100, 4, 1, 1, {}, 2);
  waves.lanes[0].after = 1;  // a wave may only follow an earlier one
  EXPECT_THROW(checkPlan(waves, 4), Error);
  EXPECT_THROW(planMultiDim(t, 100, 4, 1, 1, {2}), Error);
  EXPECT_THROW(planMultiDim(t, 100, 4, 1, 1, {0, 0}), Error);
}

TEST(Plan, LinksParseWithUnitsAndRejectNonsense) {
  LinkCosts links = parseLinks("1:50us:117MB, 2:1ms:40M");
  EXPECT_DOUBLE_EQ(links.at(1).latency, 50e-6);
  EXPECT_DOUBLE_EQ(links.at(1).bandwidth, 117e6);
  EXPECT_DOUBLE_EQ(links.at(2).latency, 1e-3);
  EXPECT_DOUBLE_EQ(links.at(2).bandwidth, 40e6);
  EXPECT_DOUBLE_EQ(links.at(0).bandwidth, defaultLinks().at(0).bandwidth);
  EXPECT_DOUBLE_EQ(links.at(5).bandwidth, 40e6);  // deeper dimensions: the outermost given
  EXPECT_THROW(parseLinks("1:50us"), Error);
  EXPECT_THROW(parseLinks("x:50us:1GB"), Error);
  EXPECT_THROW(parseLinks("1:50parsecs:1GB"), Error);
  EXPECT_THROW(parseLinks("1:50us:-3GB"), Error);
  // A message's overhead: given as a fourth field, the default's where not.
  links = parseLinks("1:5us:12.5GB:0.5us,2:8us:6GB");
  EXPECT_DOUBLE_EQ(links.at(1).overhead, 0.5e-6);
  EXPECT_DOUBLE_EQ(links.at(2).overhead, defaultLinks().at(2).overhead);
  EXPECT_DOUBLE_EQ(links.at(0).overhead, defaultLinks().at(0).overhead);
  EXPECT_NE(links.describe().find("1:5us:12500MB:0.5us"), std::string::npos) << links.describe();
  EXPECT_THROW(parseLinks("1:5us:12.5GB:fast"), Error);
  EXPECT_THROW(parseLinks("1:5us:12.5GB:2parsecs"), Error);
}

TEST(Plan, TheCostModelPicksTheHierarchyAcrossHostsAndKeepsOneHostAsItWas) {
  const LinkCosts links = parseLinks("0:2us:5GB,1:50us:117MB");
  PlanRequest automatic;
  Topology twoByTwo = simulated({0, 0, 1, 1});
  const size_t big = 16 << 20;  // float32 elements: 64 MiB
  AllreducePlan chosen = planAllreduce(twoByTwo, links, big, 4, automatic);
  EXPECT_EQ(chosen.algorithm, AllreduceAlgorithm::kMultiDim) << chosen.describe();
  AllreducePlan flat =
      planAllreduce(twoByTwo, links, big, 4, PlanRequest{AllreduceAlgorithm::kRing});
  // A flat ring carries 2N(P-1)/P over each host link and direction, the 2-level ring 2N(H-1)/H.
  EXPECT_NEAR(flat.predicted / chosen.predicted, 1.5, 0.1);
  EXPECT_EQ(planAllreduce(twoByTwo, links, 2, 4, automatic).algorithm,
            AllreduceAlgorithm::kRecursiveDoubling);
  Topology twoByFour = simulated({0, 0, 0, 0, 1, 1, 1, 1});
  chosen = planAllreduce(twoByFour, links, big, 4, automatic);
  flat = planAllreduce(twoByFour, links, big, 4, PlanRequest{AllreduceAlgorithm::kRing});
  EXPECT_NEAR(flat.predicted / chosen.predicted, 1.75, 0.1);
  // One host: in one step while each rank reads at most TORCH_DDL_ONCE_BYTES of the others'
  // tensors (kShared, staged once), recursive doubling from there up to the small size, then the
  // shared-memory algorithms.
  Topology one = Topology::singleHost(4);
  EXPECT_EQ(automatic.onceBytes, 65536u);  // TORCH_DDL_ONCE_BYTES' default
  EXPECT_EQ(planAllreduce(one, links, 100, 4, automatic).describe(), "shared staged once");
  EXPECT_EQ(planAllreduce(one, links, 5461, 4, automatic).describe(), "shared staged once");
  EXPECT_EQ(planAllreduce(one, links, 5462, 4, automatic).describe(), "shared staged");
  EXPECT_EQ(planAllreduce(Topology::singleHost(2), links, 16384, 4, automatic).describe(),
            "shared staged once");
  PlanRequest never = automatic;
  never.onceBytes = 0;
  EXPECT_EQ(planAllreduce(one, links, 100, 4, never).algorithm,
            AllreduceAlgorithm::kRecursiveDoubling);
  never.onceBytes = 3 * 256;
  EXPECT_EQ(planAllreduce(one, links, 100, 4, never).algorithm,
            AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(planAllreduce(one, links, 64, 4, never).describe(), "shared staged once");
  automatic.onceBytes = 0;
  EXPECT_EQ(planAllreduce(one, links, big, 4, automatic).algorithm, AllreduceAlgorithm::kShared);
  // Knobs force: colours, rings and order.
  PlanRequest forced{AllreduceAlgorithm::kMultiDim, 2, 2, {1, 0}, 3};
  AllreducePlan f = planAllreduce(twoByTwo, links, big, 4, forced);
  EXPECT_EQ(f.describe(), "multidim colors=2 rings=2 waves=3 order=1,0");
  EXPECT_EQ(f.lanes.size(), 12u);
  // Waves pipeline through the levels: more waves hide the host stage behind the network.
  PlanRequest oneWave{AllreduceAlgorithm::kMultiDim, 1, 1, {}, 1};
  PlanRequest fourWaves{AllreduceAlgorithm::kMultiDim, 1, 1, {}, 4};
  EXPECT_LT(planAllreduce(twoByTwo, links, big, 4, fourWaves).predicted,
            planAllreduce(twoByTwo, links, big, 4, oneWave).predicted);
  // Every candidate comes with a prediction, the chosen one first.
  auto candidates = allreduceCandidates(twoByTwo, links, big, 4, automatic);
  ASSERT_GE(candidates.size(), 4u);
  for (size_t i = 1; i < candidates.size(); ++i) {
    EXPECT_LE(candidates[0].predicted, candidates[i].predicted);
  }
}

TEST(Plan, WavesFlowThroughTheLinksAsThroughAFlowShop) {
  // No latency and no overheads, so the times are exact: 2 hosts of 2 ranks, B bytes. One wave of
  // W holds the host link for its reduce-scatter and its allgather, B/(2W) each at 100 MB/s; the
  // host stages of the first wave (B/(2W) per rank at 1 GB/s, in and out) are not hidden behind
  // it.
  const LinkCosts links = parseLinks("0:0us:1GB:0us,1:0us:100MB:0us");
  const Topology t = simulated({0, 0, 1, 1});
  const size_t count = 1 << 20;
  const double bytes = 4.0 * count;
  for (int waves : {1, 2, 4, 8}) {
    PlanRequest request{AllreduceAlgorithm::kMultiDim, 1, 1, {}, waves};
    const double want = bytes / 100e6 + bytes / (waves * 1e9);
    EXPECT_NEAR(planAllreduce(t, links, count, 4, request).predicted, want, want * 1e-9)
        << waves << " waves";
  }
  // So the planner takes more waves as the host stages grow (here: the most it may).
  EXPECT_EQ(planAllreduce(t, links, count, 4, PlanRequest{}).waves, 8);
}

TEST(Plan, ARingStepWaitsForItsPredecessorNotForTheRingsSlowestEdge) {
  // A busy host's ranks may answer more slowly than the network. A flat ring's rank waits only
  // for the message of the rank before it: 2(P-1) steps cost what 2(P-1) consecutive edges of
  // the ring cost, here half within the hosts (1 ms) and half across (10 us).
  const LinkCosts links = parseLinks("0:1ms:1000GB:0us,1:10us:1000GB:0us");
  const Topology t = simulated({0, 0, 1, 1});
  const double ring =
      planAllreduce(t, links, 4, 4, PlanRequest{AllreduceAlgorithm::kRing}).predicted;
  EXPECT_NEAR(ring, 2 * 3 * (1e-3 + 10e-6) / 2, 1e-5);
}

// A message costs each side's processor its level's overhead (LogP's o), and a rank's messages
// take turns on it: where nothing else costs anything, a flat ring's 2(P-1) steps cost a rank's
// 2o each, after one lap (P edges, 2o each) has filled the ring; a multidim
// plan's waves send a message a step each, so where the overhead outweighs what they hide the
// planner takes fewer.
TEST(Plan, EveryMessageCostsBothProcessorsTheOverheadOfItsLevel) {
  const Topology t = simulated({0, 0, 1, 1});
  const LinkCosts free = parseLinks("0:0us:1000GB:0us,1:0us:1000GB:0us");
  const LinkCosts costly = parseLinks("0:0us:1000GB:1us,1:0us:1000GB:1us");
  const PlanRequest ring{AllreduceAlgorithm::kRing};
  EXPECT_NEAR(planAllreduce(t, free, 4, 4, ring).predicted, 0, 1e-9);
  EXPECT_NEAR(planAllreduce(t, costly, 4, 4, ring).predicted, 2 * 3 * 2e-6 + 4 * 2e-6, 1e-9);
  // 64 ranks in hosts of 8, 1 MiB: the network's latency is small beside 5 us a message, and the
  // planner sends fewer of them (2 rings of 4 waves without it, 1 of 1 with it).
  const Topology grid = simulated([] {
    std::vector<int> hosts;
    for (int r = 0; r < 64; ++r) hosts.push_back(r / 8);
    return hosts;
  }());
  auto messages = [&](const char* spec) {
    const AllreducePlan plan = planAllreduce(grid, parseLinks(spec), 1 << 18, 4, PlanRequest{});
    EXPECT_EQ(plan.algorithm, AllreduceAlgorithm::kMultiDim) << spec;
    return plan.rings * plan.waves;
  };
  EXPECT_LT(messages("0:1us:20GB:0us,1:2us:12GB:5us"), messages("0:1us:20GB:0us,1:2us:12GB:0us"));
}

TEST(Plan, ReductionsCostWhatTheReduceBandwidthSays) {
  const LinkCosts free = parseLinks("0:0us:1GB:0us,1:0us:100MB:0us");
  const LinkCosts slow = parseLinks("0:0us:1GB:0us,1:0us:100MB:0us,reduce:100MB");
  EXPECT_DOUBLE_EQ(free.reduceBandwidth, 0);
  EXPECT_DOUBLE_EQ(slow.reduceBandwidth, 100e6);
  EXPECT_NE(slow.describe().find("reduce:100MB"), std::string::npos) << slow.describe();
  EXPECT_THROW(parseLinks("reduce:fast"), Error);
  const Topology t = simulated({0, 1});
  const PlanRequest ring{AllreduceAlgorithm::kRing};
  // 2 ranks, 256 KiB: one step each way, of one segment; reducing its 128 KiB at 100 MB/s.
  const double a = planAllreduce(t, free, 1 << 16, 4, ring).predicted;
  const double b = planAllreduce(t, slow, 1 << 16, 4, ring).predicted;
  EXPECT_NEAR(b - a, (1 << 17) / 100e6, 1e-6);
}

// The multi-dimensional allreduce over the loopback, from plans for simulated topologies.
void runPlanned(const Topology& t, int colors, int rings, const std::vector<size_t>& counts,
                size_t segmentBytes = 0, int waves = 1) {
  std::unique_ptr<ScopedEnv> env;
  if (segmentBytes > 0) {
    env = std::make_unique<ScopedEnv>(std::initializer_list<std::pair<std::string, std::string>>{
        {"TORCH_DDL_SEGMENT_BYTES", std::to_string(segmentBytes)}});
  }
  runRanks(t.size, [&](Communicator& comm) {
    for (DataType type : {DataType::kFloat32, DataType::kInt64, DataType::kBFloat16}) {
      for (ReduceOp op : kAllOps) {
        if (!checkReduceOp(type, op).empty()) continue;
        for (size_t count : counts) {
          const size_t es = elementSize(type);
          std::vector<char> buf(count * es + 1);
          for (size_t i = 0; i < count; ++i) {
            storeValue(type, buf.data(), i, inputValue(type, op, comm.rank(), i));
          }
          CallOptions options;
          options.plan =
              std::make_shared<const AllreducePlan>(planMultiDim(t, count, es, colors, rings));
          check(comm.allreduce(buf.data(), count, type, op, options));
          for (size_t i = 0; i < count; ++i) {
            double want = expectedValue(type, op, comm.size(), i);
            double got = loadValue(type, buf.data(), i);
            if (std::fabs(got - want) > tolerance(type, op, want)) {
              std::ostringstream s;
              s << t.describe() << " colors=" << colors << " rings=" << rings << " rank "
                << comm.rank() << " " << dataTypeName(type) << " " << reduceOpName(op) << " count "
                << count << " element " << i << ": got " << got << ", want " << want;
              throw Error(s.str());
            }
          }
        }
      }
    }
  });
}

TEST(MultiDim, EveryShapeMatchesTheExpectedSums) {
  for (const Shape& shape : shapes()) {
    Topology t = simulated(shape.hostOf, shape.rackOf);
    for (int colors = 1; colors <= 2; ++colors) {
      for (int rings = 1; rings <= 2; ++rings) {
        runPlanned(t, colors, rings, {0, 1, 13, 1009}, 0, colors == rings ? 3 : 1);
      }
    }
  }
}

TEST(MultiDim, LargeAndManySegments) {
  runPlanned(simulated({0, 0, 1, 1}), 2, 1, {100003}, 4096);
  runPlanned(simulated({0, 0, 1, 1}), 1, 1, {100003}, 4096, 8);
  runPlanned(simulated({0, 0, 0, 1, 1, 2}), 1, 2, {65537}, 1000);
  runPlanned(simulated({0, 0, 1, 1, 2, 2, 3, 3}, {0, 0, 1, 1}), 3, 1, {200003});
}

TEST(Leaders, EveryShapeMatchesTheExpectedSums) {
  for (const Shape& shape : shapes()) {
    Topology t = simulated(shape.hostOf, shape.rackOf);
    runRanks(t.size, [&](Communicator& comm) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{1009}}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
          std::vector<char> buf(count * 4 + 1);
          for (size_t i = 0; i < count; ++i) {
            storeValue(DataType::kFloat32, buf.data(), i,
                       inputValue(DataType::kFloat32, op, comm.rank(), i));
          }
          CallOptions options;
          options.plan = std::make_shared<const AllreducePlan>(planAllreduce(
              t, defaultLinks(), count, 4, PlanRequest{AllreduceAlgorithm::kLeaders}));
          check(comm.allreduce(buf.data(), count, DataType::kFloat32, op, options));
          for (size_t i = 0; i < count; ++i) {
            double want = expectedValue(DataType::kFloat32, op, comm.size(), i);
            double got = loadValue(DataType::kFloat32, buf.data(), i);
            if (std::fabs(got - want) > tolerance(DataType::kFloat32, op, want)) {
              throw Error(t.describe() + " leaders: element " + std::to_string(i));
            }
          }
        }
      }
    });
  }
}

// The link probe over the loopback: every host's ring measures the host level, the first ring
// of each level across hosts the level above; the figures reach every rank over the creation
// tree (the probe has no store to use); links the user gave, or a probe turned off, are left
// alone.
TEST(LinkProbe, EveryRankPlansWithTheFiguresOneRingMeasured) {
  // Uneven: a host of one rank takes no part; then hosts in two racks (three levels).
  const std::vector<Topology> machines = {simulated({0, 0, 1, 1, 1, 2}),
                                          simulated({0, 0, 1, 1, 2, 2, 3, 3, 3}, {0, 0, 1, 1})};
  for (const Topology& t : machines) {
    const int levels = static_cast<int>(gridOf(t).dims.size());
    EXPECT_EQ(levels, t.size == 9 ? 3 : 2) << t.describe();
    for (const char* given : {"", "1:50us:117MB", "0:3us:7GB"}) {
      for (const char* probe : {"1", "0"}) {
        ScopedEnv env({{"TORCH_DDL_PROBE_LINKS", probe}});
        std::vector<LinkCosts> got(t.size);
        runRanksOn(t, [&](Communicator& comm) {
          LinkCosts links = parseLinks(given);
          check(comm.probe(t, &links));
          got[comm.rank()] = links;
        });
        for (int d = 0; d < levels; ++d) {
          const LinkCost& cost = got[0].at(d);
          const bool named = std::string(given).rfind(std::to_string(d) + ":", 0) == 0;
          if (std::string(probe) == "1" && !named) {
            EXPECT_EQ(cost.origin, "probed") << t.describe() << " dimension " << d;
            EXPECT_GT(cost.latency, 0) << t.describe() << " dimension " << d;
            EXPECT_GT(cost.bandwidth, 0) << t.describe() << " dimension " << d;
          } else {
            EXPECT_EQ(cost.origin, named ? "TORCH_DDL_LINKS" : "default") << "dimension " << d;
            EXPECT_EQ(cost.bandwidth, parseLinks(given).at(d).bandwidth) << "dimension " << d;
          }
        }
        for (int r = 1; r < t.size; ++r) {
          EXPECT_EQ(got[r].describe(), got[0].describe()) << t.describe() << " rank " << r;
        }
      }
    }
  }
}

TEST(MultiDim, AGivenPlanForAnotherSizeIsRefused) {
  runRanks(2, [](Communicator& comm) {
    std::vector<float> data(10);
    CallOptions options;
    options.plan =
        std::make_shared<const AllreducePlan>(planMultiDim(simulated({0, 1}), 11, 4, 1, 1));
    EXPECT_THROW(comm.allreduce(data.data(), 10, DataType::kFloat32, ReduceOp::kSum, options),
                 Error);
  });
}

}  // namespace
}  // namespace ddl::test

namespace ddl::test {
namespace {

TEST(BlockPlan, RegularGridsGoLevelByLevelAndCheckOut) {
  for (const Shape& shape : shapes()) {
    Topology t = simulated(shape.hostOf, shape.rackOf);
    for (bool reduceScatter : {false, true}) {
      BlockPlan plan = planBlockStages(t, reduceScatter);
      const std::vector<BlockStage>& stages = plan.stages;
      SCOPED_TRACE(t.describe());
      if (t.hosts() < 2 || !gridOf(t).regular) {
        EXPECT_TRUE(stages.empty());
        continue;
      }
      ASSERT_FALSE(stages.empty());
      EXPECT_NO_THROW(checkBlockStages(plan, t.size, reduceScatter));
      EXPECT_NO_THROW(replayBlockStages(plan, t.size, reduceScatter));
      // Reduce-scatter reduces within the host first; allgather crosses hosts first.
      if (gridOf(t).dims[0] > 1) {
        EXPECT_EQ(reduceScatter ? stages.front().dimension : stages.back().dimension, 0);
      }
    }
  }
  BlockPlan bad = planBlockStages(simulated({0, 0, 1, 1}), false);
  std::swap(bad.stages[0], bad.stages[1]);  // spreading in the host before anything arrived
  EXPECT_THROW(checkBlockStages(bad, 4, false), Error);
  EXPECT_THROW(replayBlockStages(bad, 4, false), Error);
}

// Each way of breaking a plan of 2 racks of 3 hosts of 2 ranks that the check refuses; where the
// rings' own data goes wrong, the replay fails too.
TEST(BlockPlan, TheCheckRefusesEveryBrokenPlanTheReplayRefuses) {
  std::vector<int> hostOf, rackOf = {0, 0, 0, 1, 1, 1};
  for (int r = 0; r < 12; ++r) hostOf.push_back(r / 2);
  const Topology t = simulated(hostOf, rackOf);
  for (bool reduceScatter : {false, true}) {
    const BlockPlan good = planBlockStages(t, reduceScatter);
    ASSERT_EQ(good.stages.size(), 3u);
    struct Break {
      const char* what;
      std::function<void(BlockPlan&)> apply;
      bool dataGoesWrong;
    };
    const std::vector<Break> breaks = {
        {"stages swapped", [](BlockPlan& p) { std::swap(p.stages[0], p.stages[2]); }, true},
        {"a stage left out", [](BlockPlan& p) { p.stages.pop_back(); }, true},
        {"two ranks of different rings swapped",
         [](BlockPlan& p) {
           BlockStage& s = p.stages[1];
           std::swap(s.rings[0][0], s.rings[1][0]);
           std::swap(s.ringOf[s.rings[0][0]], s.ringOf[s.rings[1][0]]);
         },
         true},
        {"a ring's member twice",
         [](BlockPlan& p) { p.stages[0].rings[0][1] = p.stages[0].rings[0][0]; }, true},
        {"combinations of one dimension too few",
         [](BlockPlan& p) {
           for (BlockStage& s : p.stages) {
             if (s.combinations > 1) {
               s.combinations = 1;
               break;
             }
           }
         },
         true},
        {"two ranks at one place", [](BlockPlan& p) { p.coords[1] = p.coords[0]; }, true},
        {"tag steps overlapping", [](BlockPlan& p) { p.stages[1].firstStep = 0; }, false},
    };
    for (const Break& b : breaks) {
      SCOPED_TRACE(std::string(b.what) + (reduceScatter ? ", reduce-scatter" : ", allgather"));
      BlockPlan plan = good;
      b.apply(plan);
      EXPECT_THROW(checkBlockStages(plan, t.size, reduceScatter), Error);
      if (b.dataGoesWrong) {
        EXPECT_ANY_THROW(replayBlockStages(plan, t.size, reduceScatter));
      }
    }
  }
}

TEST(BlockPlan, BroadcastEntersEachHostOnce) {
  for (const Shape& shape : shapes()) {
    Topology t = simulated(shape.hostOf, shape.rackOf);
    for (int root = 0; root < t.size; ++root) {
      int crossings = 0, edges = 0;
      std::vector<int> parentOf(t.size, -2);
      for (int r = 0; r < t.size; ++r) {
        TreePlace place = broadcastTreePlace(t, root, r, true);
        parentOf[r] = place.parent;
        for (int c : place.children) {
          ++edges;
          crossings += t.levels[0].blockOf(c) != t.levels[0].blockOf(r);
          EXPECT_EQ(broadcastTreePlace(t, root, c, true).parent, r);
        }
      }
      EXPECT_EQ(edges, t.size - 1) << t.describe() << " root " << root;
      EXPECT_EQ(crossings, t.hosts() - 1) << t.describe() << " root " << root;
      for (int r = 0; r < t.size; ++r) {  // every rank reaches the root
        int at = r, hops = 0;
        while (at != root && hops++ <= t.size) at = parentOf[at];
        EXPECT_EQ(at, root) << t.describe() << " rank " << r;
      }
    }
  }
}

// The tree written out from every host's member list: leaders (the root, then each other host's
// lowest rank) first, then each host from its leader round the host.
TEST(BlockPlan, BroadcastTreeIsTheOneTheMemberListsGive) {
  auto binomialOf = [](const std::vector<int>& ranks, int rank) {
    TreePlace place;
    const int n = static_cast<int>(ranks.size());
    const int v = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
    int mask = 1;
    for (; mask < n; mask <<= 1) {
      if (v & mask) {
        place.parent = ranks[v - mask];
        break;
      }
    }
    for (int m = mask >> 1; m > 0; m >>= 1) {
      if (v + m < n) place.children.push_back(ranks[v + m]);
    }
    return place;
  };
  for (const Shape& shape : shapes()) {
    Topology t = simulated(shape.hostOf, shape.rackOf);
    const std::vector<std::vector<int>> hosts = t.members(0);
    for (int root = 0; root < t.size; ++root) {
      const int rootHost = t.levels[0].blockOf(root);
      std::vector<int> leaders = {root};
      for (int h = 0; h < t.hosts(); ++h) {
        if (h != rootHost) leaders.push_back(hosts[h][0]);
      }
      for (int r = 0; r < t.size; ++r) {
        const int h = t.levels[0].blockOf(r);
        std::vector<int> local = hosts[h];
        const int leader = h == rootHost ? root : local[0];
        std::rotate(local.begin(), std::find(local.begin(), local.end(), leader), local.end());
        TreePlace want;
        if (r == leader && t.hosts() > 1) want = binomialOf(leaders, r);
        const TreePlace inside = binomialOf(local, r);
        if (r != leader) want.parent = inside.parent;
        want.children.insert(want.children.end(), inside.children.begin(), inside.children.end());
        if (t.hosts() < 2) {
          std::vector<int> all;
          for (int i = 0; i < t.size; ++i) all.push_back((root + i) % t.size);
          want = binomialOf(all, r);
        }
        const TreePlace got = broadcastTreePlace(t, root, r, true);
        EXPECT_EQ(got.parent, want.parent) << t.describe() << " root " << root << " rank " << r;
        EXPECT_EQ(got.children, want.children) << t.describe() << " root " << root << " rank " << r;
      }
    }
  }
}

// Across hosts too, every rank ends with the same bits where the order of operands matters
// (the leaders' recursive doubling once put each partner's own first).
TEST(Hierarchy, EveryRankEndsWithTheSameBitsWhereTheOrderOfOperandsMatters) {
  for (const char* algo : {"auto", "multidim", "leaders"}) {
    ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", algo}});
    for (const Shape& shape : shapes()) {
      Topology t = simulated(shape.hostOf, shape.rackOf);
      if (t.hosts() < 2) continue;
      for (size_t count : {size_t{1}, size_t{1031}}) {
        std::vector<std::vector<float>> results(t.size);
        runRanksOn(t, [&](Communicator& comm) { reduceOrderSensitive(comm, count, results); });
        EXPECT_EQ(firstDifference(results), "") << algo << ", " << t.describe() << ", " << count;
      }
    }
  }
}

// Every collective with a topology of its own, through the communicator's own choices.
TEST(Hierarchy, CollectivesOnSimulatedTopologiesMatchTheExpectedValues) {
  for (const Shape& shape : shapes()) {
    Topology t = simulated(shape.hostOf, shape.rackOf);
    SCOPED_TRACE(t.describe());
    runRanksOn(t, [&](Communicator& comm) {
      const int n = comm.size(), me = comm.rank();
      for (size_t count : {size_t{0}, size_t{1}, size_t{1009}, size_t{300007}}) {
        // allreduce (auto: multidim across hosts for the larger sizes)
        std::vector<double> x(count);
        for (size_t i = 0; i < count; ++i) x[i] = me + 0.5 * static_cast<double>(i % 7);
        check(comm.allreduce(x.data(), count, DataType::kFloat64, ReduceOp::kSum));
        for (size_t i = 0; i < count; ++i) {
          double want = n * (n - 1) / 2.0 + n * 0.5 * static_cast<double>(i % 7);
          if (x[i] != want) throw Error("allreduce element " + std::to_string(i));
        }
        // reduce-scatter: block b of rank r holds r * 1000 + b; block me ends as the sum.
        std::vector<int64_t> blocks(count * n);
        for (int b = 0; b < n; ++b) {
          for (size_t i = 0; i < count; ++i) blocks[b * count + i] = me * 1000 + b + int64_t(i);
        }
        check(comm.reduceScatter(blocks.data(), count, DataType::kInt64, ReduceOp::kSum));
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 1000LL * n * (n - 1) / 2 + n * (me + int64_t(i));
          if (blocks[me * count + i] != want)
            throw Error("reduce_scatter element " + std::to_string(i));
        }
        // allgather
        std::vector<int32_t> mine(count), all(count * n);
        for (size_t i = 0; i < count; ++i) mine[i] = me * 7919 + int32_t(i);
        check(comm.allgather(mine.data(), all.data(), count, DataType::kInt32));
        for (int b = 0; b < n; ++b) {
          for (size_t i = 0; i < count; ++i) {
            if (all[b * count + i] != b * 7919 + int32_t(i))
              throw Error("allgather block " + std::to_string(b));
          }
        }
        // broadcast from every root
        for (int root = 0; root < n; ++root) {
          std::vector<float> y(count, me == root ? 3.0f + root : -1.0f);
          check(comm.broadcast(y.data(), count, DataType::kFloat32, root));
          for (float v : y) {
            if (v != 3.0f + root) throw Error("broadcast from " + std::to_string(root));
          }
        }
      }
    });
  }
}

TEST(Plan, OneHostStagesWhereTheDirectPathIsAskedForAndNotTaken) {
  // TORCH_DDL_DIRECT_MIN_BYTES below TORCH_DDL_STAGED_BYTES (as TORCH_DDL_SHARED_ALLOCATOR=1
  // sets it): a tensor that is not shared after all is staged, not sent round the ring.
  const LinkCosts links = parseLinks("0:2us:5GB");
  const Topology one = Topology::singleHost(3);
  PlanRequest request;
  request.directMinBytes = 64 << 10;
  request.stagedBytes = 512 << 10;
  const AllreducePlan medium = planAllreduce(one, links, (128 << 10) / 4, 4, request);
  EXPECT_EQ(medium.algorithm, AllreduceAlgorithm::kShared);
  EXPECT_TRUE(medium.asksDirect);
  EXPECT_TRUE(medium.staged);
  const AllreducePlan large = planAllreduce(one, links, (1 << 20) / 4, 4, request);
  EXPECT_TRUE(large.asksDirect);
  EXPECT_FALSE(large.staged);
  const AllreducePlan small = planAllreduce(one, links, (32 << 10) / 4, 4, request);
  EXPECT_FALSE(small.asksDirect);
  EXPECT_TRUE(small.staged);
}

}  // namespace
}  // namespace ddl::test
