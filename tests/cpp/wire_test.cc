// Bytes from a peer or the store that are wrong: every decoder bounds what it reads before it
// sizes anything from it, and a sender of wrong bytes is named, never crashes or hangs a rank.
#include "../../csrc/core/base/wire.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "../../csrc/core/base/sparse_block.h"
#include "../../csrc/core/base/tag.h"
#include "harness.h"

namespace ddl::test {
namespace {

// A group of one real rank's view, made by hand for a rank that speaks wrong bytes.
std::shared_ptr<Group> handMade(Engine& engine, int rank, int size, uint32_t id,
                                std::vector<std::string> addresses) {
  auto group = std::make_shared<Group>();
  group->runtime = &engine.runtime();
  group->rank = rank;
  group->size = size;
  group->id = id;
  group->name = "a hostile rank's group";
  group->directory = PeerDirectory::of(addresses);
  return group;
}

// Rank 1 of a creation says its cards take a terabyte: rank 0 fails at once naming it, having
// allocated nothing (before, it sized a buffer from the length it was told).
TEST(Wire, ACreationMessageLongerThanAGroupCanNeedNamesItsSender) {
  LoopbackFabric fabric;
  Engine real(fabric.join()), hostile(fabric.join());
  auto store = std::make_shared<MemoryStore>();
  std::string error;
  std::thread zero([&] {
    try {
      (void)Communicator::create(real, store, 0, 2, std::chrono::seconds(10));
    } catch (const Error& e) {
      error = e.what();
    }
  });
  const std::string key = "ddl/" + std::to_string((store->add("ddl/joined", 1) - 1) / 2) + "/";
  const uint32_t id = parseGroupId(store->get(key + "group_id"), key + "group_id");
  store->set(key + "address/1", hostile.localAddress());
  auto group = handMade(hostile, 1, 2, id, {store->get(key + "address/0"), ""});
  const uint64_t length = uint64_t{1} << 40;
  auto work = std::make_shared<Work>("hostile");
  auto op = std::make_unique<Op>(group, 0, "hostile", std::chrono::seconds(5), work);
  op->task = sendRaw(*op, 0, tag::slot(tag::kControlPhase, tag::kBootstrapStep),
                     std::string(reinterpret_cast<const char*>(&length), sizeof(length)));
  hostile.submit(std::move(op));
  const auto start = std::chrono::steady_clock::now();
  zero.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(error.find("rank 1 sent a creation message of 1099511627776 bytes"), std::string::npos)
      << error;
}

TEST(Wire, CreationCardsSpansAndMachinesThatAreNotWholeAreRefused) {
  std::vector<RankCard> cards(2);
  cards[1].rank = 1;
  cards[1].address = "somewhere";
  std::string bytes = encodeCards(cards);
  std::vector<RankCard> back;
  ASSERT_TRUE(decodeCards(bytes, &back));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].address, "somewhere");
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    back.clear();
    EXPECT_FALSE(decodeCards(bytes.substr(0, cut), &back)) << cut;
  }
  // A rank past the largest group.
  std::vector<RankCard> far(1);
  far[0].rank = static_cast<int>(tag::kMaxRanks) + 1;
  back.clear();
  EXPECT_FALSE(decodeCards(encodeCards(far), &back));
  // A child's span of ranks 4 - 7 of 8 (hosts of 2, its first on rank 3's host), cut anywhere,
  // or said to be of a group too small for it.
  Span span = Span::of(4, true, false, false, true, "");
  for (int r = 5; r < 8; ++r) span.append(Span::of(r, r % 2 == 1, false, false, false, ""));
  const std::string spanBytes = encodeSpan(span);
  Span spanBack;
  ASSERT_TRUE(decodeSpan(spanBytes, 8, &spanBack));
  EXPECT_EQ(spanBack.hosts.runs, (std::vector<std::pair<int, int>>{{2, 2}}));
  EXPECT_TRUE(spanBack.hosts.continues);
  EXPECT_EQ(spanBack.idTaken, std::vector<int>{4});
  for (size_t cut = 0; cut < spanBytes.size(); ++cut) {
    Span partial;
    EXPECT_FALSE(decodeSpan(spanBytes.substr(0, cut), 8, &partial)) << cut;
  }
  Span tooFew;
  EXPECT_FALSE(decodeSpan(spanBytes, 7, &tooFew));
  // A machine whose runs do not add up to the group.
  Span whole = Span::of(0, false, false, false, false, "");
  whole.append(Span::of(1, true, false, false, false, ""));
  const std::string machine = encodeMachine(machineFrom(whole, 2, 3, {}));
  Bootstrapped m;
  ASSERT_TRUE(decodeMachine(machine, 2, &m));
  EXPECT_EQ(m.topology.hosts(), 1);
  EXPECT_FALSE(decodeMachine(machine, 3, &m));
  for (size_t cut = 0; cut < machine.size(); ++cut) {
    Bootstrapped partial;
    EXPECT_FALSE(decodeMachine(machine.substr(0, cut), 2, &partial)) << cut;
  }
  // Addresses for ranks past the group.
  std::vector<std::pair<int, std::string>> entries;
  EXPECT_FALSE(decodeEntries(encodeEntries({{2, "x"}}), 2, &entries));
}

