// A group's state and its calls: closing and timeouts fail ops on every rank, the call checks
// (roots, refusals, leftovers, prints), settings that must agree, and torch 2.14's reconfigure
// from handles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "../../csrc/core/base/tag.h"
#include "../../csrc/core/base/wire.h"
#include "../../csrc/core/runtime/liveness.h"
#include "../../csrc/core/topology/block_plan.h"
#include "../../csrc/core/topology/topology.h"
#include "harness.h"
#include "values.h"

namespace ddl::test {
namespace {

// Creates a group of engines over the loopback, engine r with settings[r]; each rank's creation
// error ("" where it was made).
std::vector<std::string> creationErrors(const std::vector<Config>& settings) {
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Engine>> engines;
  for (const Config& c : settings) {
    engines.push_back(std::make_unique<Engine>(fabric.join(), Engine::Drive::kThread,
                                               Clock::steady(), nullptr, &c));
  }
  const int size = static_cast<int>(settings.size());
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::string> errors(settings.size());
  together(size, [&](int r) {
    try {
      auto comm = Communicator::create(*engines[r], store, r, size, std::chrono::seconds(20));
      EXPECT_EQ(allreduceOnes(*comm), size);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  return errors;
}

// Settings that choose what an op runs differ between ranks: every rank's creation fails at once,
// naming each setting, its values and the ranks, instead of their first op timing out with each
// waiting for a message the other never sends. Settings that choose nothing may differ.
TEST(GroupState, RanksWhoseSettingsChooseDifferentPathsAreNotMadeAGroup) {
  std::vector<Config> settings(3, config());
  settings[2].smallBytes = settings[0].smallBytes * 2 + 1;
  settings[2].directMinBytes = kSharedAllocatorDirectMinBytes;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& error : creationErrors(settings)) {
    EXPECT_NE(error.find("the ranks' settings differ"), std::string::npos) << error;
    EXPECT_NE(error.find("TORCH_DDL_SMALL_BYTES is " + std::to_string(settings[2].smallBytes) +
                         " on rank 2 and " + std::to_string(settings[0].smallBytes) + " on rank 0"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("TORCH_DDL_DIRECT_MIN_BYTES is 65536 on rank 2"), std::string::npos)
        << error;
    EXPECT_NE(error.find("TORCH_DDL_SHARED_ALLOCATOR=1 makes it 65536"), std::string::npos)
        << error;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  std::vector<Config> harmless(2, config());
  harmless[1].spinMicros = harmless[0].spinMicros + 7;
  harmless[1].shareTensors = !harmless[0].shareTensors;
  harmless[1].traceEntries = harmless[0].traceEntries + 1;
  for (const std::string& error : creationErrors(harmless)) EXPECT_EQ(error, "");
}

TEST(Config, AgreedSettingsNameWhatDiffers) {
  Config a = config(), b = config();
  EXPECT_TRUE(settingDifferences(agreedSettings(a), agreedSettings(b)).empty());
  b.allreduceAlgorithm = AllreduceAlgorithm::kRing;
  b.topology = "r0:h0\nr1:h1";  // a line break in a value keeps the text one line a setting
  const auto d = settingDifferences(agreedSettings(a), agreedSettings(b));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].name, "TORCH_DDL_ALLREDUCE_ALGO");
  EXPECT_EQ(d[0].theirs, "ring");
  EXPECT_EQ(d[1].name, "TORCH_DDL_TOPOLOGY");
  EXPECT_EQ(d[1].theirs, "r0:h0 r1:h1");
  b.topology = "r0:" + std::string(200, 'h');  // long: its length and digest
  const auto digested = settingDifferences(agreedSettings(a), agreedSettings(b));
  ASSERT_EQ(digested.size(), 2u);
  EXPECT_EQ(digested[1].theirs.rfind("203 characters, FNV-1a ", 0), 0u) << digested[1].theirs;
  EXPECT_LT(agreedSettings(b).size(), 2000u);
  const auto unsaid = settingDifferences(agreedSettings(a), "");
  ASSERT_FALSE(unsaid.empty());
  EXPECT_EQ(unsaid[0].theirs, "(not said)");
}

// abort() and shutdown() close a group: its ops in flight fail at once, and so do later ones.
TEST(GroupState, ClosingFailsOpsInFlightAndLaterOnes) {
  runRanks(2, [](Communicator& comm) {
    EXPECT_TRUE(comm.firstFailure().status.ok());
    if (comm.rank() == 1) return;  // never joins: rank 0's allreduce waits
    std::vector<float> buf(1000, 1.0f);
    auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(work->done());
    auto start = std::chrono::steady_clock::now();
    comm.close("aborted: the test closed it");
    ASSERT_TRUE(work->wait(std::chrono::milliseconds(1000)));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
    EXPECT_TRUE(work->failed());
    EXPECT_NE(work->error().find("aborted: the test closed it"), std::string::npos)
        << work->error();
    EXPECT_EQ(comm.firstFailure().status.kind, StatusKind::kClosed);
    EXPECT_EQ(work->status().kind, StatusKind::kClosed);
    auto later = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(later->wait(std::chrono::milliseconds(500)));
    EXPECT_NE(later->error().find("aborted: the test closed it"), std::string::npos)
        << later->error();
  });
}

TEST(GroupState, AnOpClosedWithReceivesStillHeldIsFreedWhenTheyComplete) {
  // A transport that completes a cancelled receive only later (as UCX may): the failed op waits
  // as an orphan for its receives, then goes, its ring's links before the requests they point
  // at (a sanitizer build sees any access to a freed request).
  ScopedEnv env({{"TORCH_DDL_ALLREDUCE_ALGO", "ring"}, {"TORCH_DDL_SEGMENT_BYTES", "4096"}});
  LoopbackFabric fabric;
  runRanks(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 1) return;  // never joins: rank 0's ring waits on its receives
        std::vector<float> buf(100000, 1.0f);
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_FALSE(work->done());
        comm.close("aborted: the test closed it");
        ASSERT_TRUE(work->wait(std::chrono::milliseconds(1000)));
        EXPECT_TRUE(work->failed());
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (comm.engine().orphanedOps() > 0 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        EXPECT_EQ(comm.engine().orphanedOps(), 0u);
      },
      std::chrono::seconds(60),
      [&] {
        auto transport = fabric.join();
        transport->refuseWindows(true);
        transport->deferCancels(true);
        return transport;
      });
}

TEST(GroupState, ATimeoutIsRecordedAsTheGroupsFirstFailure) {
  runRanks(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 1) return;
        std::vector<float> buf(10, 1.0f);
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
        EXPECT_TRUE(work->failed());
        const Status first = comm.firstFailure().status;
        EXPECT_EQ(first.kind, StatusKind::kTimeout);
        EXPECT_EQ(first.ranks, std::vector<int>{1});  // whom it waited for
        EXPECT_NE(first.detail.find("Timed out"), std::string::npos) << first.detail;
      },
      std::chrono::milliseconds(300));
}

TEST(GroupState, ATimeoutFailsTheGroupOnEveryRank) {
  // Rank 2 comes late: ranks 0 and 1 time out; when rank 2 calls, it fails at once with their
  // words, and so does every later op, on every rank.
  runRanks(
      3,
      [](Communicator& comm) {
        std::vector<float> buf(10, 1.0f);
        if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(800));
        auto start = std::chrono::steady_clock::now();
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
        EXPECT_TRUE(work->failed());
        if (comm.rank() == 2) {
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
          EXPECT_NE(work->error().find("reports: Timed out after 300 ms"), std::string::npos)
              << work->error();
        }
        EXPECT_EQ(comm.firstFailure().status.kind, StatusKind::kTimeout);
        auto later = comm.barrier();
        ASSERT_TRUE(later->wait(std::chrono::milliseconds(100)));
        EXPECT_NE(later->error().find("the group failed earlier"), std::string::npos)
            << later->error();
      },
      std::chrono::milliseconds(300));
}

