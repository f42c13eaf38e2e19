#include "bootstrap.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "../base/tag.h"
#include "../base/types.h"
#include "../base/wire.h"
#include "../runtime/runtime.h"

namespace ddl {
namespace {

constexpr uint64_t kSlot = tag::slot(tag::kControlPhase, tag::kBootstrapStep);

}  // namespace

std::string encodeCards(const std::vector<RankCard>& cards) {
  Writer w;
  w.number(cards.size());
  for (const RankCard& c : cards) {
    w.number(static_cast<uint64_t>(c.rank));
    w.text(c.address);
    w.text(c.identity);
    w.text(c.locality);
    w.number(c.idTaken ? 1 : 0);
  }
  return w.take();
}

bool decodeCards(const std::string& bytes, std::vector<RankCard>* cards) {
  Reader r(bytes);
  const uint64_t n = r.number();
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    RankCard c;
    const uint64_t rank = r.number();
    if (rank > tag::kMaxRanks) return false;
    c.rank = static_cast<int>(rank);
    c.address = r.text();
    c.identity = r.text();
    c.locality = r.text();
    c.idTaken = r.number() != 0;
    cards->push_back(std::move(c));
  }
  return r.ok(true);
}

std::string encodeDirectory(const GroupDirectory& d) {
  Writer w;
  w.text(d.error.detail);
  w.number(d.incarnation);
  w.number(d.addresses.size());
  for (size_t r = 0; r < d.addresses.size(); ++r) {
    w.text(d.addresses[r]);
    w.text(d.identities[r]);
  }
  w.number(d.topology.levels.size());
  for (const Level& level : d.topology.levels) {
    w.text(level.name);
    w.number(level.blockNames.size());
    for (const std::string& name : level.blockNames) w.text(name);
    for (size_t r = 0; r < d.addresses.size(); ++r) {
      w.number(static_cast<uint64_t>(level.blockOf(static_cast<int>(r))));
    }
  }
  return w.take();
}

bool decodeDirectory(const std::string& bytes, int size, GroupDirectory* d) {
  Reader r(bytes);
  if (std::string words = r.text(); !words.empty()) {
    d->error = Status(StatusKind::kInvalidArgument, std::move(words));
  }
  d->incarnation = r.number();
  const uint64_t n = r.number();
  if (!r.ok() || n != static_cast<uint64_t>(size)) return false;
  d->addresses.resize(n);
  d->identities.resize(n);
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    d->addresses[i] = r.text();
    d->identities[i] = r.text();
  }
  d->topology = Topology{};
  d->topology.size = size;
  const uint64_t levels = r.number();
  for (uint64_t k = 0; k < levels && r.ok(); ++k) {
    std::string name = r.text();
    const uint64_t blocks = r.number();
    std::vector<std::string> names;
    for (uint64_t b = 0; b < blocks && r.ok(); ++b) names.push_back(r.text());
    std::vector<int> blockOf(n);
    for (uint64_t i = 0; i < n && r.ok(); ++i) {
      const uint64_t block = r.number();
      if (block >= blocks) return false;
      blockOf[i] = static_cast<int>(block);
    }
    Level level(std::move(name), blockOf);
    if (level.blocks() != static_cast<int>(blocks)) return false;  // a block of no rank
    level.blockNames = std::move(names);
    d->topology.levels.push_back(std::move(level));
  }
  return r.ok(true);
}

GroupDirectory directoryFrom(const std::vector<RankCard>& cards, const RackMap& racks,
                             uint32_t groupId) {
  GroupDirectory d;
  const size_t n = cards.size();
  d.addresses.resize(n);
  d.identities.resize(n);
  d.topology.size = static_cast<int>(n);
  std::vector<Locality> localities(n);
  std::vector<bool> seen(n, false);
  std::string taken;
  for (const RankCard& c : cards) {
    if (c.rank < 0 || static_cast<size_t>(c.rank) >= n || seen[c.rank]) {
      d.error = Status(StatusKind::kInvalidArgument,
                       "ddl: creating the group: rank " + std::to_string(c.rank) +
                           " answered twice or is not a rank of a group of " + std::to_string(n));
      return d;
    }
    seen[c.rank] = true;
    d.addresses[c.rank] = c.address;
    d.identities[c.rank] = c.identity;
    localities[c.rank] = Locality::decode(c.locality);
    if (c.idTaken) taken += (taken.empty() ? "" : ", ") + std::to_string(c.rank);
  }
  if (!taken.empty()) {
    d.error = Status(StatusKind::kInvalidArgument,
                     "ddl: cannot create another group: its id " + std::to_string(groupId) +
                         " (group ids are taken modulo " + std::to_string(tag::kGroupIds) +
                         ") is still held by a live group on rank(s) " + taken +
                         " of the new group; destroy the groups the job no longer uses");
    return d;
  }
  try {
    d.topology = buildTopology(localities, racks);
  } catch (const Error& e) {
    d.error = Status(StatusKind::kInvalidArgument, e.what());
  }
  return d;
}

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

Task bootstrapGroup(Op& op, std::shared_ptr<Group> group, RankCard mine, RackMap racks,
                    std::shared_ptr<GroupDirectory> out) {
  const int n = group->size;
  const int parent = bootstrapParent(group->rank);
  const std::vector<int> children = bootstrapChildren(group->rank, n);
  // 2. Up: the children's cards (a larger subtree answers later: the smallest first), then on.
  std::vector<RankCard> cards;
  cards.push_back(std::move(mine));
  for (int child : children) {
    std::string bytes;
    co_await receiveFramed(op, child, kSlot, kMaxCardBytes * static_cast<uint64_t>(n), &bytes);
    if (!decodeCards(bytes, &cards)) {
      throw Error("rank " + std::to_string(child) + " sent malformed cards");
    }
  }
  std::string down;
  if (parent >= 0) {
    co_await sendFramed(op, parent, kSlot, encodeCards(cards));
    co_await receiveFramed(op, parent, kSlot, kMaxCardBytes * static_cast<uint64_t>(n), &down);
    if (!decodeDirectory(down, n, out.get())) {
      throw Error("rank " + std::to_string(parent) + " sent a malformed directory");
    }
  } else {
    std::sort(cards.begin(), cards.end(),
              [](const RankCard& a, const RankCard& b) { return a.rank < b.rank; });
    if (cards.size() != static_cast<size_t>(n)) {
      throw Error(std::to_string(cards.size()) + " of " + std::to_string(n) + " ranks answered");
    }
    *out = directoryFrom(cards, racks, group->id);
    out->incarnation = group->runtime->newIncarnation();
    down = encodeDirectory(*out);
  }
  cards = {};
  // 3. Down, to the children, whose addresses are known now.
  for (size_t r = 0; r < out->addresses.size(); ++r) {
    group->directory->learn(static_cast<int>(r), out->addresses[r]);
  }
  const uint64_t downLength = down.size();
  std::vector<Request*> sends;
  for (int child : children) {
    sends.push_back(op.send(child, kSlot, &downLength, sizeof(downLength)));
    sends.push_back(op.send(child, kSlot, down.data(), down.size()));
  }
  co_await op.all(std::move(sends));
}

}  // namespace ddl
