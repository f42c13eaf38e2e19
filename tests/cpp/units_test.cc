// Pure pieces of the core: reduction kernels, ring plans, tag layout, configuration, a group's
// directory of addresses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "../../csrc/core/base/config.h"
#include "../../csrc/core/base/rank_set.h"
#include "../../csrc/core/base/tag.h"
#include "../../csrc/core/reduce/reduce.h"
#include "../../csrc/core/runtime/peer_directory.h"
#include "../../csrc/core/runtime/stats.h"
#include "../../csrc/core/runtime/trace.h"
#include "../../csrc/core/topology/ring_plan.h"
#include "../../csrc/core/transport/tag_matching.h"
#include "../../csrc/core/transport/tag_table.h"
#include "harness.h"
#include "values.h"

namespace ddl::test {
namespace {

TEST(Reduce, EveryKernelMatchesScalarArithmetic) {
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (!checkReduceOp(t, op).empty()) continue;
      for (size_t count : {size_t{0}, size_t{1}, size_t{31}, size_t{1009}}) {
        std::vector<char> a(count * elementSize(t) + 1), b(a.size());
        for (size_t i = 0; i < count; ++i) {
          storeValue(t, a.data(), i, inputValue(t, op, 0, i));
          storeValue(t, b.data(), i, inputValue(t, op, 1, i));
        }
        reduceInto(t, op, a.data(), b.data(), count);
        for (size_t i = 0; i < count; ++i) {
          double want = expectedValue(t, op == ReduceOp::kAvg ? ReduceOp::kSum : op, 2, i);
          ASSERT_EQ(loadValue(t, a.data(), i), want)
              << dataTypeName(t) << " " << reduceOpName(op) << " element " << i;
        }
      }
    }
  }
}

TEST(Reduce, BFloat16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between two bfloat16 values: ties go to the even mantissa (1.0).
  std::vector<char> a(2), b(2);
  storeValue(DataType::kBFloat16, a.data(), 0, 1.0);
  storeValue(DataType::kBFloat16, b.data(), 0, 1.0 / 256);
  reduceInto(DataType::kBFloat16, ReduceOp::kSum, a.data(), b.data(), 1);
  EXPECT_EQ(loadValue(DataType::kBFloat16, a.data(), 0), 1.0);
  // 1 + 3*2^-8 rounds up to 1 + 2^-6.
  storeValue(DataType::kBFloat16, b.data(), 0, 3.0 / 256);
  reduceInto(DataType::kBFloat16, ReduceOp::kSum, a.data(), b.data(), 1);
  EXPECT_EQ(loadValue(DataType::kBFloat16, a.data(), 0), 1.0 + 1.0 / 64);
}

TEST(Reduce, AverageOfIntegersTruncatesTowardZero) {
  int32_t v[3] = {7, -7, 8};
  finishAverage(DataType::kInt32, v, 3, 2);
  EXPECT_EQ(v[0], 3);
  EXPECT_EQ(v[1], -3);
  EXPECT_EQ(v[2], 4);
}

TEST(ReduceOps, MeaninglessPairsAreNamed) {
  EXPECT_NE(checkReduceOp(DataType::kFloat32, ReduceOp::kBand).find("BAND"), std::string::npos);
  EXPECT_NE(checkReduceOp(DataType::kBool, ReduceOp::kAvg).find("bool"), std::string::npos);
  EXPECT_EQ(checkReduceOp(DataType::kBool, ReduceOp::kBxor), "");
  EXPECT_EQ(checkReduceOp(DataType::kInt8, ReduceOp::kAvg), "");
}

TEST(RingPlan, RingsArePermutationsThatClose) {
  for (int size = 1; size <= 12; ++size) {
    for (const RingPlan& ring : alternatingRings(size, 4)) {
      ASSERT_EQ(ring.length(), size);
      std::vector<int> seen(size, 0);
      for (int p = 0; p < size; ++p) ++seen[ring.order[(p + 1) % size]];
      for (int s : seen) EXPECT_EQ(s, 1);
    }
  }
  EXPECT_THROW(checkRing(RingPlan{{0, 1, 1}}, 3, true), Error);
  EXPECT_THROW(checkRing(RingPlan{{0, 3}}, 3, false), Error);
  EXPECT_THROW(checkRing(RingPlan{{0, 2}}, 3, true), Error);
  EXPECT_NO_THROW(checkRing(RingPlan{{2, 0}}, 3, false));
}