TEST(GroupState, ATimeoutNamesTheRankAtTheEndOfTheWait) {
  // Rank 3 of 5 never comes in time. In a ring only rank 4 waits on it directly; the others wait
  // on ranks that wait in turn. Halfway to the deadline each says whom it waits for, and every
  // rank's timeout follows those reports to rank 3.
  std::vector<std::string> errors(5);
  runRanks(
      5,
      [&](Communicator& comm) {
        std::vector<float> buf(1 << 16, 1.0f);
        if (comm.rank() == 3) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return;
        }
        auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
        ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
        errors[comm.rank()] = work->error();
      },
      std::chrono::milliseconds(600));
  for (int r : {0, 1, 2, 4}) {
    const std::string& e = errors[r];
    EXPECT_NE(e.find("Timed out after 600 ms"), std::string::npos) << e;
    const bool direct = e.find("rank 3 has not started this op") != std::string::npos;
    const bool followed = e.find("to rank 3, which has not started this op") != std::string::npos;
    EXPECT_TRUE(direct || followed) << "rank " << r << ": " << e;
  }
}

TEST(CallCheck, EveryRankNamingItselfTheRootFails) {
  // Nobody receives anything: only the call check can see it.
  std::vector<std::string> errors(3);
  runRanks(3, [&](Communicator& comm) {
    std::vector<float> buf(100, 1.0f);
    auto work = comm.broadcast(buf.data(), buf.size(), DataType::kFloat32, comm.rank());
    work->wait();
    errors[comm.rank()] = work->error();
    check(comm.barrier());  // the group goes on
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("broadcast(100 x float32 from rank"), std::string::npos) << e;
  }
}