TEST(Wire, ASpanSumsRunsOfHostsAndRacksAcrossItsParts) {
  // Hosts of 3 in racks of 2 hosts, 12 ranks, summed a rank at a time as the tree does.
  Span whole;
  for (int r = 0; r < 12; ++r) {
    const Span one = Span::of(r, r % 3 != 0, r % 6 != 0, true, false, "");
    if (r == 0) {
      whole = one;
    } else {
      whole.append(one);
    }
  }
  EXPECT_EQ(whole.hosts.runs, (std::vector<std::pair<int, int>>{{3, 4}}));
  EXPECT_EQ(whole.racks.runs, (std::vector<std::pair<int, int>>{{6, 2}}));
  // Past kMaxListed hosts, no names: runs alone.
  whole.listsHosts = false;
  whole.hostList.clear();
  const Bootstrapped m = machineFrom(whole, 12, 3, {});
  ASSERT_TRUE(m.error.ok()) << m.error.detail;
  ASSERT_EQ(m.topology.levels.size(), 2u);
  EXPECT_EQ(m.topology.levels[0].blockOf(11), 3);
  EXPECT_EQ(m.topology.levels[1].blockOf(5), 0);
  EXPECT_EQ(m.topology.levels[1].blockOf(6), 1);
  EXPECT_EQ(m.topology.levels[0].blockName(1), "host of ranks 3-5");
  // Hosts listed: found by their localities, whatever the rank order (rank 1 on host b, the
  // others on a), named, in the racks of the map.
  Span mixed;
  const char* hostOf = "abaa";
  for (int r = 0; r < 4; ++r) {
    const std::string name(1, hostOf[r]);
    const Span one = Span::of(r, r > 0 && hostOf[r] == hostOf[r - 1], false, true, false, "",
                              {name, std::hash<std::string>{}(name)});
    if (r == 0) {
      mixed = one;
    } else {
      mixed.append(one);
    }
  }
  const Bootstrapped found = machineFrom(mixed, 4, 3, parseRackMap("r0: a; r1: b"));
  ASSERT_TRUE(found.error.ok()) << found.error.detail;
  EXPECT_EQ(found.topology.describe(), "2 hosts (a: 0 2 3, b: 1)");
  const std::string bytes = encodeMachine(found);
  Bootstrapped again;
  ASSERT_TRUE(decodeMachine(bytes, 4, &again));
  EXPECT_EQ(again.topology.describe(), found.topology.describe());
  // Ranks whose engine holds the id, and a rank whose rack map does not name its host.
  Span taken = Span::of(0, false, false, false, false, "");
  taken.append(Span::of(1, false, false, false, true, ""));
  taken.append(Span::of(2, false, false, false, false,
                        "ddl: TORCH_DDL_TOPOLOGY does not name host h2 (rank 2)"));
  const Bootstrapped refused = machineFrom(taken, 3, 9, {});
  EXPECT_NE(refused.error.detail.find("its id 9"), std::string::npos) << refused.error.detail;
  EXPECT_NE(refused.error.detail.find("rank(s) 1 of the new group"), std::string::npos);
  Span unnamed = Span::of(0, false, false, false, false, "");
  unnamed.append(Span::of(1, false, false, false, false,
                          "ddl: TORCH_DDL_TOPOLOGY does not name host h1 (rank 1)"));
  EXPECT_EQ(machineFrom(unnamed, 2, 3, {}).error.detail,
            "ddl: TORCH_DDL_TOPOLOGY does not name host h1 (rank 1)");
}

