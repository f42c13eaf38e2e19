// Groups destroyed and derived again: the new group neither takes the old one's id while the
// old one's leftovers may still arrive, nor takes a late word of the old group for its own.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "../../csrc/core/base/tag.h"
#include "harness.h"

namespace ddl::test {
namespace {

// Before, the group derived next took the destroyed one's id at once (the highest free): what
// the old group's failed ops left behind could be taken by the new one's ops of the same number.
TEST(Lifecycle, ADerivedGroupDoesNotTakeTheIdOfOneJustDestroyed) {
  runRanks(3, [](Communicator& comm) {
    std::shared_ptr<Communicator> first = comm.split({0, 1, 2});
    const uint32_t id = first->id();
    EXPECT_EQ(allreduceOnes(*first), 3.0);
    first.reset();
    std::shared_ptr<Communicator> second = comm.split({0, 1, 2});
    EXPECT_NE(second->id(), id);
    EXPECT_EQ(allreduceOnes(*second), 3.0);
  });
}

// A late notice of another group that held the id (here: one made by hand, of no incarnation)
// saying rank 2 is gone reaches rank 1 of the group that holds the id now. Before, rank 1 took
// it: it counted the process of rank 2 lost for good, and the group's next op failed.
TEST(Lifecycle, ALateNoticeOfAnotherGroupWithTheIdIsDropped) {
  std::vector<std::string> addresses(3);
  std::mutex mutex;
  runRanks(3, [&](Communicator& comm) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      addresses[comm.rank()] = comm.engine().localAddress();
    }
    std::shared_ptr<Communicator> group = comm.split({0, 1, 2});
    EXPECT_EQ(allreduceOnes(*group), 3.0);  // every rank has written its address
    if (comm.rank() == 0) {
      auto old = std::make_shared<Group>();
      old->runtime = &comm.engine().runtime();
      old->rank = 0;
      old->size = 3;
      old->id = group->id();
      old->name = "a destroyed group";
      old->directory = PeerDirectory::of(addresses);
      Notice notice;
      notice.sequence = 0;
      notice.incarnation = 0;
      notice.type = Notice::Type::kNews;
      notice.tree = false;
      notice.kind = StatusKind::kPeerLost;
      notice.from = 0;
      notice.gone = {2};
      notice.text = "rank 2 is gone (in the destroyed group's numbering)";
      auto work = std::make_shared<Work>("late notice");
      auto op = std::make_unique<Op>(old, 0, "late notice", std::chrono::seconds(5), work);
      op->task = sendRaw(*op, 1, tag::slot(tag::kControlPhase, tag::kNoticeStep), notice.encode());
      comm.engine().submit(std::move(op));
      check(work);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it arrived and was read
    EXPECT_EQ(allreduceOnes(*group), 3.0);
  });
}

}  // namespace
}  // namespace ddl::test
