#include "bootstrap.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <list>

#include "../base/tag.h"
#include "../base/types.h"
#include "../base/wire.h"
#include "../runtime/runtime.h"

namespace ddl {
namespace {

constexpr uint64_t kSlot = tag::slot(tag::kControlPhase, tag::kBootstrapStep);

// The rack of the host named `host`, from the map every rank was given ("" without one).
std::string rackOf(const RackMap& racks, const std::string& host) {
  auto it = racks.find(host);
  return it == racks.end() ? std::string() : it->second;
}

}  // namespace

Task sendFramed(Op& op, int peer, uint64_t slot, std::string bytes) {
  const uint64_t length = bytes.size();
  // In this order (a length, then its bytes): not two arguments of one call.
  Request* sentLength = op.send(peer, slot, &length, sizeof(length));
  Request* sentBytes = op.send(peer, slot, bytes.data(), bytes.size());
  co_await op.all(sentLength, sentBytes);
}

Task receiveFramed(Op& op, int peer, uint64_t slot, uint64_t most, std::string* bytes) {
  uint64_t length = 0;
  co_await op.all(op.recv(peer, slot, &length, sizeof(length)));
  if (length > most) {
    throw Error("rank " + std::to_string(peer) + " sent a creation message of " +
                std::to_string(length) + " bytes, more than the " + std::to_string(most) +
                " a group of its size can need");
  }
  bytes->assign(length, '\0');
  co_await op.all(op.recv(peer, slot, bytes->data(), length));
}

int bootstrapParent(int rank) { return rank == 0 ? -1 : rank & (rank - 1); }

std::vector<int> bootstrapChildren(int rank, int size) {
  std::vector<int> children;
  const long lowest = rank == 0 ? LONG_MAX : (rank & -rank);
  for (long step = 1; step < lowest && rank + step < size; step <<= 1) {
    children.push_back(static_cast<int>(rank + step));
  }
  return children;
}

namespace {

// Framed sends posted at once and awaited later, so that a rank's receives are posted while its
// sends travel (no rank waits for a send to complete before it listens).
class Outbox {
 public:
  explicit Outbox(Op& op) : op_(op) {}
  void post(int peer, std::string bytes) {
    Framed& f = framed_.emplace_back();
    f.bytes = std::move(bytes);
    f.length = f.bytes.size();
    requests_.push_back(op_.send(peer, kSlot, &f.length, sizeof(f.length)));
    requests_.push_back(op_.send(peer, kSlot, f.bytes.data(), f.bytes.size()));
  }
  Op::Until sent() { return op_.all(std::move(requests_)); }