TEST(Wire, AgreementCardsThatAreNotWholeAreRefused) {
  std::vector<DeriveCard> cards(2);
  cards[0].request = "exclude 2";
  cards[0].heldIds = std::string(tag::kMaxGroups, '\0');
  cards[1].rank = 1;
  cards[1].parentRank = 1;
  cards[1].request = "exclude 2";
  std::string bytes = encodeCards(cards);
  std::vector<DeriveCard> back;
  ASSERT_TRUE(decodeCards(bytes, 1 << 20, &back));
  EXPECT_EQ(back[1].request, "exclude 2");
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    back.clear();
    EXPECT_FALSE(decodeCards(bytes.substr(0, cut), 1 << 20, &back)) << cut;
  }
  back.clear();
  EXPECT_FALSE(decodeCards(bytes, 100, &back));  // a card over the bound
  cards[0].heldIds.push_back('\0');              // more ids than there are
  back.clear();
  EXPECT_FALSE(decodeCards(encodeCards(cards), 1 << 20, &back));
}

TEST(Wire, TheStoresGroupIdIsANumberBelowTheIds) {
  EXPECT_EQ(parseGroupId("17", "k"), 17u);
  EXPECT_EQ(parseGroupId("0", "k"), 0u);
  for (const char* bad : {"", "x", "-1", "17x", " 1", "4095", "4096", "99999999999999999999"}) {
    try {
      (void)parseGroupId(bad, "ddl/0/group_id");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ddl/0/group_id"), std::string::npos) << e.what();
      EXPECT_EQ(e.kind(), StatusKind::kInvalidArgument);
    }
  }
}

// A rank whose block size makes the blocks' total wrap: every rank refuses alike, naming it,
// before any block is written (before, the output was sized to the wrapped sum and written past).
TEST(Wire, VaryingBlocksWhoseTotalWrapsAreRefusedOnEveryRank) {
  std::vector<std::string> errors(3);
  runRanks(
      3,
      [&](Communicator& comm) {
        std::vector<char> mine(16, 'a');
        const size_t bytes =
            comm.rank() == 2 ? std::numeric_limits<size_t>::max() - 7 : mine.size();
        auto out = std::make_shared<VaryingBlocks>();
        std::shared_ptr<Work> work = comm.allgatherVarying(mine.data(), bytes, out);
        work->wait();
        errors[comm.rank()] = work->error();
        check(comm.barrier());
      },
      std::chrono::seconds(10));
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("rank 2's block of 18446744073709551608 bytes"), std::string::npos) << e;
  }
}

TEST(Wire, NoticesBoundTheRanksTheyName) {
  Notice n;
  n.sequence = 3;
  n.type = Notice::Type::kNews;
  n.from = 1;
  // Ranks gone in 2 000 places (every other rank of 4 000): more ranges than a notice holds.
  for (int r = 0; r < 4000; r += 2) n.gone.push_back(r);
  n.text = "news";
  std::string bytes = n.encode();
  EXPECT_LE(bytes.size(), Notice::kMaxBytes);
  std::optional<Notice> back = Notice::decode(bytes.data(), bytes.size());
  ASSERT_TRUE(back.has_value()) << "the news was dropped whole";
  ASSERT_FALSE(back->gone.empty());
  // A part of the news, every rank of it true.
  for (int r : back->gone) EXPECT_EQ(r % 2, 0);
  EXPECT_EQ(back->gone.front(), 0);
  // Ranges from the wire that name ranks past the largest group, or are empty.
  Notice wide;
  wide.from = 0;
  wide.gone = {0};
  std::string good = wide.encode();
  // The header's last field counts ranges; each range is (first, count) as two uint16.
  auto patch = [&](uint16_t first, uint16_t count) {
    std::string b = good;
    const size_t at = b.size() - 2 * sizeof(uint16_t);
    std::memcpy(b.data() + at, &first, sizeof(first));
    std::memcpy(b.data() + at + sizeof(first), &count, sizeof(count));
    return b;
  };
  EXPECT_TRUE(Notice::decode(patch(5, 3).data(), good.size()).has_value());
  EXPECT_FALSE(Notice::decode(patch(60000, 65535).data(), good.size()).has_value());
  EXPECT_FALSE(Notice::decode(patch(5, 0).data(), good.size()).has_value());
}