TEST(CallCheck, ARefusalOnOneRankEndsTheOpEverywhereAndTheGroupGoesOn) {
  // Rank 0 refuses its arguments; ranks 1 and 2, in a large allreduce, fail at once naming it.
  std::vector<std::string> errors(3);
  runRanks(
      3,
      [&](Communicator& comm) {
        std::vector<float> buf(1 << 18, 1.0f);
        auto start = std::chrono::steady_clock::now();
        if (comm.rank() == 0) {
          try {
            (void)comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kBand);
            ADD_FAILURE() << "a BAND of floats was not refused";
          } catch (const Error& e) {
            EXPECT_EQ(e.kind(), StatusKind::kInvalidArgument) << e.what();
          }
        } else {
          auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
          ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
          errors[comm.rank()] = work->error();
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
        }
        for (int i = 0; i < 2; ++i) {
          std::fill(buf.begin(), buf.end(), 1.0f);
          check(comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum));
          EXPECT_EQ(buf.back(), 3.0f);
        }
      },
      std::chrono::seconds(30));
  for (int r = 1; r < 3; ++r) {
    EXPECT_NE(
        errors[r].find("rank 0 reports: rank 0 refused its call to all_reduce: reduce op BAND"),
        std::string::npos)
        << errors[r];
  }
}

TEST(CallCheck, AFailedOpsLeftoversNeverTakeAPointToPointMessage) {
  // Op #0 fails on rank 1 (rank 0 refused it): for a while rank 1 discards what arrives for it.
  // A point-to-point message whose user tag has the same low bits must not be taken for that.
  runRanks(
      2,
      [&](Communicator& comm) {
        std::vector<float> buf(1 << 10, 1.0f);
        if (comm.rank() == 0) {
          EXPECT_THROW(
              (void)comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kBand),
              Error);
          const float value = 42.0f;
          check(comm.send(&value, sizeof(value), 1, /*userTag=*/0));
        } else {
          auto work = comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
          ASSERT_TRUE(work->wait(std::chrono::milliseconds(5000)));
          EXPECT_TRUE(work->failed());
          // The message arrives with no receive posted; housekeeping runs meanwhile.
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          float got = 0;
          CallOptions options;
          options.timeout = std::chrono::milliseconds(2000);
          check(comm.recv(&got, sizeof(got), 0, /*userTag=*/0, options));
          EXPECT_EQ(got, 42.0f);
        }
      },
      std::chrono::seconds(30));
}