TEST(RingPlan, SplitEvenCoversEverythingOnce) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000003}}) {
    for (size_t parts : {size_t{1}, size_t{3}, size_t{12}}) {
      auto ranges = splitEven(count, parts);
      size_t next = 0, lo = count, hi = 0;
      for (const Range& r : ranges) {
        EXPECT_EQ(r.offset, next);
        next += r.length;
        lo = std::min(lo, r.length);
        hi = std::max(hi, r.length);
      }
      EXPECT_EQ(next, count);
      EXPECT_LE(hi - lo, 1u);
    }
  }
}

TEST(Tag, CollectivePhasesAreEveryPhaseButThePointToPointOnes) {
  for (uint32_t phase = 0; phase < (1u << tag::kPhaseBits); ++phase) {
    const uint64_t t = tag::make(5, 9, tag::slot(phase, 3), 1);
    int matches = 0;
    for (const tag::PhaseRange& r : tag::kCollectivePhases) {
      const uint64_t want = tag::make(5, 9, tag::slot(r.first, 0), 0);
      const uint64_t mask = tag::kGroupAndSequence | r.mask;
      matches += (t & mask) == (want & mask);
    }
    EXPECT_EQ(matches, phase < tag::kPointToPointPhase ? 1 : 0) << "phase " << phase;
  }
}

TEST(Tag, FieldsDoNotOverlap) {
  uint64_t t = tag::make(4095, 65535, tag::slot(63, 16383), 65535);
  EXPECT_EQ(t, ~uint64_t{0});
  EXPECT_EQ(tag::make(1, 0, 0, 0), uint64_t{1} << 52);
  EXPECT_EQ(tag::source(tag::make(3, 4, 5, 77), 3), 77u);
  EXPECT_EQ(tag::make(3, 4, 5, 77) & tag::kAnySource, tag::make(3, 4, 5, 0));
  // Wider values wrap within their field instead of spilling into the next one.
  EXPECT_EQ(tag::make(4096, 0, 0, 0), 0u);
}

// A shrink's members, held as the ranks left out: each place's rank and each rank's place agree
// with the list written out, at the ends, between runs of ranks left out and past them.
TEST(RankSet, AllButTheRanksLeftOutAgreesWithTheListWrittenOut) {
  for (const std::vector<int>& out :
       std::vector<std::vector<int>>{{}, {0}, {9}, {0, 1, 2}, {3, 4, 7}, {1, 3, 5, 7, 9}}) {
    const RankSet set = RankSet::allBut(10, out);
    std::vector<int> listed;
    for (int r = 0; r < 10; ++r) {
      if (std::find(out.begin(), out.end(), r) == out.end()) listed.push_back(r);
    }
    ASSERT_EQ(set.size(), static_cast<int>(listed.size()));
    EXPECT_EQ(set.list(), listed);
    for (int i = 0; i < set.size(); ++i) {
      EXPECT_EQ(set.at(i), listed[i]);
      EXPECT_EQ(set.indexOf(listed[i]), i);
    }
    for (int r : out) EXPECT_FALSE(set.contains(r));
    EXPECT_EQ(set.indexOf(-1), -1);
    EXPECT_EQ(set.indexOf(10), -1);
  }
  const RankSet given = RankSet::listed({5, 3, 9});
  EXPECT_EQ(given.at(1), 3);
  EXPECT_EQ(given.indexOf(9), 2);
  EXPECT_EQ(given.indexOf(4), -1);
  const RankSet ascending = RankSet::listed({2, 4, 8});
  EXPECT_EQ(ascending.indexOf(8), 2);
  EXPECT_EQ(ascending.indexOf(5), -1);
  EXPECT_EQ(ascending.indexOf(9), -1);
}