// News names, for each rank it says is gone, the rank that counted it gone (group/notice.h):
// runs of witnesses after the ranges, the sender's own left out; too many to fit leave their
// ranks to the sender, and runs that name more ranks than the news, or none, are refused.
TEST(Wire, NewsNamesWhoCountedEachRankGone) {
  Notice n =
      newsOf(7, {2, 3, 4, 9, 10}, {11, 11, 7, 12, 7}, "rank 2 is gone: it sent no heartbeat");
  std::optional<Notice> back = throughTheWire(n);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->gone, n.gone);
  EXPECT_EQ(back->witnesses, (std::vector<int>{11, 11, 7, 12}));  // the last: the sender
  EXPECT_EQ(back->text, n.text);
  // All the sender's: no runs at all, as news was before it named witnesses.
  n.witnesses.assign(n.gone.size(), 7);
  Notice none = n;
  none.witnesses.clear();
  EXPECT_EQ(n.encode(), none.encode());
  // A partition's worth, every rank counted gone by another witness: cut to fit, never dropped.
  Notice wide;
  wide.type = Notice::Type::kNews;
  wide.from = 0;
  for (int r = 1; r < 4000; ++r) {
    wide.gone.push_back(r);
    wide.witnesses.push_back(4000 + r);
  }
  const std::string cut = wide.encode();
  EXPECT_LE(cut.size(), Notice::kMaxBytes);
  back = Notice::decode(cut.data(), cut.size());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->gone, wide.gone);
  ASSERT_FALSE(back->witnesses.empty());
  EXPECT_LT(back->witnesses.size(), wide.gone.size());
  for (size_t i = 0; i < back->witnesses.size(); ++i) EXPECT_EQ(back->witnesses[i], 4001 + int(i));
  // A run past the news's ranks, or of none: refused.
  Notice one;
  one.type = Notice::Type::kNews;
  one.from = 0;
  one.gone = {5};
  one.witnesses = {3};
  const std::string good = one.encode();  // header, range (5, 1), run (3, 1)
  auto patch = [&](uint16_t count) {
    std::string b = good;
    std::memcpy(b.data() + b.size() - sizeof(uint16_t), &count, sizeof(count));
    return b;
  };
  EXPECT_TRUE(Notice::decode(patch(1).data(), good.size()).has_value());
  EXPECT_FALSE(Notice::decode(patch(2).data(), good.size()).has_value());
  EXPECT_FALSE(Notice::decode(patch(0).data(), good.size()).has_value());
}

// News of ranks gone in more places than one notice holds (every other rank of a partition:
// 1 024 ranges at 2 048 ranks, where a notice holds 889) travels in several notices, each a notice
// of its own, that together carry every rank; one cut to fit left the highest ranks to reach no
// one by the news. Witnesses fill what room is left (the rest are the sender's). News that fits
// is the one notice it was.
TEST(Wire, NewsTooLongForOneNoticeGoesInSeveral) {
  Notice fits = newsOf(7, {2, 3, 4, 9, 10}, {11, 11, 7, 12, 7}, "rank 2 is gone");
  EXPECT_EQ(fits.encodePieces(), std::vector<std::string>{fits.encode()});
  Notice alternate = newsOf(0, {}, {}, "rank 1 is gone: it sent no heartbeat");
  for (int r = 1; r < 4000; r += 2) {
    alternate.gone.push_back(r);
    alternate.witnesses.push_back(r + 1);
  }
  const std::vector<std::string> pieces = alternate.encodePieces();
  EXPECT_EQ(pieces.size(), 3u);  // 2 000 ranges
  std::vector<int> gone;
  size_t named = 0;
  for (const std::string& bytes : pieces) {
    EXPECT_LE(bytes.size(), Notice::kMaxBytes);
    std::optional<Notice> piece = Notice::decode(bytes.data(), bytes.size());
    ASSERT_TRUE(piece.has_value());
    EXPECT_EQ(piece->from, 0);
    EXPECT_EQ(piece->text, alternate.text);
    ASSERT_LE(piece->witnesses.size(), piece->gone.size());
    for (size_t i = 0; i < piece->witnesses.size(); ++i) {
      EXPECT_EQ(piece->witnesses[i], piece->gone[i] + 1);
    }
    named += piece->witnesses.size();
    gone.insert(gone.end(), piece->gone.begin(), piece->gone.end());
  }
  EXPECT_EQ(gone, alternate.gone);
  EXPECT_GT(named, 0u);
  // Only what is new since: the ranks not known, with their witnesses.
  const Notice fresh = newsOf(7, {2, 3, 4, 9}, {11, 12, 7, 13}, "").without({3, 9});
  EXPECT_EQ(fresh.gone, (std::vector<int>{2, 4}));
  EXPECT_EQ(fresh.witnesses, (std::vector<int>{11, 7}));
}