TEST(CallCheck, PrintsAndNoticesSurviveTheirEncoding) {
  CallPrint p = callPrint(Collective::kReduce, 7, DataType::kInt64, ReduceOp::kMax, 2);
  EXPECT_EQ(p.describe(), "reduce(MAX, 7 x int64 to rank 2)");
  EXPECT_EQ(callPrint(Collective::kBarrier).describe(), "barrier()");
  Notice n;
  n.sequence = 41;
  n.type = Notice::Type::kGroupTimeout;
  n.from = 3;
  n.text = std::string(5000, 'x');
  std::string bytes = n.encode();
  EXPECT_LE(bytes.size(), Notice::kMaxBytes);
  std::optional<Notice> back = Notice::decode(bytes.data(), bytes.size());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->sequence, 41u);
  EXPECT_EQ(back->from, 3);
  EXPECT_EQ(back->type, Notice::Type::kGroupTimeout);
  EXPECT_FALSE(Notice::decode(bytes.data(), 3).has_value());
}

// Where a collective's print goes as it starts (PrintRing): in a grid, to position + 1 of one
// dimension's ring (where the grid's rings and Bruck's rounds send anyway), every rank asked by
// exactly the ranks that print to it, and the arrows joining every rank to one ring, so that a
// disagreement anywhere is one between two ranks that print to each other. Without a grid: the
// ranks in order.
TEST(CallCheck, EveryRankPrintsToPositionPlusOneOfADimensionAndTheArrowsJoinEveryRank) {
  struct Shape {
    int ranks, perHost, hostsPerRack;
  };
  for (Shape shape :
       {Shape{64, 8, 4}, Shape{60, 3, 5}, Shape{16, 1, 4}, Shape{24, 4, 6}, Shape{4096, 8, 32}}) {
    SCOPED_TRACE(std::to_string(shape.ranks) + " ranks, " + std::to_string(shape.perHost) +
                 " a host, " + std::to_string(shape.hostsPerRack) + " hosts a rack");
    std::vector<Locality> where;
    RackMap racks;
    for (int r = 0; r < shape.ranks; ++r) {
      const std::string host = "h" + std::to_string(r / shape.perHost);
      where.push_back(Locality{host, "m" + host});
      racks[host] = "r" + std::to_string(r / shape.perHost / shape.hostsPerRack);
    }
    const int n = shape.ranks;
    const BlockPlan grid = planBlockStages(buildTopology(where, racks), false);
    ASSERT_FALSE(grid.empty());
    std::vector<int> next(n);
    std::vector<std::vector<int>> asks(n);
    for (int r = 0; r < n; ++r) {
      const PrintRing ring = printRing(r, n, &grid);
      next[r] = ring.next;
      asks[r] = ring.previous;
      std::sort(asks[r].begin(), asks[r].end());
      int moved = 0;  // dimensions where next's coordinate differs: one, by one place on
      for (size_t k = 0; k < grid.dims.size(); ++k) {
        const int from = grid.coords[r][k], to = grid.coords[next[r]][k];
        if (from == to) continue;
        ++moved;
        EXPECT_EQ(to, (from + 1) % grid.dims[k]) << "rank " << r;
      }
      EXPECT_EQ(moved, 1) << "rank " << r << " prints to " << next[r];
    }
    std::vector<std::vector<int>> printedBy(n);
    for (int r = 0; r < n; ++r) printedBy[next[r]].push_back(r);
    for (int r = 0; r < n; ++r) EXPECT_EQ(asks[r], printedBy[r]) << "rank " << r;
    // Every rank's arrows end in the same ring: after n steps each stands on it, and the ring's
    // lowest rank is the same from everywhere.
    int common = -1;
    for (int r = 0; r < n; ++r) {
      int at = r;
      for (int i = 0; i < n; ++i) at = next[at];
      int lowest = at;
      for (int x = next[at]; x != at; x = next[x]) lowest = std::min(lowest, x);
      if (common < 0) common = lowest;
      EXPECT_EQ(lowest, common) << "rank " << r;
    }
  }
  for (int n : {1, 2, 5}) {
    for (int r = 0; r < n; ++r) {
      const PrintRing ring = printRing(r, n, nullptr);
      EXPECT_EQ(ring.next, (r + 1) % n);
      EXPECT_EQ(ring.previous, std::vector<int>{(r + n - 1) % n});
    }
  }
}

