// Wide groups (base/tag.h): more than 2^16 ranks, a rank's bits above the tag's source field
// carried in the low bits of the group field, the group holding its id's whole block.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "../../csrc/core/base/tag.h"
#include "../../csrc/core/group/agreement.h"
#include "../../csrc/core/group/notice.h"
#include "../../csrc/core/transport/loopback/loopback.h"
#include "harness.h"

namespace ddl::test {
namespace {

TEST(Wide, TheBitsOfARankAboveTheSourceFieldGoIntoTheGroupsBlock) {
  EXPECT_EQ(tag::wideBits(1), 0);
  EXPECT_EQ(tag::wideBits(65536), 0);
  EXPECT_EQ(tag::wideBits(65537), 1);
  EXPECT_EQ(tag::wideBits(131072), 1);
  EXPECT_EQ(tag::wideBits(131073), 2);
  EXPECT_EQ(tag::wideBits(tag::kMaxRanks), tag::kWideBits);
  EXPECT_EQ(tag::kMaxRanks, 1u << 20);
  const uint64_t slot = tag::slot(7, 300);
  // A rank below 2^16: the plain layout, whatever the group's width.
  EXPECT_EQ(tag::make(32, 9, slot, 65535),
            uint64_t{32} << 52 | uint64_t{9} << 36 | slot << 16 | 65535);
  for (uint32_t id : {32u, 40u, tag::kAgreementGroup}) {
    for (uint32_t rank : {0u, 1u, 65535u, 65536u, 0x9abcdu, tag::kMaxRanks - 1}) {
      const uint64_t t = tag::make(id, 9, slot, rank);
      EXPECT_EQ(tag::source(t, id), rank) << id << " " << rank;
      // The group field stays in the id's block of 16.
      EXPECT_EQ((t >> tag::kGroupShift) & ~uint64_t{15}, id & ~15u);
      const uint64_t any = tag::make(id, 9, slot, 0);
      EXPECT_EQ(t & tag::anySource(4), any & tag::anySource(4));
      EXPECT_EQ(t & tag::groupAndSlot(4), any & tag::groupAndSlot(4));
      EXPECT_EQ(t & tag::groupAndSequence(4), any & tag::groupAndSequence(4));
      // Another block, another sequence or slot does not match.
      EXPECT_NE(t & tag::anySource(4), tag::make(id ^ 16, 9, slot, 0) & tag::anySource(4));
      EXPECT_NE(t & tag::anySource(4), tag::make(id, 10, slot, 0) & tag::anySource(4));
    }
  }
  EXPECT_EQ(tag::anySource(0), tag::kAnySource);
  EXPECT_EQ(tag::groupAndSlot(0), tag::kGroupAndSlot);
  EXPECT_EQ(tag::groupAndSequence(0), tag::kGroupAndSequence);
  // Ids through the store: a wide group's is aligned and below the agreements' block.
  for (uint64_t number : {0ull, 1ull, 254ull, 255ull, 4094ull, 4095ull, 123456789ull}) {
    EXPECT_EQ(tag::groupIdOf(number, 0), number % tag::kGroupIds);
    for (int wide = 1; wide <= tag::kWideBits; ++wide) {
      const uint32_t id = tag::groupIdOf(number, wide);
      EXPECT_EQ(id % (1u << wide), 0u);
      EXPECT_LT(id, tag::kAgreementBlock);
    }
  }
}

TEST(Wide, AWideGroupHoldsItsBlockAndTheIdsItsAgreementsCarry) {
  LoopbackFabric fabric;
  Engine engine(fabric.join());
  ASSERT_TRUE(engine.claimGroupId(32, 4));
  EXPECT_FALSE(engine.claimGroupId(33));
  EXPECT_FALSE(engine.claimGroupId(47));
  EXPECT_FALSE(engine.claimGroupId(tag::kAgreementBlock + 3));  // its agreements carry it
  EXPECT_FALSE(engine.claimGroupId(40, 1));
  ASSERT_TRUE(engine.claimGroupId(48));
  std::vector<bool> held = engine.heldGroupIds();
  for (uint32_t id = 0; id < tag::kMaxGroups; ++id) {
    const bool want = (id >= 32 && id < 49) || (id >= tag::kAgreementBlock && id < tag::kGroupIds);
    EXPECT_EQ(held[id], want) << id;
  }
  engine.releaseGroupId(32, 4);
  EXPECT_TRUE(engine.claimGroupId(tag::kGroupIds - 2));  // no wide group lives
  // A group that holds an id the agreements of a wide group would carry keeps it from forming.
  EXPECT_FALSE(engine.claimGroupId(64, 2));  // they carry 4 092 - 4 094
  EXPECT_TRUE(engine.claimGroupId(64, 1));   // 4 094 alone
  engine.releaseGroupId(64, 1);
  engine.releaseGroupId(tag::kGroupIds - 2);
  EXPECT_TRUE(engine.claimGroupId(64, 2));
}

TEST(Wide, ADerivedWideGroupAgreesOnAWholeBlockFreeOnEveryRank) {
  std::vector<DeriveCard> cards(65537);
  for (size_t i = 0; i < cards.size(); ++i) {
    cards[i].rank = static_cast<int>(i);
    cards[i].parentRank = static_cast<int>(i);
    cards[i].request = "split";
  }
  DeriveResult free = decideDerived(cards, "split");
  ASSERT_TRUE(free.error.ok()) << free.error.detail;
  EXPECT_EQ(free.id, tag::kAgreementBlock - 2);
  cards[70].heldIds.assign(tag::kMaxGroups, '\0');
  cards[70].heldIds[tag::kAgreementBlock - 1] = 1;  // the block's second id
  EXPECT_EQ(decideDerived(cards, "split").id, tag::kAgreementBlock - 4);
  cards.resize(65536);  // not wide: the highest id
  EXPECT_EQ(decideDerived(cards, "split").id, tag::kGroupIds - 1);
}

TEST(Wide, NoticesNameRanksAboveTwoToTheSixteen) {
  Notice notice =
      newsOf(3, {5, 70000, 70001, 70002, 1048575}, {3, 99999, 99999, 3, 65536}, "a host is gone");
  const std::string bytes = notice.encode();
  std::optional<Notice> back = throughTheWire(notice);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->gone, notice.gone);
  EXPECT_EQ(back->witnesses, notice.witnesses);
  EXPECT_EQ(back->text.substr(0, notice.text.size()), notice.text);
  // Ranks below 2^16 keep the two-byte form.
  Notice narrow = notice;
  narrow.gone = {5, 6, 65535};
  narrow.witnesses = {3, 3, 65535};
  const std::string small = narrow.encode();
  EXPECT_EQ(small.substr(0, 4), std::string("dldn", 4));
  EXPECT_EQ(bytes.substr(0, 4), std::string("dldw", 4));
  back = Notice::decode(small.data(), small.size());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->gone, narrow.gone);
  // A range from the wire past the largest group is refused: 2^20 - 1 and one more.
  Notice last = notice;
  last.gone = {1048575};
  last.witnesses = {};
  std::string past = last.encode();
  // The range's count: the last four bytes before the words.
  const uint32_t two = 2;
  std::memcpy(past.data() + past.size() - last.text.size() - sizeof(two), &two, sizeof(two));
  EXPECT_FALSE(Notice::decode(past.data(), past.size()).has_value());
}