std::string sparseBlock(std::vector<int64_t> header, size_t payload) {
  std::string b(header.size() * sizeof(int64_t) + payload, '\0');
  std::memcpy(b.data(), header.data(), header.size() * sizeof(int64_t));
  return b;
}

TEST(Wire, SparseBlocksAreCheckedBeforeAnythingIsSizedFromThem) {
  SparseBlock got;
  std::string why;
  // Element sizes by dtype number: 6 (float32) only.
  auto float32 = [](int64_t dtype) -> size_t { return dtype == 6 ? 4 : 0; };
  // A 2-D sparse tensor [5, 7] of float32 with 3 entries: 2 x 3 indices, 3 values.
  std::string b = sparseBlock({2, 0, 6, 2, 5, 7, 3}, 2 * 3 * 8 + 3 * 4);
  ASSERT_TRUE(readSparseBlock(b.data(), b.size(), float32, &got, &why)) << why;
  EXPECT_EQ(got.nnz, 3);
  EXPECT_EQ(got.indexBytes, 48u);
  EXPECT_EQ(got.valueBytes, 12u);
  // Hybrid: [5, 4] with one sparse dimension: values of 4 elements each.
  b = sparseBlock({1, 1, 6, 2, 5, 4, 2}, 2 * 8 + 2 * 4 * 4);
  ASSERT_TRUE(readSparseBlock(b.data(), b.size(), float32, &got, &why)) << why;
  // An nnz that the bytes do not hold is refused before anything is sized from it.
  b = sparseBlock({2, 0, 6, 2, 5, 7, int64_t{1} << 60}, 16);
  EXPECT_FALSE(readSparseBlock(b.data(), b.size(), float32, &got, &why));
  EXPECT_NE(why.find("nnz"), std::string::npos) << why;
  b = sparseBlock({2, 0, 6, 2, 5, 7, -1}, 0);
  EXPECT_FALSE(readSparseBlock(b.data(), b.size(), float32, &got, &why));
  // Dimensions that do not add up, too many, a negative size, a dense product that overflows.
  for (std::vector<int64_t> header : std::vector<std::vector<int64_t>>{
           {2, 1, 6, 2, 5, 7, 0},
           {1, 0, 6, 1000, 0},
           {2, 0, 6, 2, -5, 7, 0},
           {1, 2, 6, 3, 5, int64_t{1} << 40, int64_t{1} << 40, 0},
           // Counts whose sum overflows (fuzzing found it: tests/fuzz/crashes/sparse).
           {std::numeric_limits<int64_t>::max(), 5, 6, 4, 1, 1, 1, 1, 0}}) {
    b = sparseBlock(header, 0);
    EXPECT_FALSE(readSparseBlock(b.data(), b.size(), float32, &got, &why)) << header[3];
  }
  // Cut short anywhere.
  b = sparseBlock({2, 0, 6, 2, 5, 7, 3}, 2 * 3 * 8 + 3 * 4);
  for (size_t cut = 0; cut < b.size(); ++cut) {
    EXPECT_FALSE(readSparseBlock(b.data(), cut, float32, &got, &why)) << cut;
  }
}

}  // namespace
}  // namespace ddl::test