TEST(PeerDirectory, KnowsWhatItLearnedAndLooksUpTheRestOnce) {
  int lookups = 0;
  auto directory = std::make_shared<PeerDirectory>([&lookups](int rank) {
    ++lookups;
    return rank == 7 ? std::string() : "at" + std::to_string(rank);
  });
  directory->learn(1, "one");
  EXPECT_EQ(directory->known(1), "one");
  EXPECT_EQ(directory->rankAt("one"), 1);
  EXPECT_EQ(directory->known(5), "");  // known() never looks up
  EXPECT_EQ(directory->address(5), "at5");
  EXPECT_EQ(directory->address(5), "at5");
  EXPECT_EQ(lookups, 1);  // kept
  EXPECT_EQ(directory->rankAt("at5"), 5);
  EXPECT_EQ(directory->address(7), "");  // nowhere to be had
  EXPECT_EQ(directory->rankAt("nowhere"), -1);
  directory->learn(1, "moved");
  EXPECT_EQ(directory->rankAt("one"), -1);
  EXPECT_EQ(directory->rankAt("moved"), 1);
  EXPECT_EQ(directory->entries(),
            (std::vector<std::pair<int, std::string>>{{1, "moved"}, {5, "at5"}}));
  // A view of some ranks alone knows and looks up those.
  auto members = PeerDirectory::only(directory, RankSet::listed({5, 3}));
  EXPECT_EQ(members->known(5), "at5");
  EXPECT_EQ(members->known(1), "");
  EXPECT_EQ(members->address(1), "");
  EXPECT_EQ(members->address(3), "at3");
  EXPECT_EQ(directory->known(3), "at3");  // looked up through the parent, which keeps it
  // A group of ranks 5, 3, 9 of this one: its rank i is members[i] here.
  auto derived = PeerDirectory::renumbered(directory, RankSet::listed({5, 3, 9}));
  EXPECT_EQ(derived->known(0), "at5");
  EXPECT_EQ(derived->rankAt("at3"), 1);
  EXPECT_EQ(derived->address(2), "at9");
  EXPECT_EQ(derived->address(3), "");
  EXPECT_EQ(PeerDirectory::of({"a", "", "c"})->entries(),
            (std::vector<std::pair<int, std::string>>{{0, "a"}, {2, "c"}}));
}

// A store that fails (its server gone as the job ends: torch's DistNetworkError) fails a lookup
// with a ddl::Error naming the rank, the one error its callers take: the progress thread's news
// flood, which passes over a peer it cannot reach, took the store's own exception for none and
// ended the process (16 emulated hosts of 2, make scale-real, at faea519).
TEST(PeerDirectory, AStoreThatFailsFailsTheLookupNamingTheRank) {
  auto directory = std::make_shared<PeerDirectory>(
      [](int) -> std::string { throw std::runtime_error("Failed to recv\nframe #0: ..."); },
      [](const std::vector<int>&) -> std::vector<std::string> {
        throw std::runtime_error("Connection reset");
      });
  try {
    directory->address(9);
    ADD_FAILURE() << "a failed lookup returned";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "ddl: the address of rank 9 could not be looked up in the store: Failed to recv");
  }
  EXPECT_THROW(directory->prefetch({3, 4}), Error);
  EXPECT_EQ(directory->known(9), "");
}

TEST(Config, MalformedValuesNameTheVariable) {
  ScopedEnv ok({{"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  EXPECT_EQ(config().segmentBytes, 4096u);
  setenv("TORCH_DDL_PIPELINE_DEPTH", "lots", 1);
  try {
    reloadConfig();
    FAIL() << "accepted a malformed value";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TORCH_DDL_PIPELINE_DEPTH=lots"), std::string::npos);
  }
  unsetenv("TORCH_DDL_PIPELINE_DEPTH");
  setenv("TORCH_DDL_ALLGATHER_ALGO", "tree", 1);
  try {
    reloadConfig();
    FAIL() << "accepted an allgather algorithm it does not have";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TORCH_DDL_ALLGATHER_ALGO=tree is not one of auto, ring, "
                                         "bruck"),
              std::string::npos)
        << e.what();
  }
  unsetenv("TORCH_DDL_ALLGATHER_ALGO");
  setenv("TORCH_DDL_DEVICE_STAGE_BYTES", "1M", 1);
  try {
    reloadConfig();
    FAIL() << "accepted a size with a unit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TORCH_DDL_DEVICE_STAGE_BYTES=1M is not an integer"),
              std::string::npos)
        << e.what();
  }
  setenv("TORCH_DDL_DEVICE_STAGE_BYTES", "65536", 1);
  reloadConfig();
  EXPECT_EQ(config().deviceStageBytes, 65536u);
  unsetenv("TORCH_DDL_DEVICE_STAGE_BYTES");
  reloadConfig();
  EXPECT_EQ(config().deviceStageBytes, 0u);  // off until measured on a GPU
  // The shared allocator serves what the direct path is asked for: from 64 KiB unless set.
  EXPECT_FALSE(config().sharedAllocator);
  EXPECT_EQ(config().directMinBytes, 1u << 20);
  setenv("TORCH_DDL_SHARED_ALLOCATOR", "1", 1);
  reloadConfig();
  EXPECT_TRUE(config().sharedAllocator);
  EXPECT_EQ(config().directMinBytes, 65536u);
  setenv("TORCH_DDL_DIRECT_MIN_BYTES", "2097152", 1);
  reloadConfig();
  EXPECT_EQ(config().directMinBytes, 2097152u);
  unsetenv("TORCH_DDL_DIRECT_MIN_BYTES");
  setenv("TORCH_DDL_SHARED_ALLOCATOR", "on", 1);
  try {
    reloadConfig();
    FAIL() << "accepted a flag that is not 0 or 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TORCH_DDL_SHARED_ALLOCATOR=on is not 0 or 1"),
              std::string::npos)
        << e.what();
  }
  unsetenv("TORCH_DDL_SHARED_ALLOCATOR");
  reloadConfig();
  for (const ConfigEntry& e : configTable()) {
    EXPECT_EQ(std::string(e.name).rfind("TORCH_DDL_", 0), 0u);
    EXPECT_GT(std::strlen(e.description), 10u);
  }
}