// Two processes of a group of 70 001 ranks (one wide bit), made by hand: rank 70 000 and rank 3.
std::shared_ptr<Group> wideGroup(Engine& engine, int rank, const std::vector<std::string>& at) {
  auto group = std::make_shared<Group>();
  group->runtime = &engine.runtime();
  group->rank = rank;
  group->size = 70001;
  group->id = 32;
  group->name = "a wide group";
  group->directory = std::make_shared<PeerDirectory>([at](int r) {
    return r == 70000 ? at[0] : r == 3 ? at[1] : std::string();
  });
  return group;
}

Task exchange(Op& op, std::string* got, int* from) {
  const uint64_t slot = tag::slot(0, 1), anySlot = tag::slot(0, 2);
  if (op.rank() == 70000) {
    const std::string a = "to rank 3", b = "to whoever";
    co_await op.all(op.send(3, slot, a.data(), a.size()), op.send(3, anySlot, b.data(), b.size()));
    co_return;
  }
  got->assign(32, '\0');
  std::string any(32, '\0');
  Request* r = op.recvUpTo(70000, slot, got->data(), got->size());
  Request* a = op.recvAny(anySlot, any.data(), any.size());
  co_await op.all(r, a);
  got->resize(r->receivedBytes);
  *got += "|" + any.substr(0, a->receivedBytes);
  *from = op.sourceOf(a);
}

TEST(Wide, RanksAboveTwoToTheSixteenSendReceiveAndAreNamed) {
  LoopbackFabric fabric;
  Engine high(fabric.join()), low(fabric.join());
  const std::vector<std::string> at{high.localAddress(), low.localAddress()};
  std::string got;
  int from = -1;
  auto sent = std::make_shared<Work>("send"), received = std::make_shared<Work>("receive");
  auto send =
      std::make_unique<Op>(wideGroup(high, 70000, at), 5, "send", std::chrono::seconds(5), sent);
  auto receive =
      std::make_unique<Op>(wideGroup(low, 3, at), 5, "receive", std::chrono::seconds(5), received);
  send->task = exchange(*send, nullptr, nullptr);
  receive->task = exchange(*receive, &got, &from);
  high.submit(std::move(send));
  low.submit(std::move(receive));
  check(sent);
  check(received);
  EXPECT_EQ(got, "to rank 3|to whoever");
  EXPECT_EQ(from, 70000);
}

}  // namespace
}  // namespace ddl::test
