#include "derivation.h"

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

// What a handle says of its process's settings (agreedSettings, config.h): those departing from
// the table's defaults, and the whole text's digest.
struct HandleSettings {
  std::string departing;
  uint64_t digest = 0;
};

// Handle `index` of a reconfigure's list, as the card creation would have had from it, and its
// process's settings into *settings where given.
RankCard decodeHandle(const std::string& h, int index, HandleSettings* settings = nullptr) {
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
  HandleSettings said;
  said.departing = reader.text();
  said.digest = reader.number();
  if (settings != nullptr) *settings = std::move(said);
  if (!reader.ok(true)) {
    throw Error("ddl: reconfigure: handle " + std::to_string(index) +
                " is cut short (or made by another version of torch_ddl)");
  }
  return card;
}

// Why the processes of `handles` cannot form a group: the settings that choose what an op runs,
// where a handle's differ from handle 0's ("" where none do). Every process given the list finds
// the same, before any message.
std::string settingsRefusal(const std::vector<HandleSettings>& said) {
  std::string words;
  const std::string first = agreedSettingsFrom(said[0].departing);
  for (size_t r = 1; r < said.size() && words.size() < 2000; ++r) {
    if (said[r].digest == said[0].digest && said[r].departing == said[0].departing) continue;
    const std::string handle = "for handle " + std::to_string(r);
    std::string these = differenceWords(
        settingDifferences(agreedSettingsFrom(said[r].departing), first), handle, "for handle 0");
    if (these.empty()) {  // the same departures from other defaults
      these = "the process " + handle + " has other defaults than that of handle 0 (another build)";
    }
    words += (words.empty() ? "" : "; ") + these;
  }
  if (words.empty()) return "";
  return "ddl: reconfigure: the processes' settings differ where they choose what an op runs, "
         "so their ops would not meet: " +
         words + ". Set them alike in every process";
}

// The cards of `handles` into *cards, and where `mine` is among them; throws where two are the
// same process's, `mine` is not there, or the processes' settings differ.
int positionAmong(const std::vector<std::string>& handles, const std::string& mine,
                  std::vector<RankCard>* cards) {
  const int n = static_cast<int>(handles.size());
  cards->assign(static_cast<size_t>(n), RankCard{});
  std::vector<HandleSettings> said(static_cast<size_t>(n));
  std::map<std::string, int> seen;
  int me = -1;
  for (int r = 0; r < n; ++r) {
    const std::string& h = handles[static_cast<size_t>(r)];
    (*cards)[static_cast<size_t>(r)] = decodeHandle(h, r, &said[static_cast<size_t>(r)]);
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
  const std::string refusal = settingsRefusal(said);
  if (!refusal.empty()) throw Error(refusal, StatusKind::kInvalidArgument);
  return me;
}

// Of the ranks `excluded` leaves out of a group of n, those that `rank` (a member) tells: each
// is told by the members at distances 1, 2, 4, ... from it either way, or, where none is, by
// members[x % M].
std::vector<int> ranksToTell(int rank, int n, const RankSet& members,
                             const std::vector<int>& excluded) {
  auto isMember = [&](int r) { return members.contains(r); };
  std::vector<int> mine;
  for (int x : excluded) {
    bool told = false, me = false;
    for (int step = 1; step < n && !me; step <<= 1) {
      for (int r : {(x + step) % n, (x - step % n + n) % n}) {
        if (!isMember(r)) continue;
        told = true;
        me = me || r == rank;
      }
    }
    if (!told && members.size() > 0) me = members.at(x % members.size()) == rank;
    if (me) mine.push_back(x);
  }
  return mine;
}

// Past 65 536 ranks a reconfigure's agreement carries the top group ids besides the agreements'
// own (base/tag.h): held until it ends, and refused while a group of this process holds one.
std::shared_ptr<void> holdAgreementIds(Engine& engine, int n) {
  const int wide = tag::wideBits(n);
  if (wide == 0) return nullptr;
  uint32_t taken = 0;
  if (!engine.holdAgreementIds(wide, &taken)) {
    throw Error("ddl: reconfigure: the agreement of a group of " + std::to_string(n) +
                    " ranks carries group ids from " +
                    std::to_string(tag::kAgreementGroup + 1 - (1u << wide)) +
                    " up, and this process holds group id " + std::to_string(taken) +
                    " (a live group's, or one destroyed less than " +
                    std::to_string(GroupNotices::kGraveLife.count()) +
                    " s ago): destroy that group and wait",
                StatusKind::kInvalidArgument);
  }
  Engine* held = &engine;
  return std::shared_ptr<void>(nullptr, [held, wide](void*) { held->releaseAgreementIds(wide); });
}

}  // namespace