TEST(OpStats, CountsPerCollectiveAndSizeClassWithATimeHistogram) {
  OpStats stats;
  const TimePoint t0{};
  stats.ended(0, "group 0", 1, 4, "all_reduce", 7, 1024, 2e-5, StatusKind::kOk, t0);
  stats.ended(0, "group 0", 1, 4, "all_reduce", 8, 1025, 0.5, StatusKind::kOk, t0);
  stats.ended(0, "group 0", 1, 4, "all_reduce", 9, 1025, 20.0, StatusKind::kTimeout, t0);
  stats.ended(1, "group 1", 0, 2, "broadcast", 0, 0, 0, StatusKind::kOk, t0);
  const auto counts = stats.counts();
  const OpStats::Counts& small = counts.at({"all_reduce", 0});  // up to 1 KiB
  EXPECT_EQ(small.ops, 1u);
  EXPECT_EQ(small.bytes, 1024u);
  EXPECT_EQ(small.buckets[1], 1u);  // 20 us: above 10 us, up to 30 us
  const OpStats::Counts& medium = counts.at({"all_reduce", 1});
  EXPECT_EQ(medium.ops, 2u);
  EXPECT_EQ(medium.failed, 1u);
  EXPECT_EQ(medium.buckets[10], 1u);                       // 0.5 s: above 0.3 s, up to 1 s
  EXPECT_EQ(medium.buckets[OpStats::kBounds.size()], 1u);  // 20 s: the last bucket
  EXPECT_EQ(stats.failures()[static_cast<int>(StatusKind::kTimeout)], 1u);
  // The last completed op of each group (a failed one is not completed).
  const auto groups = stats.groups();
  EXPECT_EQ(groups.at(0).lastSequence, 8);
  EXPECT_EQ(groups.at(0).completed, 2u);
  EXPECT_EQ(groups.at(0).failed, 1u);
  EXPECT_EQ(groups.at(1).lastName, "broadcast");
  // A new group under a used id starts again.
  stats.ended(1, "group 1 again", 0, 3, "barrier", 0, 0, 0, StatusKind::kOk, t0);
  EXPECT_EQ(stats.groups().at(1).completed, 1u);
  EXPECT_EQ(stats.groups().at(1).size, 3);
  const std::string json = stats.json(t0);
  EXPECT_NE(json.find("\"size_class\": \"le64KiB\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"timeout\": 1"), std::string::npos) << json;
}