 private:
  struct Framed {
    uint64_t length = 0;
    std::string bytes;
  };
  Op& op_;
  std::list<Framed> framed_;  // stable addresses while the sends are in flight
  std::vector<Request*> requests_;
};

// Step 2: this rank's card to its predecessor (and the last rank's to rank 0), then the
// predecessor's answer; the neighbours' cards (the successor's first).
Task exchangeNeighbours(Op& op, Group& group, const RankCard& mine, RankCard* before,
                        RankCard* after) {
  const int n = group.size, rank = group.rank;
  const int pred = (rank + n - 1) % n, succ = (rank + 1) % n;
  const std::string card = encodeCards({mine});
  const uint64_t most = kMaxCardBytes;
  auto take = [&](const std::string& bytes, int from, RankCard* out) {
    std::vector<RankCard> cards;
    if (!decodeCards(bytes, &cards) || cards.size() != 1 || cards[0].rank != from) {
      throw Error("rank " + std::to_string(from) + " sent a malformed card");
    }
    *out = std::move(cards[0]);
    group.directory->learn(from, out->address);
  };
  // Every rank's successor sends first (its predecessor's address came from the store); rank
  // 0 hears from the last rank, which read rank 0's address there.
  Outbox outbox(op);
  if (rank != 0) outbox.post(pred, card);
  if (rank == n - 1 && n > 2) outbox.post(succ, card);
  std::string bytes;
  if (rank != n - 1) {  // its successor is not rank 0, which sends to its predecessor later
    co_await receiveFramed(op, succ, kSlot, most, &bytes);
    take(bytes, succ, after);
  }
  if (rank == 0 && n > 2) {
    co_await receiveFramed(op, pred, kSlot, most, &bytes);
    take(bytes, pred, before);
  }
  // Then each answers: to its successor (rank 0 to the last rank too).
  if (rank != n - 1) outbox.post(succ, card);
  if (rank == 0 && n > 2) outbox.post(pred, card);
  if (rank != 0) {
    co_await receiveFramed(op, pred, kSlot, most, &bytes);
    take(bytes, pred, before);
  }
  if (rank == n - 1 && n > 2) {
    co_await receiveFramed(op, succ, kSlot, most, &bytes);
    take(bytes, succ, after);
  }
  co_await outbox.sent();
}

// Step 3: the ranks at distances 2d from those at distance d, for d = 1, 2, 4, ... while 2d < n.
Task doubleFingers(Op& op, Group& group) {
  const int n = group.size, rank = group.rank;
  for (int d = 1; 2 * d < n; d *= 2) {
    const int behind = (rank + n - d) % n, ahead = (rank + d) % n;
    // Each is told the other: the rank behind learns the one 2d ahead of it, and so on.
    Outbox outbox(op);
    outbox.post(behind, encodeEntries({{ahead, group.directory->address(ahead)}}));
    outbox.post(ahead, encodeEntries({{behind, group.directory->address(behind)}}));
    const int far[2] = {(rank + 2 * d) % n, (rank + n - (2 * d) % n) % n};
    const int from[2] = {ahead, behind};
    for (int i = 0; i < 2; ++i) {
      std::string bytes;
      co_await receiveFramed(op, from[i], kSlot, kMaxCardBytes, &bytes);
      std::vector<std::pair<int, std::string>> entries;
      if (!decodeEntries(bytes, n, &entries) || entries.size() != 1 || entries[0].first != far[i]) {
        throw Error("rank " + std::to_string(from[i]) + " sent a malformed address");
      }
      group.directory->learn(entries[0].first, entries[0].second);
    }
    co_await outbox.sent();
  }
}

// This rank's span: on its predecessor's host? in its rack? its host, its rack map's word.
Span leafSpan(int rank, const RankCard& mine, const RankCard& before, const RackMap& racks,
              std::string refusal) {
  const Locality here = Locality::decode(mine.locality);
  const Locality previous = rank > 0 ? Locality::decode(before.locality) : Locality{};
  std::string error = std::move(refusal);
  const std::string rack = rackOf(racks, here.hostName);
  if (error.empty() && !racks.empty() && rack.empty()) {
    error = "ddl: TORCH_DDL_TOPOLOGY does not name host " + here.hostName + " (rank " +
            std::to_string(rank) + ")";
  }
  const bool sameHost = rank > 0 && here.sameHost(previous);
  const bool sameRack = rank > 0 && !rack.empty() && rack == rackOf(racks, previous.hostName);
  const Span::Host host{here.hostName, std::hash<std::string>{}(mine.locality)};
  return Span::of(rank, sameHost, sameRack, !racks.empty(), mine.idTaken, std::move(error), host);
}

// Step 6: along the ranks of this rank's host and back, their identities.
Task exchangeHostIdentities(Op& op, Group& group, const Topology& topology, const std::string& mine,
                            Bootstrapped* out) {
  const Level& hosts = topology.levels[0];
  const std::vector<int> ranks = hosts.membersOf(hosts.blockOf(group.rank));
  if (ranks.size() < 2) co_return;
  const auto at = std::find(ranks.begin(), ranks.end(), group.rank) - ranks.begin();
  std::vector<std::pair<int, std::string>> known;
  const uint64_t most = kMaxCardBytes * ranks.size();
  std::string bytes;
  if (at > 0) {
    co_await receiveFramed(op, ranks[at - 1], kSlot, most, &bytes);
    if (!decodeEntries(bytes, group.size, &known) || known.size() != static_cast<size_t>(at)) {
      throw Error("rank " + std::to_string(ranks[at - 1]) + " sent malformed identities");
    }
  }
  known.emplace_back(group.rank, mine);
  if (static_cast<size_t>(at) + 1 < ranks.size()) {
    co_await sendFramed(op, ranks[at + 1], kSlot, encodeEntries(known));
    known.clear();
    co_await receiveFramed(op, ranks[at + 1], kSlot, most, &bytes);
    if (!decodeEntries(bytes, group.size, &known) || known.size() != ranks.size()) {
      throw Error("rank " + std::to_string(ranks[at + 1]) + " sent malformed identities");
    }
  }
  if (at > 0) co_await sendFramed(op, ranks[at - 1], kSlot, encodeEntries(known));
  for (auto& [rank, identity] : known) {
    if (rank != group.rank && !identity.empty()) out->hostIdentities.emplace_back(rank, identity);
  }
}

}  // namespace

Task bootstrapGroup(Op& op, std::shared_ptr<Group> group, RankCard mine, std::string refusal,
                    std::shared_ptr<const RackMap> rackMap, std::shared_ptr<Bootstrapped> out) {
  const RackMap& racks = *rackMap;
  const int n = group->size, rank = group->rank;
  if (n == 1) {
    *out =
        machineFrom(leafSpan(0, mine, RankCard{}, racks, std::move(refusal)), 1, group->id, racks);
    if (out->error.ok()) out->incarnation = group->runtime->newIncarnation();
    co_return;
  }
  // 2, 3: the neighbours and the fingers.
  RankCard before, after;
  co_await exchangeNeighbours(op, *group, mine, &before, &after);
  co_await doubleFingers(op, *group);
  // 4. Up: this rank's span, then its children's, in rank order.
  Span span = leafSpan(rank, mine, before, racks, std::move(refusal));
  for (int child : bootstrapChildren(rank, n)) {
    std::string bytes;
    co_await receiveFramed(op, child, kSlot, kMaxCardBytes * static_cast<uint64_t>(n), &bytes);
    Span theirs;
    if (!decodeSpan(bytes, n, &theirs) || theirs.first != span.first + span.count ||
        theirs.racked != span.racked) {
      throw Error("rank " + std::to_string(child) + " sent a malformed summary of its ranks");
    }
    span.append(theirs);
  }
  // 5. Down: the machine.
  const int parent = bootstrapParent(rank);
  std::string down;
  if (parent >= 0) {
    co_await sendFramed(op, parent, kSlot, encodeSpan(span));
    co_await receiveFramed(op, parent, kSlot, kMaxCardBytes * static_cast<uint64_t>(n), &down);
    if (!decodeMachine(down, n, out.get())) {
      throw Error("rank " + std::to_string(parent) + " sent a malformed machine");
    }
  } else {
    *out = machineFrom(span, n, group->id, racks);
    if (out->error.ok()) out->incarnation = group->runtime->newIncarnation();
    down = encodeMachine(*out);
  }
  for (int child : bootstrapChildren(rank, n)) co_await sendFramed(op, child, kSlot, down);
  // 6. The host's identities.
  if (out->error.ok())
    co_await exchangeHostIdentities(op, *group, out->topology, mine.identity, out.get());
}

}  // namespace ddl