std::vector<std::string> Derivation::orderHandles(std::vector<std::string> handles) {
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

std::string Derivation::handle(Engine& engine) {
  Writer w;
  w.text(engine.localAddress());
  w.text(ProcessIdentity::self().encode());
  w.text(Locality::self().encode());
  w.text(agreedSettingsDeparting(engine.config()));
  w.number(settingsDigest(agreedSettings(engine.config())));
  return kHandlePrefix + toHex(w.take());
}

std::unique_ptr<Derivation> Derivation::start(Communicator& parent, const RankSet& members,
                                              const std::string& request, const char* what,
                                              uint32_t sequence, const std::vector<int>& excluded) {
  Engine& engine = *parent.engine_;
  const int rank = parent.rank(), n = parent.size();
  auto agreement = std::make_shared<Group>();
  agreement->runtime = &engine.runtime();
  agreement->rank = rank;
  agreement->size = n;
  agreement->id = tag::kAgreementGroup;
  agreement->name = parent.group_->name + "'s " + what;
  // The members' addresses alone: the agreement fails as soon as one of them is known gone, and
  // not for the ranks it leaves out.
  agreement->directory = PeerDirectory::only(parent.group_->directory, members);
  // This rank's place among the members: its rank in the group made.
  const int place = members.indexOf(rank);
  DeriveCard card;
  card.rank = place;
  card.parentRank = rank;
  card.request = request;
  for (bool held : engine.heldGroupIds()) card.heldIds.push_back(held ? 1 : 0);
  // A member that is gone (one this rank did not know of, or a view that still has it) fails
  // the agreement within milliseconds, not at its timeout: the members on this host are watched,
  // and those whose endpoints the parent opened are known by them.
  Identities identities;
  for (const auto& [r, identity] : parent.identities_) {
    if (members.contains(r)) identities.emplace(r, identity);
  }
  std::unordered_map<int, PeerId> endpoints;  // the parent's, for the ranks left out
  engine.call([&] {
    for (const auto& [m, peer] : parent.group_->peers) {
      if (members.contains(m)) agreement->peers[m] = peer;
    }
    endpoints = parent.group_->peers;
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
  a.everyone->directory = parent.group_->directory;
  a.sequence = sequence;
  a.attempt = sequence;  // a retry is the next call of the parent: another sequence
  a.ended = &engine.endedAgreements();
  a.members = members;
  a.excluded = excluded;
  std::sort(a.excluded.begin(), a.excluded.end());
  a.what = what;
  a.timeout = parent.timeout_;
  // Each rank left out is told by the members at distances 1, 2, 4, ... from it either way (or,
  // where none is, by members[x % M]), not by every member: a shrink that leaves out half a
  // group of 866 cost each member an endpoint to every rank left out (P^2 / 4 words; a
  // campaign's finding). A member tells at most 2 log2(P) ranks, and a rank left out hears from
  // members spread round the group, so that some are in an agreement of this view when views
  // differ (they fail at once, not at the timeout). Two groups cannot both form meanwhile: each
  // needs a quorum (or a caller that knows the others are dead).
  const std::vector<int> mine = ranksToTell(rank, n, members, a.excluded);
  std::vector<std::shared_ptr<Work>> told;
  if (!mine.empty()) {
    told = tellRanks(a, mine,
                     std::string("the ranks were asked for different groups: rank ") +
                         std::to_string(rank) + " was asked to " + request + " (" + what +
                         "), which leaves this rank out",
                     endpoints, StatusKind::kMismatch);
  }
  auto d = std::unique_ptr<Derivation>(new Derivation(engine, what));
  d->work_ =
      startAgreement(a, std::move(card), std::move(told),
                     engine.clock().now() + std::min(parent.timeout_, kTellWait), d->result_);
  d->describe(parent, members, place, identities);
  return d;
}

void Derivation::describe(const Communicator& parent, const RankSet& members, int place,
                          const Identities& identities) {
  rank_ = place;
  directory_ = PeerDirectory::renumbered(parent.group_->directory, members);
  size_ = members.size();
  for (const auto& [r, identity] : identities) {  // renumbered: member i is rank i
    identities_.emplace(members.indexOf(r), identity);
  }
  topology_ = restrictTopology(parent.topology(), members);
  links_ = parent.links();
  request_ = parent.book_->request();
  hierarchical_ = parent.book_->hierarchical();
  timeout_ = parent.timeout_;
  how_ = "derived from " + parent.group_->name;
}

std::unique_ptr<Derivation> Derivation::shrink(Communicator& parent,
                                               const std::vector<int>& excluded, bool abortFirst,
                                               bool requireQuorum) {
  const char* name = "shrink_group";
  // Every call counts, also one refused here below (bad ranks, no quorum): the ranks that asked
  // rightly went ahead, and a retry by all of them must take one number everywhere.
  const uint32_t sequence = parent.nextAgreement(name);
  std::vector<bool> out(static_cast<size_t>(parent.size()), false);
  std::string listed;  // "1, 3"
  std::vector<int> sorted = excluded;
  std::sort(sorted.begin(), sorted.end());
  for (int r : sorted) {
    if (r < 0 || r >= parent.size()) {
      throw refuse(
          parent, name, sequence,
          Error(parent.where(name) + ": rank " + std::to_string(r) +
                    " to exclude is not a rank of a group of " + std::to_string(parent.size()),
                StatusKind::kInvalidArgument));
    }
    if (out[r]) {
      throw refuse(parent, name, sequence,
                   Error(parent.where(name) + ": rank " + std::to_string(r) + " is excluded twice",
                         StatusKind::kInvalidArgument));
    }
    if (r == parent.rank()) {
      throw refuse(
          parent, name, sequence,
          Error(parent.where(name) +
                    ": this rank is among those to exclude; an excluded rank does not call "
                    "shrink_group",
                StatusKind::kInvalidArgument));
    }
    out[r] = true;
    listed += (listed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (sorted.empty()) {
    throw refuse(parent, name, sequence,
                 Error(parent.where(name) + ": no rank to exclude", StatusKind::kInvalidArgument));
  }
  const RankSet members = RankSet::allBut(parent.size(), sorted);
  // The quorum: the members go on only as a majority of this group, or exactly half of it with
  // its rank 0. A partition's two sides then never both go on: the other side's shrink fails.
  const int n = parent.size();
  const bool quorum = members.size() * 2 > n || (members.size() * 2 == n && !out[0]);
  if (requireQuorum && !quorum) {
    throw refuse(
        parent, name, sequence,
        Error(Status(StatusKind::kPartitioned,
                     parent.where(name) + ": the " + std::to_string(members.size()) +
                         " ranks left of " + std::to_string(n) +
                         " are no quorum (more than half, or half with rank 0): the others may "
                         "be alive and cut off, and go on as a group of their own; a caller "
                         "that knows they are gone shrinks with the quorum not required",
                     sorted)));
  }
  if (abortFirst) {
    parent.close(parent.group_->name + " is being shrunk (SHRINK_ABORT) to exclude rank" +
                 (sorted.size() > 1 ? "s " : " ") + listed);
  }
  return start(parent, members, "exclude " + listed, name, sequence, sorted);
}

Error Derivation::refuse(Communicator& parent, const char* what, uint32_t sequence, Error error) {
  // The others' agreement of this call fails at once with these words (each member that hears
  // them tells the ranks at distances 1, 2, 4, ... after it), instead of waiting for this rank's
  // card until its timeout.
  Agreement a;
  a.everyone = std::make_shared<Group>();
  a.everyone->runtime = &parent.engine_->runtime();
  a.everyone->rank = parent.rank();
  a.everyone->size = parent.size();
  a.everyone->id = tag::kAgreementGroup;
  a.everyone->name = parent.group_->name + "'s " + what;
  a.everyone->directory = parent.group_->directory;
  parent.engine_->call([&] { a.everyone->peers = parent.group_->peers; });
  a.group = a.everyone;
  a.sequence = sequence;
  a.attempt = sequence;
  a.what = what;
  a.timeout = parent.timeout_;
  // To the ranks at distances 1, 2, 4, ... after this one among those not known gone: the
  // ranks right after it may all be dead (a host of them, which is why a shrink is called).
  try {
    tellRanks(a, successorsAmong(parent.rank(), parent.size(), parent.goneRanks()),
              "rank " + std::to_string(parent.rank()) + " refused its call to " + what + ": " +
                  error.what(),
              {}, error.kind());
  } catch (...) {  // out of memory: the others time out instead
  }
  return error;
}

std::unique_ptr<Derivation> Derivation::split(Communicator& parent, const std::vector<int>& ranks) {
  const char* name = "split_group";
  // Every rank of this group calls split (torch's contract, as for NCCL's): every call counts,
  // the ones left out and the ones refused below too, so that later agreements keep one
  // numbering on every rank.
  const uint32_t sequence = parent.nextAgreement(name);
  std::vector<int> members = ranks;
  std::sort(members.begin(), members.end());
  std::string asked;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= parent.size()) {
      throw refuse(parent, name, sequence,
                   Error(parent.where(name) + ": rank " + std::to_string(members[i]) +
                             " is not a rank of a group of " + std::to_string(parent.size()),
                         StatusKind::kInvalidArgument));
    }
    if (i > 0 && members[i] == members[i - 1]) {
      throw refuse(
          parent, name, sequence,
          Error(parent.where(name) + ": rank " + std::to_string(members[i]) + " is named twice",
                StatusKind::kInvalidArgument));
    }
    asked += (asked.empty() ? "form a group of ranks " : ", ") + std::to_string(members[i]);
  }
  if (!std::binary_search(members.begin(), members.end(), parent.rank())) {
    auto d = std::unique_ptr<Derivation>(new Derivation(*parent.engine_, name));
    d->member_ = false;
    d->work_ = std::make_shared<Work>(name);
    d->work_->succeed();
    return d;
  }
  return start(parent, RankSet::listed(std::move(members)), asked, name, sequence);
}

std::shared_ptr<Communicator> Derivation::finish() {
  if (!member_) return nullptr;
  if (!work_->done()) throw Error("ddl: " + what_ + " has not finished");
  if (work_->failed()) {
    Status error = work_->status();
    error.detail += result_->asked;
    throw Error(error);
  }
  if (!result_->error.ok()) throw Error(result_->error);
  Engine& engine = *engine_;
  const uint32_t id = result_->id;
  if (!engine.claimGroupId(id, tag::wideBits(size_))) {
    throw Error("ddl: " + what_ + ": the id " + std::to_string(id) +
                " agreed was taken here meanwhile (another group's creation); try again");
  }
  auto group = std::make_shared<Group>();
  group->rank = rank_;
  group->size = size_;
  group->id = id;
  group->incarnation = result_->incarnation;
  group->directory = directory_;
  Communicator::nameGroup(*group, engine);
  auto book = PlanBook::forMachine(std::move(topology_), links_, request_, hierarchical_);
  group->printRing = printRing(rank_, size_, book->blockStages(false).get());
  engine.notices().open(group);
  engine.watch(group, identities_);
  auto comm =
      std::shared_ptr<Communicator>(new Communicator(engine, group, timeout_, std::move(book)));
  comm->ownsId_ = true;
  comm->identities_ = std::move(identities_);
  comm->logCreation(how_.c_str());
  return comm;
}

std::shared_ptr<Communicator> Derivation::await() {
  work_->wait();
  return finish();
}

std::unique_ptr<Derivation> Derivation::reconfigure(Engine& engine,
                                                    const std::vector<std::string>& handles,
                                                    int64_t uuid, std::chrono::milliseconds timeout,
                                                    const LinkCosts* links) {
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
  GroupDirectory directory = directoryFrom(cards, *sharedRackMap(settings.topology), 0);
  if (!directory.error.ok()) throw Error(directory.error);
  std::shared_ptr<void> agreementIds = holdAgreementIds(engine, n);
  // The members agree on what they were given and on an id, as a derived group's do, under a
  // sequence every member computes from the uuid.
  auto agreement = std::make_shared<Group>();
  agreement->runtime = &engine.runtime();
  agreement->rank = me;
  agreement->size = n;
  agreement->id = tag::kAgreementGroup;
  agreement->name = "reconfigure " + std::to_string(uuid);
  agreement->directory = PeerDirectory::of(directory.addresses);
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
  const RankSet members = RankSet::allBut(n, {});
  const auto sequence = static_cast<uint32_t>(digest & 0xffff);
  Identities identities;
  for (int r = 0; r < n; ++r) {
    if (r != me && !directory.identities[r].empty()) {
      identities.emplace(r, ProcessIdentity::decode(directory.identities[r]));
    }
  }
  engine.watch(agreement, identities);
  auto d = std::unique_ptr<Derivation>(new Derivation(engine, what));
  d->agreementIds_ = std::move(agreementIds);
  Agreement a;
  a.group = agreement;
  a.everyone = agreement;
  a.sequence = sequence;
  a.attempt = static_cast<uint64_t>(uuid);  // the same handles again: a new uuid, a new attempt
  a.ended = &engine.endedAgreements();
  a.members = members;
  a.what = what;
  a.timeout = timeout;
  d->work_ = startAgreement(a, std::move(card), {}, TimePoint::max(), d->result_);
  d->rank_ = me;
  d->directory_ = agreement->directory;
  d->size_ = n;
  d->identities_ = std::move(identities);
  d->topology_ = std::move(directory.topology);
  d->links_ = links != nullptr ? *links : parseLinks(settings.links);
  if (links == nullptr) d->links_.segmentBytes = static_cast<double>(settings.segmentBytes);
  d->request_ = planRequest(settings);
  d->hierarchical_ = settings.hierarchical;
  d->timeout_ = timeout;
  d->how_ = "reconfigured (uuid " + std::to_string(uuid) + ")";
  return d;
}

}  // namespace ddl
