// shrink, split and reconfigure: groups made without the store, by the ranks that will be in
// them (group/agreement.h), each in two halves (begin*, finishDerivation) so that a driver that
// must not block (the simulator) runs them as it runs collectives; the blocking calls wait
// between the halves.
#include <algorithm>
#include <map>

#include "../base/config.h"
#include "../base/tag.h"
#include "../base/wire.h"
#include "communicator.h"

namespace ddl {
namespace {

constexpr char kHandlePrefix[] = "ddl1:";

std::string toHex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

bool fromHex(const std::string& text, size_t from, std::string* bytes) {
  if ((text.size() - from) % 2 != 0) return false;
  auto value = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  for (size_t i = from; i < text.size(); i += 2) {
    const int hi = value(text[i]), lo = value(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

// Handle `index` of a reconfigure's list, as the card creation would have had from it.
RankCard decodeHandle(const std::string& h, int index) {
  std::string bytes;
  const size_t prefix = sizeof(kHandlePrefix) - 1;
  if (h.compare(0, prefix, kHandlePrefix) != 0 || !fromHex(h, prefix, &bytes)) {
    throw Error("ddl: reconfigure: handle " + std::to_string(index) +
                " is not a ddl reconfigure handle (get_reconfigure_handle() of a ddl group)");
  }
  Reader reader(bytes);
  RankCard card;
  card.rank = index;
  card.address = reader.text();
  card.identity = reader.text();
  card.locality = reader.text();
  if (!reader.ok(true)) {
    throw Error("ddl: reconfigure: handle " + std::to_string(index) + " is cut short");
  }
  return card;
}

// The cards of `handles` into *cards, and where `mine` is among them; throws where two are the
// same process's or `mine` is not there.
int positionAmong(const std::vector<std::string>& handles, const std::string& mine,
                  std::vector<RankCard>* cards) {
  const int n = static_cast<int>(handles.size());
  cards->assign(static_cast<size_t>(n), RankCard{});
  std::map<std::string, int> seen;
  int me = -1;
  for (int r = 0; r < n; ++r) {
    const std::string& h = handles[static_cast<size_t>(r)];
    (*cards)[static_cast<size_t>(r)] = decodeHandle(h, r);
    auto [at, inserted] = seen.emplace(h, r);
    if (!inserted) {
      throw Error("ddl: reconfigure: handles " + std::to_string(at->second) + " and " +
                      std::to_string(r) + " are the same process's",
                  StatusKind::kInvalidArgument);
    }
    if (h == mine) me = r;
  }
  if (me < 0) {
    throw Error("ddl: reconfigure: this process's handle is not among the " + std::to_string(n) +
                    " given (a process reconfigures only a group it is a member of)",
                StatusKind::kInvalidArgument);
  }
  return me;
}

}  // namespace

std::vector<std::string> Communicator::orderHandles(std::vector<std::string> handles) {
  std::vector<std::pair<std::string, std::string>> keyed;  // (host, handle)
  for (size_t i = 0; i < handles.size(); ++i) {
    const Locality where = Locality::decode(decodeHandle(handles[i], static_cast<int>(i)).locality);
    keyed.emplace_back(where.hostName + "/" + where.machineKey, std::move(handles[i]));
  }
  std::sort(keyed.begin(), keyed.end());
  handles.clear();
  for (auto& [host, h] : keyed) handles.push_back(std::move(h));
  return handles;
}

std::string Communicator::handle(Engine& engine) {
  Writer w;
  w.text(engine.localAddress());
  w.text(ProcessIdentity::self().encode());
  w.text(Locality::self().encode());
  return kHandlePrefix + toHex(w.take());
}

std::unique_ptr<Communicator::Derivation> Communicator::startDerivation(
    const std::vector<int>& members, const std::string& request, const char* what,
    uint32_t sequence, const std::vector<int>& excluded) {
  Engine& engine = *engine_;
  auto agreement = std::make_shared<Group>();
  agreement->runtime = &engine.runtime();
  agreement->rank = rank();
  agreement->size = size();
  agreement->id = tag::kAgreementGroup;
  agreement->name = group_->name + "'s " + what;
  // The members' addresses alone: the agreement fails as soon as one of them is known gone, and
  // not for the ranks it leaves out.
  agreement->addresses.assign(static_cast<size_t>(size()), "");
  for (int m : members) agreement->addresses[m] = group_->addresses[m];
  agreement->peers.assign(static_cast<size_t>(size()), -1);
  DeriveCard card;
  card.rank =
      static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  card.parentRank = rank();
  card.request = request;
  for (bool held : engine.heldGroupIds()) card.heldIds.push_back(held ? 1 : 0);
  // A member that is gone (one this rank did not know of, or a view that still has it) fails
  // the agreement within milliseconds, not at its timeout: the members on this host are watched,
  // and those whose endpoints the parent opened are known by them.
  std::vector<ProcessIdentity> identities(static_cast<size_t>(size()));
  for (int m : members) {
    if (static_cast<size_t>(m) < identities_.size()) identities[m] = identities_[m];
  }
  std::vector<PeerId> endpoints;  // the parent's, for the ranks left out
  engine.call([&] {
    for (int m : members) agreement->peers[m] = group_->peers[m];
    endpoints = group_->peers;
  });
  engine.watch(agreement, identities);
  // The ranks left out are told first, in the agreement's word of failure: one that is alive and
  // in an agreement of this call of its own (a view that differs, whoever leads it) ends it at
  // once naming this request, and its members tell theirs; a dead one, or one that keeps to the
  // contract and does not call, never reads it. This rank's card goes up only once its words
  // have left (a connection they needed is made), within kTellWait: two views can then both
  // form a group only where each one's members heard their answer, two messages deep, before
  // the other's word, one message, reached them.
  Agreement a;
  a.group = agreement;
  a.everyone = std::make_shared<Group>(*agreement);
  a.everyone->addresses = group_->addresses;
  a.sequence = sequence;
  a.attempt = sequence;  // a retry is the next call of the parent: another sequence
  a.ended = &engine.endedAgreements();
  a.members = members;
  a.excluded = excluded;
  std::sort(a.excluded.begin(), a.excluded.end());
  a.what = what;
  a.timeout = timeout_;
  // Each rank left out is told by the members at distances 1, 2, 4, ... from it either way (or,
  // where none is, by members[x % M]), not by every member: a shrink that leaves out half a
  // group of 866 cost each member an endpoint to every rank left out (P^2 / 4 words; a
  // campaign's finding). A member tells at most 2 log2(P) ranks, and a rank left out hears from
  // members spread round the group, so that some are in an agreement of this view when views
  // differ (they fail at once, not at the timeout). Two groups cannot both form meanwhile: each
  // needs a quorum (or a caller that knows the others are dead).
  const int n = size();
  auto isMember = [&](int r) { return std::binary_search(members.begin(), members.end(), r); };
  std::vector<int> mine;
  for (int x : a.excluded) {
    bool told = false, me = false;
    for (int step = 1; step < n && !me; step <<= 1) {
      for (int r : {(x + step) % n, (x - step % n + n) % n}) {
        if (!isMember(r)) continue;
        told = true;
        me = me || r == rank();
      }
    }
    if (!told && !members.empty()) me = members[static_cast<size_t>(x) % members.size()] == rank();
    if (me) mine.push_back(x);
  }
  std::vector<std::shared_ptr<Work>> told;
  if (!mine.empty()) {
    told = tellRanks(a, mine,
                     std::string("the ranks were asked for different groups: rank ") +
                         std::to_string(rank()) + " was asked to " + request + " (" + what +
                         "), which leaves this rank out",
                     endpoints, StatusKind::kMismatch);
  }
  auto d = std::make_unique<Derivation>();
  d->engine = &engine;
  d->what = what;
  d->result = std::make_shared<DeriveResult>();
  d->work = startAgreement(a, std::move(card), std::move(told),
                           engine.clock().now() + std::min(timeout_, kTellWait), d->result);
  d->rank =
      static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  for (int m : members) {
    d->addresses.push_back(group_->addresses[m]);
    d->identities.push_back(static_cast<size_t>(m) < identities_.size() ? identities_[m]
                                                                        : ProcessIdentity{});
  }
  d->topology = restrictTopology(topology(), members);
  d->links = links();
  d->request = book_->request();
  d->hierarchical = book_->hierarchical();
  d->timeout = timeout_;
  d->how = "derived from " + group_->name;
  return d;
}

std::unique_ptr<Communicator::Derivation> Communicator::beginShrink(
    const std::vector<int>& excluded, bool abortFirst, bool requireQuorum) {
  const char* name = "shrink_group";
  // Every call counts, also one refused here below (bad ranks, no quorum): the ranks that asked
  // rightly went ahead, and a retry by all of them must take one number everywhere.
  const uint32_t sequence = nextAgreement(name);
  std::vector<bool> out(static_cast<size_t>(size()), false);
  std::string listed;  // "1, 3"
  std::vector<int> sorted = excluded;
  std::sort(sorted.begin(), sorted.end());
  for (int r : sorted) {
    if (r < 0 || r >= size()) {
      throw refuseDerivation(
          name, sequence,
          Error(where(name) + ": rank " + std::to_string(r) +
                    " to exclude is not a rank of a group of " + std::to_string(size()),
                StatusKind::kInvalidArgument));
    }
    if (out[r]) {
      throw refuseDerivation(
          name, sequence,
          Error(where(name) + ": rank " + std::to_string(r) + " is excluded twice",
                StatusKind::kInvalidArgument));
    }
    if (r == rank()) {
      throw refuseDerivation(
          name, sequence,
          Error(where(name) +
                    ": this rank is among those to exclude; an excluded rank does not call "
                    "shrink_group",
                StatusKind::kInvalidArgument));
    }
    out[r] = true;
    listed += (listed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (sorted.empty()) {
    throw refuseDerivation(
        name, sequence, Error(where(name) + ": no rank to exclude", StatusKind::kInvalidArgument));
  }
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) {
    if (!out[r]) members.push_back(r);
  }
  // The quorum: the members go on only as a majority of this group, or exactly half of it with
  // its rank 0. A partition's two sides then never both go on: the other side's shrink fails.
  const size_t n = static_cast<size_t>(size());
  const bool quorum = members.size() * 2 > n || (members.size() * 2 == n && !out[0]);
  if (requireQuorum && !quorum) {
    throw refuseDerivation(
        name, sequence,
        Error(Status(StatusKind::kPartitioned,
                     where(name) + ": the " + std::to_string(members.size()) + " ranks left of " +
                         std::to_string(n) +
                         " are no quorum (more than half, or half with rank 0): the others may "
                         "be alive and cut off, and go on as a group of their own; a caller "
                         "that knows they are gone shrinks with the quorum not required",
                     sorted)));
  }
  if (abortFirst) {
    close(group_->name + " is being shrunk (SHRINK_ABORT) to exclude rank" +
          (sorted.size() > 1 ? "s " : " ") + listed);
  }
  return startDerivation(members, "exclude " + listed, name, sequence, sorted);
}

std::shared_ptr<Communicator> Communicator::shrink(const std::vector<int>& excluded,
                                                   bool abortFirst, bool requireQuorum) {
  std::unique_ptr<Derivation> d = beginShrink(excluded, abortFirst, requireQuorum);
  d->work->wait();
  return finishDerivation(*d);
}

Error Communicator::refuseDerivation(const char* what, uint32_t sequence, Error error) {
  // The others' agreement of this call fails at once with these words (each member that hears
  // them tells the ranks at distances 1, 2, 4, ... after it), instead of waiting for this rank's
  // card until its timeout.
  Agreement a;
  a.everyone = std::make_shared<Group>();
  a.everyone->runtime = &engine_->runtime();
  a.everyone->rank = rank();
  a.everyone->size = size();
  a.everyone->id = tag::kAgreementGroup;
  a.everyone->name = group_->name + "'s " + what;
  a.everyone->addresses = group_->addresses;
  engine_->call([&] { a.everyone->peers = group_->peers; });
  a.group = a.everyone;
  a.sequence = sequence;
  a.attempt = sequence;
  a.what = what;
  a.timeout = timeout_;
  // To the ranks at distances 1, 2, 4, ... after this one among those not known gone: the
  // ranks right after it may all be dead (a host of them, which is why a shrink is called).
  try {
    tellRanks(
        a, successorsAmong(rank(), size(), goneRanks()),
        "rank " + std::to_string(rank()) + " refused its call to " + what + ": " + error.what(), {},
        error.kind());
  } catch (...) {  // out of memory: the others time out instead
  }
  return error;
}

uint32_t Communicator::nextAgreement(const char* what) {
  // From what the ranks share: the parent, the call, how many times it was made of the parent
  // before. Not from the request itself: ranks asked different things must meet to find out.
  const std::string key =
      std::to_string(group_->id) + "/" + what + "/" + std::to_string(derivations_[what]++);
  return static_cast<uint32_t>(std::hash<std::string>{}(key)&0xffff);
}

std::unique_ptr<Communicator::Derivation> Communicator::beginSplit(const std::vector<int>& ranks) {
  const char* name = "split_group";
  // Every rank of this group calls split (torch's contract, as for NCCL's): every call counts,
  // the ones left out and the ones refused below too, so that later agreements keep one
  // numbering on every rank.
  const uint32_t sequence = nextAgreement(name);
  std::vector<int> members = ranks;
  std::sort(members.begin(), members.end());
  std::string asked;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= size()) {
      throw refuseDerivation(name, sequence,
                             Error(where(name) + ": rank " + std::to_string(members[i]) +
                                       " is not a rank of a group of " + std::to_string(size()),
                                   StatusKind::kInvalidArgument));
    }
    if (i > 0 && members[i] == members[i - 1]) {
      throw refuseDerivation(
          name, sequence,
          Error(where(name) + ": rank " + std::to_string(members[i]) + " is named twice",
                StatusKind::kInvalidArgument));
    }
    asked += (asked.empty() ? "form a group of ranks " : ", ") + std::to_string(members[i]);
  }
  if (!std::binary_search(members.begin(), members.end(), rank())) {
    auto d = std::make_unique<Derivation>();
    d->engine = engine_;
    d->what = name;
    d->member = false;
    d->work = std::make_shared<Work>(name);
    d->work->succeed();
    return d;
  }
  return startDerivation(members, asked, name, sequence);
}

std::shared_ptr<Communicator> Communicator::split(const std::vector<int>& ranks) {
  std::unique_ptr<Derivation> d = beginSplit(ranks);
  d->work->wait();
  return finishDerivation(*d);
}

std::shared_ptr<Communicator> Communicator::finishDerivation(Derivation& d) {
  if (!d.member) return nullptr;
  if (!d.work->done()) throw Error("ddl: " + d.what + " has not finished");
  if (d.work->failed()) {
    Status error = d.work->status();
    error.detail += d.result->asked;
    throw Error(error);
  }
  if (!d.result->error.ok()) throw Error(d.result->error);
  Engine& engine = *d.engine;
  const uint32_t id = d.result->id;
  if (!engine.claimGroupId(id)) {
    throw Error("ddl: " + d.what + ": the id " + std::to_string(id) +
                " agreed was taken here meanwhile (another group's creation); try again");
  }
  auto group = std::make_shared<Group>();
  group->rank = d.rank;
  group->size = static_cast<int>(d.addresses.size());
  group->id = id;
  group->incarnation = d.result->incarnation;
  group->addresses = d.addresses;
  group->peers.assign(d.addresses.size(), -1);
  nameGroup(*group, engine);
  engine.notices().open(group);
  engine.watch(group, d.identities);
  auto book = PlanBook::forMachine(std::move(d.topology), d.links, d.request, d.hierarchical);
  auto comm =
      std::shared_ptr<Communicator>(new Communicator(engine, group, d.timeout, std::move(book)));
  comm->ownsId_ = true;
  comm->identities_ = std::move(d.identities);
  comm->logCreation(d.how.c_str());
  return comm;
}

std::unique_ptr<Communicator::Derivation> Communicator::beginReconfigure(
    Engine& engine, const std::vector<std::string>& handles, int64_t uuid,
    std::chrono::milliseconds timeout, const LinkCosts* links) {
  const std::string what = "reconfigure";
  const int n = static_cast<int>(handles.size());
  if (n == 0) throw Error("ddl: reconfigure: no handles given", StatusKind::kInvalidArgument);
  if (static_cast<uint32_t>(n) > tag::kMaxRanks) {
    throw Error("ddl: reconfigure: " + std::to_string(n) + " handles; groups are limited to " +
                    std::to_string(tag::kMaxRanks) + " ranks",
                StatusKind::kInvalidArgument);
  }
  std::vector<RankCard> cards;
  const int me = positionAmong(handles, handle(engine), &cards);
  const Config& settings = engine.config();
  GroupDirectory directory = directoryFrom(cards, parseRackMap(settings.topology), 0);
  if (!directory.error.ok()) throw Error(directory.error);
  // The members agree on what they were given and on an id, as a derived group's do, under a
  // sequence every member computes from the uuid.
  auto agreement = std::make_shared<Group>();
  agreement->runtime = &engine.runtime();
  agreement->rank = me;
  agreement->size = n;
  agreement->id = tag::kAgreementGroup;
  agreement->name = "reconfigure " + std::to_string(uuid);
  agreement->addresses = directory.addresses;
  agreement->peers.assign(static_cast<size_t>(n), -1);
  // Under a sequence from the handles: processes given the same handles meet and compare their
  // uuids (a mismatch is named); processes given other lists cannot be waited for by name.
  std::string listed;
  for (const std::string& h : handles) listed += h + "\n";
  const uint64_t digest = std::hash<std::string>{}(listed);
  DeriveCard card;
  card.rank = me;
  card.parentRank = me;
  card.request = "reconfigure with uuid " + std::to_string(uuid);
  for (bool held : engine.heldGroupIds()) card.heldIds.push_back(held ? 1 : 0);
  std::vector<int> members(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) members[static_cast<size_t>(r)] = r;
  const auto sequence = static_cast<uint32_t>(digest & 0xffff);
  std::vector<ProcessIdentity> identities(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (r != me && !directory.identities[r].empty()) {
      identities[r] = ProcessIdentity::decode(directory.identities[r]);
    }
  }
  engine.watch(agreement, identities);
  auto d = std::make_unique<Derivation>();
  d->engine = &engine;
  d->what = what;
  d->result = std::make_shared<DeriveResult>();
  Agreement a;
  a.group = agreement;
  a.everyone = agreement;
  a.sequence = sequence;
  a.attempt = static_cast<uint64_t>(uuid);  // the same handles again: a new uuid, a new attempt
  a.ended = &engine.endedAgreements();
  a.members = members;
  a.what = what;
  a.timeout = timeout;
  d->work = startAgreement(a, std::move(card), {}, TimePoint::max(), d->result);
  d->rank = me;
  d->addresses = directory.addresses;
  d->identities = std::move(identities);
  d->topology = std::move(directory.topology);
  d->links = links != nullptr ? *links : parseLinks(settings.links);
  if (links == nullptr) d->links.segmentBytes = static_cast<double>(settings.segmentBytes);
  d->request = planRequest(settings);
  d->hierarchical = settings.hierarchical;
  d->timeout = timeout;
  d->how = "reconfigured (uuid " + std::to_string(uuid) + ")";
  return d;
}

std::shared_ptr<Communicator> Communicator::reconfigure(Engine& engine,
                                                        const std::vector<std::string>& handles,
                                                        int64_t uuid,
                                                        std::chrono::milliseconds timeout,
                                                        const LinkCosts* links) {
  std::unique_ptr<Derivation> d = beginReconfigure(engine, handles, uuid, timeout, links);
  d->work->wait();
  return finishDerivation(*d);
}

}  // namespace ddl