TEST(OpStats, JsonStringsAreEscaped) {
  EXPECT_EQ(jsonString("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
}

TEST(FlightRecorder, KeepsTheLastEntriesInOrderAtTheTimesItIsGiven) {
  FlightRecorder recorder(3, "");
  recorder.setWallOffset(std::chrono::seconds(1000));
  const TimePoint zero{};
  auto at = [&](int us) { return zero + std::chrono::microseconds(us); };
  std::vector<uint64_t> records;
  for (uint32_t s = 0; s < 5; ++s) {
    records.push_back(recorder.created(7, s, "all_reduce", CallPrint{}, false, -1,
                                       std::chrono::milliseconds(10), at(10 * s)));
  }
  recorder.started(records[0], at(100));  // no longer kept: nothing happens
  recorder.ended(records[0], at(101), "gone", "");
  recorder.started(records[3], at(200));
  recorder.ended(records[3], at(300), "", "");
  recorder.ended(records[4], at(400), "timed out", "rank 1");
  recorder.created(7, 5, "broadcast", CallPrint{}, false, -1, std::chrono::milliseconds(10),
                   at(500));  // takes the place of sequence 2's entry
  const std::vector<TraceEntry> kept = recorder.entries();
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].sequence, 3u);
  EXPECT_EQ(kept[1].sequence, 4u);
  EXPECT_EQ(kept[2].sequence, 5u);
  EXPECT_STREQ(kept[2].name, "broadcast");
  const int64_t offset = int64_t{1000} * 1000 * 1000 * 1000;
  EXPECT_EQ(kept[0].createdNs, offset + 30'000);
  EXPECT_EQ(kept[0].startedNs, offset + 200'000);
  EXPECT_EQ(kept[0].endedNs, offset + 300'000);
  EXPECT_EQ(kept[0].state, TraceEntry::State::kCompleted);
  EXPECT_EQ(kept[1].state, TraceEntry::State::kFailed);
  EXPECT_EQ(kept[1].startedNs, kept[1].endedNs);  // ended before it started
  EXPECT_EQ(kept[1].error, "timed out");
  EXPECT_EQ(kept[1].awaited, "rank 1");
  EXPECT_EQ(kept[2].state, TraceEntry::State::kScheduled);
  EXPECT_TRUE(kept[2].error.empty());  // what the entry held before is gone
  EXPECT_EQ(kept[2].startedNs, 0);
  EXPECT_EQ(FlightRecorder(0, "").created(1, 0, "barrier", CallPrint{}, false, -1,
                                          std::chrono::milliseconds(1), at(0)),
            0u);
}

}  // namespace
}  // namespace ddl::test

// The tag table against std::map over random insertions, lookups and erasures of keys that
// collide in their low bits (as tags do: they differ in the group, sequence and slot fields),
// through growth and the erasures' backward shifts.
TEST(TagTable, AgreesWithAMapThroughGrowthAndErasures) {
  ddl::TagTable<int> table;
  std::map<uint64_t, int> reference;
  uint64_t x = 12345;
  auto next = [&x] { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int i = 0; i < 200000; ++i) {
    const uint64_t key = (next() % 512) << 40 | (next() % 3);
    switch (next() % 3) {
      case 0:
        table[key] = i;
        reference[key] = i;
        break;
      case 1:
        table.erase(key);
        reference.erase(key);
        break;
      default: {
        int* found = table.find(key);
        auto it = reference.find(key);
        ASSERT_EQ(found != nullptr, it != reference.end()) << "step " << i;
        if (found != nullptr) ASSERT_EQ(*found, it->second) << "step " << i;
      }
    }
    ASSERT_EQ(table.size(), reference.size()) << "step " << i;
  }
  for (const auto& [key, value] : reference) {
    const int* found = table.find(key);
    ASSERT_NE(found, nullptr) << key;
    EXPECT_EQ(*found, value) << key;
  }
}

// Receives posted under one tag match arrivals oldest first; one withdrawn from the middle, the
// front or the back of them is skipped, and one not posted (done, or never posted) is not
// found.
TEST(TagMatcher, ReceivesOfOneTagMatchInOrderAndAWithdrawnOneIsSkipped) {
  for (int withdrawn = 0; withdrawn < 4; ++withdrawn) {
    ddl::TagMatcher matcher;
    const uint64_t tag = ddl::tag::make(3, 7, 1, 2);
    std::vector<ddl::Request> reqs(4);
    std::vector<int> buffers(4, -1);
    for (int i = 0; i < 4; ++i) {
      matcher.recv(tag, ddl::tag::kMatchAll, &buffers[i], sizeof(int), &reqs[i]);
    }
    EXPECT_EQ(matcher.posted(), 4u);
    EXPECT_TRUE(matcher.cancel(&reqs[withdrawn]));
    EXPECT_TRUE(reqs[withdrawn].failed());
    EXPECT_FALSE(matcher.withdraw(&reqs[withdrawn]));
    for (int m = 0; m < 3; ++m) {
      ddl::Delivered message;
      message.tag = tag;
      message.bytes.resize(sizeof(int));
      std::memcpy(message.bytes.data(), &m, sizeof(int));
      message.size = sizeof(int);
      matcher.arrive(std::move(message));
    }
    int expected = 0;
    for (int i = 0; i < 4; ++i) {
      if (i == withdrawn) continue;
      EXPECT_TRUE(reqs[i].done && !reqs[i].failed()) << withdrawn << " " << i;
      EXPECT_EQ(buffers[i], expected++) << withdrawn << " " << i;
      EXPECT_FALSE(matcher.withdraw(&reqs[i]));
    }
    EXPECT_EQ(matcher.posted(), 0u);
    ddl::Request never;
    EXPECT_FALSE(matcher.withdraw(&never));
  }
}
