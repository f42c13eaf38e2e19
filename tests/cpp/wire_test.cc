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
  MemoryStore store;
  std::string error;
  std::thread zero([&] {
    try {
      (void)Communicator::create(real, store, 0, 2, std::chrono::seconds(10));
    } catch (const Error& e) {
      error = e.what();
    }
  });
  const std::string key = "ddl/" + std::to_string((store.add("ddl/joined", 1) - 1) / 2) + "/";
  const uint32_t id = parseGroupId(store.get(key + "group_id"), key + "group_id");
  store.set(key + "address/1", hostile.localAddress());
  auto group = handMade(hostile, 1, 2, id, {store.get(key + "address/0"), ""});
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

TEST(Wire, CreationCardsAndDirectoriesThatAreNotWholeAreRefused) {
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
  // A directory whose level names a block it does not have.
  GroupDirectory d;
  d.addresses = {"a", "b"};
  d.identities = {"", ""};
  d.topology.size = 2;
  Level level("host", std::vector<int>{0, 0});
  level.blockNames = {"h0"};
  d.topology.levels.push_back(level);
  GroupDirectory out;
  ASSERT_TRUE(decodeDirectory(encodeDirectory(d), 2, &out));
  d.topology.levels[0] = Level("host", std::vector<int>{0, 1});
  d.topology.levels[0].blockNames = {"h0"};
  EXPECT_FALSE(decodeDirectory(encodeDirectory(d), 2, &out));
  EXPECT_FALSE(decodeDirectory(encodeDirectory(d), 3, &out));
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