// torch 2.14's reconfigure: processes form a group from each other's handles, no store; a
// process left out (rank 2 here) is not waited for; ranks follow the list's order.
TEST(Reconfigure, ProcessesListedByHandleFormAGroupWithoutAStore) {
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::string> handles;
  for (int r = 0; r < 4; ++r) {
    engines.push_back(std::make_unique<Engine>(fabric.join()));
    handles.push_back(Derivation::handle(*engines.back()));
  }
  const std::vector<int> order = {3, 0, 1};
  const std::vector<std::string> listed = {handles[3], handles[0], handles[1]};
  together(static_cast<int>(order.size()), [&](int i) {
    auto comm = Communicator::reconfigure(*engines[order[i]], listed, 7, std::chrono::seconds(30));
    ASSERT_EQ(comm->rank(), i);
    ASSERT_EQ(comm->size(), 3);
    std::vector<double> v(1001, order[i] + 1.0);
    check(comm->allreduce(v.data(), v.size(), DataType::kFloat64, ReduceOp::kSum));
    for (double x : v) ASSERT_EQ(x, 7.0);  // 4 + 1 + 2
  });
  // Given the same handles but different uuids: every process gets an error naming both.
  std::vector<std::string> errors(order.size());
  together(static_cast<int>(order.size()), [&](int i) {
    try {
      (void)Communicator::reconfigure(*engines[order[i]], listed, i == 1 ? 9 : 8,
                                      std::chrono::seconds(30));
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("uuid 9"), std::string::npos) << e;
    EXPECT_NE(e.find("uuid 8"), std::string::npos) << e;
  }
  // Bad handles fail at once, before any message.
  const auto now = std::chrono::seconds(1);
  EXPECT_THROW((void)Communicator::reconfigure(*engines[0], {"ddl1:zz"}, 1, now), Error);
  EXPECT_THROW((void)Communicator::reconfigure(*engines[0], {handles[1]}, 1, now), Error);
  EXPECT_THROW((void)Communicator::reconfigure(*engines[0], {handles[0], handles[0]}, 1, now),
               Error);
  EXPECT_THROW((void)Communicator::reconfigure(*engines[0], {}, 1, now), Error);
  // A listed process that never calls: rank 0 (a short timeout) gives up waiting for it and
  // tells rank 1, whose own timeout is long: rank 1 fails at once with rank 0's words.
  {
    std::string error0, error1;
    double took1 = 0;
    std::thread first([&] {
      try {
        (void)Communicator::reconfigure(*engines[0], {handles[0], handles[1], handles[2]}, 3,
                                        std::chrono::milliseconds(300));
      } catch (const Error& e) {
        error0 = e.what();
      }
    });
    std::thread second([&] {
      const auto start = std::chrono::steady_clock::now();
      try {
        (void)Communicator::reconfigure(*engines[1], {handles[0], handles[1], handles[2]}, 3,
                                        std::chrono::seconds(60));
      } catch (const Error& e) {
        error1 = e.what();
      }
      took1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
    first.join();
    second.join();
    EXPECT_NE(error0.find("rank 2"), std::string::npos) << error0;
    EXPECT_NE(error1.find("rank 0 reports"), std::string::npos) << error1;
    EXPECT_NE(error1.find("rank 2"), std::string::npos) << error1;
    EXPECT_LT(took1, 10.0);
  }
  // A set's order: by host, then handle, the same whatever order it came in.
  std::vector<std::string> shuffled = {handles[2], handles[0], handles[3], handles[1]};
  EXPECT_EQ(Derivation::orderHandles(shuffled), Derivation::orderHandles(handles));
}

// Processes whose settings differ where they choose what an op runs would plan different paths
// and wait for each other's messages until their timeout: group creation compares them, and a
// reconfigure (no store) compares what the handles carry, in every process, before a message.
TEST(Reconfigure, ProcessesWhoseSettingsDifferAreRefusedAtOnceNamingTheSetting) {
  LoopbackFabric fabric;
  Config other = config();
  other.stagedBytes = 4096;
  other.allgatherAlgorithm = "ring";
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::string> handles;
  for (int r = 0; r < 3; ++r) {
    engines.push_back(std::make_unique<Engine>(fabric.join(), Engine::Drive::kThread,
                                               Clock::steady(), nullptr,
                                               r == 1 ? &other : nullptr));
    handles.push_back(Derivation::handle(*engines.back()));
  }
  std::vector<std::string> errors(3);
  const auto began = std::chrono::steady_clock::now();
  together(3, [&](int i) {
    try {
      (void)Communicator::reconfigure(*engines[i], handles, 4, std::chrono::seconds(30));
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(5));
  for (const std::string& e : errors) {
    EXPECT_EQ(e, errors[0]);  // the same words in every process
    EXPECT_NE(e.find("TORCH_DDL_STAGED_BYTES is 4096 for handle 1 and " +
                     std::to_string(config().stagedBytes) + " for handle 0"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("TORCH_DDL_ALLGATHER_ALGO is ring for handle 1"), std::string::npos) << e;
  }
  // The same settings in the two others: they form their group.
  const std::vector<std::string> alike = {handles[0], handles[2]};
  together(2, [&](int i) {
    auto comm = Communicator::reconfigure(*engines[i * 2], alike, 5, std::chrono::seconds(30));
    std::vector<float> v(7, 1.0f);
    check(comm->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum));
    EXPECT_EQ(v[6], 2.0f);
  });
}

// A handle as Derivation::handle writes one, of a process on host `host` that is not there.
std::string absentHandle(int host) {
  Writer w;
  w.text("absent-" + std::to_string(host));
  ProcessIdentity identity;
  identity.bootId = "absent";
  identity.pid = host + 1;
  w.text(identity.encode());
  Locality where;
  where.hostName = "absent-" + std::to_string(host);
  where.machineKey = "absent";
  w.text(where.encode());
  w.text(agreedSettingsDeparting(config()));
  w.number(settingsDigest(agreedSettings(config())));
  std::string hex = "ddl1:";
  for (unsigned char c : w.take()) {
    hex += "0123456789abcdef"[c >> 4];
    hex += "0123456789abcdef"[c & 15];
  }
  return hex;
}

// A reconfigure into a group past 65 536 ranks agrees under the top group ids besides the
// agreements' own (base/tag.h). A process whose group holds one of them is refused at once,
// before a message: the agreement's messages would have met that group's. Before, it went on
// (and, its 65 536 peers absent here, failed only at its timeout).
TEST(Reconfigure, IntoAWideGroupIsRefusedWhereAGroupHoldsAnIdItsAgreementCarries) {
  LoopbackFabric fabric;
  Engine engine(fabric.join());
  std::vector<std::string> handles = {Derivation::handle(engine)};
  for (int host = 0; host < 65536; ++host) handles.push_back(absentHandle(host));
  const uint32_t carried = tag::kAgreementGroup - 1;  // a group of 65 537 ranks: one wide bit
  ASSERT_TRUE(engine.claimGroupId(carried));
  const auto began = std::chrono::steady_clock::now();
  std::string error;
  // A timeout well past the time the 65 537 handles take to read (1.7 s under ThreadSanitizer,
  // which a bound of 1.5 s failed): the refusal comes before it.
  const auto timeout = std::chrono::seconds(10);
  try {
    (void)Communicator::reconfigure(engine, handles, 5, timeout);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("holds group id " + std::to_string(carried)), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - began, timeout);
  // A process that holds none of them goes on to the agreement (which, its peers absent, ends
  // at its timeout); once it has ended, a group may take the ids again.
  Engine other(fabric.join());
  handles[0] = Derivation::handle(other);
  error.clear();
  try {
    (void)Communicator::reconfigure(other, handles, 5, std::chrono::milliseconds(300));
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_EQ(error.find("holds group id"), std::string::npos) << error;
  EXPECT_FALSE(error.empty());
  EXPECT_TRUE(other.claimGroupId(carried));
}

}  // namespace
}  // namespace ddl::test
