#include "notices.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "../base/tag.h"
#include "../runtime/op.h"

namespace ddl {

Notice GroupNotices::notice(Notice::Type type, uint32_t sequence) const {
  Notice n;
  n.sequence = sequence;
  n.incarnation = incarnation;
  n.type = type;
  n.from = group->rank;
  return n;
}

namespace {

constexpr uint64_t kNoticeSlot = tag::slot(tag::kControlPhase, tag::kNoticeStep);

// The ranks at distances 1, 2, 4, ... before and after `rank` in a group of n: whom it watches.
std::set<int> neighbours(int rank, int n) {
  std::set<int> peers;
  for (int step = 1; step < n; step <<= 1) {
    peers.insert((rank + step) % n);
    peers.insert((rank + n - step) % n);
  }
  peers.erase(rank);
  return peers;
}

std::string joinRanks(const std::set<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

std::set<int> splitRanks(const std::string& text) {
  std::set<int> ranks;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    try {
      ranks.insert(std::stoi(text.substr(at, end - at)));
    } catch (const std::exception&) {
    }
    at = end + 1;
  }
  return ranks;
}

}  // namespace

void Notices::reportWaits(Op& op) {
  // With two ranks the one waited for is the other: nothing to follow.
  if (!op.callCheck().on() || op.size() <= 2 || op.group().notices == nullptr) return;
  GroupNotices& control = *op.group().notices;
  if (!control.open) return;
  const Waits waits = waitsOf(op);
  Notice notice = control.notice(Notice::Type::kWaiting, op.sequence());
  notice.text = joinRanks(waits.peers) + ";" + joinRanks(waits.notStarted);
  if (op.size() <= kWaitReportsToAll) {
    sendNotice(control, notice);
    return;
  }
  // A large group: only to ranks this op sent to, the ones that may be waiting for it, and of
  // them at most 2 log2(P), those with messages still outstanding first (an all_to_all sends to
  // every rank: all P of them reporting to all would be (P - 1)^2 messages).
  notice.tree = false;
  const std::string bytes = notice.encode();
  const std::set<int> sent = op.sentTo();
  std::vector<int> to;
  for (int peer : sent) {
    if (waits.peers.count(peer)) to.push_back(peer);
  }
  for (int peer : sent) {
    if (!waits.peers.count(peer)) to.push_back(peer);
  }
  const size_t most = 2 * static_cast<size_t>(std::ceil(std::log2(op.size())));
  if (to.size() > most) to.resize(most);
  for (int peer : to) sendNoticeTo(control, notice, bytes, peer);
}

void Notices::open(const std::shared_ptr<Group>& group) {
  auto control = std::make_shared<GroupNotices>();
  control->board = this;
  control->runtime = &runtime_;
  control->group = group.get();
  control->owner = group;
  control->groupId = group->id;
  control->wideBits = tag::wideBits(group->size);
  control->incarnation = group->incarnation;
  control->open = true;
  group->notices = control;
  if (group->size < 2) return;
  runtime_.call([&] {
    // A destroyed group that held this id: what it left behind is this group's to take now.
    for (const std::shared_ptr<GroupNotices>& old : controls_) {
      if (!old->open && old->groupId == control->groupId) old->graves.clear();
    }
    controls_.push_back(control);
    // Heartbeats: this rank beats and watches its successors and predecessors at distances 2^k.
    Heartbeat& heartbeat = runtime_.heartbeat();
    if (!heartbeat.on()) return;
    for (int peer : neighbours(group->rank, group->size)) {
      const std::string address = group->directory->address(peer);
      if (address.empty()) continue;
      try {
        heartbeat.beat(address, group->peer(peer));
        control->beats.push_back(address);
      } catch (const Error&) {  // no endpoint can be made: it is found gone by its watchers
      }
      heartbeat.watch(address, runtime_.clock().now());
      control->watches.push_back(address);
    }
  });
}

void Notices::close(std::shared_ptr<GroupNotices> control) {
  if (!control || control->runtime == nullptr) return;
  Runtime::postIfAlive(control->runtime, [control] {
    Runtime& runtime = *control->runtime;
    control->open = false;
    control->early.clear();
    Heartbeat& heartbeat = runtime.heartbeat();
    for (const std::string& address : control->beats) heartbeat.unbeat(address);
    for (const std::string& address : control->watches) heartbeat.unwatch(address);
    control->beats.clear();
    control->watches.clear();
    if (control->receive && !control->receive->done) {
      runtime.transport().cancel(control->receive.get());
    }
  });
}

void Notices::refuse(std::shared_ptr<const Group> group, uint32_t sequence, std::string text) {
  if (group->size < 2 || !group->notices) return;
  Runtime::postIfAlive(group->notices->runtime, [group, sequence, text = std::move(text)] {
    GroupNotices& control = *group->notices;
    if (!control.open) return;
    control.markStarted(sequence);
    Notice notice = control.notice(Notice::Type::kRefusal, sequence);
    notice.kind = StatusKind::kInvalidArgument;
    notice.text = text;
    control.board->sendNotice(control, notice);
    control.board->buryOp(control, sequence);
  });
}

bool Notices::takeNotice(GroupNotices& control) {
  if (control.receive && !control.receive->done) return false;  // one at a time
  // A request kept from a look that found nothing: most looks (one per idle turn) find none.
  if (control.spare) {
    *control.spare = Request{};
  } else {
    control.spare = std::make_unique<Request>();
  }
  control.spare->owner = &control;
  control.spare->observer = &Notices::onNotice;
  const uint64_t t = tag::make(control.groupId, 0, kNoticeSlot, 0);
  if (!runtime_.transport().receiveArrived(t, tag::groupAndSlot(control.wideBits),
                                           control.buffer.data(), control.buffer.size(),
                                           control.spare.get())) {
    return false;
  }
  control.receive = std::move(control.spare);
  return true;
}

void Notices::onNotice(Request* req) {
  auto* control = static_cast<GroupNotices*>(req->owner);
  control->received = true;
  if (!req->failed()) {
    std::optional<Notice> notice = Notice::decode(control->buffer.data(), req->receivedBytes);
    if (notice) control->arrived.push_back(std::move(*notice));
  }
  control->board->noticesArrived_ = true;
}

void Notices::sendNotice(GroupNotices& control, const Notice& notice) {
  relayNotice(control, notice, notice.encode());
}

void Notices::relayNotice(GroupNotices& control, const Notice& notice, const std::string& bytes) {
  const Group& group = *control.group;
  const int n = group.size;
  if (notice.from < 0 || notice.from >= n) return;
  relayBelow(control, notice, bytes, (group.rank - notice.from + n) % n);
}

void Notices::relayBelow(GroupNotices& control, const Notice& notice, const std::string& bytes,
                         int v) {
  const Group& group = *control.group;
  const int n = group.size;
  for (int step = 1; v + step < n; step <<= 1) {
    if (step <= v) continue;
    const int child = (notice.from + v + step) % n;
    const std::string address = group.directory->known(child);
    const bool gone = std::binary_search(notice.gone.begin(), notice.gone.end(), child) ||
                      (!address.empty() && runtime_.isLost(address));
    if (gone || !sendNoticeTo(control, notice, bytes, child)) {
      relayBelow(control, notice, bytes, v + step);
    }
  }
}

bool Notices::sendNoticeTo(GroupNotices& control, const Notice& notice, const std::string& bytes,
                           int to) {
  const Group& group = *control.group;
  PeerId peer;
  try {
    peer = group.peer(to);
  } catch (const Error&) {
    return false;  // no endpoint can be made: a peer that is gone (its process, or its host)
  }
  GroupNotices::Sent& sent = control.sent.emplace_back();
  sent.bytes = bytes;
  sent.request = std::make_unique<Request>();
  sent.request->peer = to;
  sent.request->isSend = true;
  runtime_.transport().send(
      peer, tag::make(group.id, notice.sequence, kNoticeSlot, static_cast<uint32_t>(group.rank)),
      sent.bytes.data(), sent.bytes.size(), sent.request.get());
  return true;
}

void Notices::buryOp(GroupNotices& control, uint32_t sequence) {
  if (control.graves.size() >= GroupNotices::kMaxGraves) control.graves.pop_front();
  control.graves.push_back({sequence, runtime_.clock().now() + GroupNotices::kGraveLife});
}

Ending Notices::endingOf(const Notice& notice) {
  return notice.type == Notice::Type::kRefusal ? Ending::kRemoteRefusal : Ending::kRemote;
}

Status Notices::reportOf(const Notice& notice) {
  return Status(notice.kind, "rank " + std::to_string(notice.from) + " reports: " + notice.text,
                notice.gone);
}

void Notices::applyNotice(GroupNotices& control, const Notice& notice) {
  const Group& group = *control.group;
  if (notice.from < 0 || notice.from >= group.size || notice.from == group.rank) return;
  if (notice.type == Notice::Type::kNews) {
    applyNews(control, notice);
    return;
  }
  Status report = reportOf(notice);
  const bool timedOut = notice.type == Notice::Type::kGroupTimeout;
  if (timedOut) {
    control.timeoutsHeard.push_back(notice.sequence);
    if (control.timeoutsHeard.size() > GroupNotices::kMaxGraves) control.timeoutsHeard.pop_front();
  }
  Runtime::OpList& active = runtime_.ops();
  auto op = std::find_if(active.begin(), active.end(), [&](const auto& o) {
    return &o->group() == control.group && o->callCheck().on() && o->sequence() == notice.sequence;
  });
  const bool inFlight = op != active.end();
  if (notice.type == Notice::Type::kWaiting) {  // only for ops in flight here
    if (inFlight) {
      const size_t split = notice.text.find(';');
      Waits& waits = (*op)->waitReports.heard[notice.from];
      waits.peers = splitRanks(notice.text.substr(0, split));
      if (split != std::string::npos) waits.notStarted = splitRanks(notice.text.substr(split + 1));
    }
    return;
  }
  if (timedOut && !inFlight) {
    group.state->fail(report.withDetail(group.name + ", op #" + std::to_string(notice.sequence) +
                                        ": " + report.detail),
                      true);
    refusalsPending_ = true;
  }
  if (inFlight) {
    // A rank that timed out here is alive and in the op; this rank, in it too, waits for its
    // own deadline (about as near) and names whom it still waits for itself.
    if (!timedOut) runtime_.finishOp(op, std::move(report), endingOf(notice));
    return;
  }
  // A mismatch another rank found in an op that ended well here (bytes that reached that rank
  // alone, as a hostile peer's can): counted here too, so that every rank knows the group's
  // latest mismatched op alike and resyncs its shared-memory windows at the same op
  // (shm/shared_ring.h).
  if (notice.type == Notice::Type::kOp && notice.kind == StatusKind::kMismatch &&
      !control.ahead(notice.sequence)) {
    group.state->countMismatch(notice.sequence);
  }
  if (control.ahead(notice.sequence)) {
    control.early[notice.sequence] = notice;
    if (control.early.size() > GroupNotices::kMaxEarly) control.early.erase(control.early.begin());
  }
}

void Notices::applyNews(GroupNotices& control, const Notice& notice) {
  const Group& group = *control.group;
  // From a rank counted gone here: it stalled and came back, or speaks from the other side of
  // a partition. Its words are not taken; it is told.
  if (group.state->goneSince(notice.from)) {
    tellGone(control, notice.from);
    return;
  }
  if (std::binary_search(notice.gone.begin(), notice.gone.end(), group.rank)) {
    group.state->fail(
        Status(StatusKind::kPartitioned,
               group.name + ": rank " + std::to_string(notice.from) +
                   " counts this rank gone (it heard nothing from it: this process stopped, or "
                   "is cut off): the others go on without it",
               {notice.from}),
        true);
    refusalsPending_ = true;
    return;
  }
  for (size_t i = 0; i < notice.gone.size(); ++i) {
    const int r = notice.gone[i];
    if (r < 0 || r >= group.size || r == group.rank || control.newsOf.count(r)) continue;
    // Who counted it gone: the sender, or a witness it heard of, which is named (it may have
    // been cut off from a rank this one still hears).
    int witness = i < notice.witnesses.size() ? notice.witnesses[i] : notice.from;
    if (witness < 0 || witness >= group.size || witness == group.rank) witness = notice.from;
    const std::string why = newsWords(r, witness, notice.from, notice.text);
    noteGone(control, r, why, notice.text, witness);
    // The process is counted gone for every group that knows it; this group counts the rank
    // gone whether or not this rank knows where it was.
    const std::string address = group.directory->known(r);
    if (!address.empty()) {
      runtime_.markLost(address, why, true);
      learnGone(address, why, notice.text);
    }
  }
  floodPendingNews();
}

void Notices::floodNews(GroupNotices& control, const Group& group) {
  control.newsPending = false;
  control.lastFlood = runtime_.clock().now();
  Notice notice = control.notice(Notice::Type::kNews, control.started);
  notice.tree = false;
  notice.kind = StatusKind::kPeerLost;
  notice.gone = group.state->gone();
  notice.witnesses = group.state->witnesses(group.rank);
  notice.text = control.newsWhy;
  // To the nearest rank not known gone at distance 2^k or more, each way: the survivors stay
  // linked whatever block of relays died (a dead host's ring neighbours skip past it).
  const int n = group.size;
  std::set<int> to;
  for (int step = 1; step < n; step <<= 1) {
    for (int way : {1, -1}) {
      for (int d = step; d < n; ++d) {
        const int r = ((group.rank + way * d) % n + n) % n;
        if (std::binary_search(notice.gone.begin(), notice.gone.end(), r)) continue;
        to.insert(r);
        break;
      }
    }
  }
  to.erase(group.rank);
  // All it knows to a rank it floods to first, what is new to the others, in as many notices as
  // it takes.
  const std::vector<std::string> all = notice.encodePieces();
  const Notice fresh = notice.without(control.flooded);
  const std::vector<std::string> news =
      fresh.gone.empty() ? std::vector<std::string>{} : fresh.encodePieces();
  control.flooded = notice.gone;
  for (int r : to) {
    for (const std::string& bytes : control.floodedTo.insert(r).second ? all : news)
      sendNoticeTo(control, notice, bytes, r);
  }
}

void Notices::tellGone(GroupNotices& control, int rank) {
  const TimePoint now = runtime_.clock().now();
  auto [it, first] = control.toldGone.emplace(rank, now);
  if (!first && now - it->second < std::chrono::seconds(1)) return;
  it->second = now;
  Notice notice = control.notice(Notice::Type::kNews, control.started);
  notice.tree = false;
  notice.kind = StatusKind::kPeerLost;
  notice.gone = {rank};
  notice.text = "it counts rank " + std::to_string(rank) + " gone";
  sendNoticeTo(control, notice, notice.encode(), rank);
}

bool Notices::service(bool housekeeping) {
  noticesArrived_ = false;
  bool any = false;
  const TimePoint now = runtime_.clock().now();
  for (size_t i = 0; i < controls_.size();) {
    std::shared_ptr<GroupNotices> control = controls_[i];
    // Held while its notices are applied and passed on; gone: closed.
    std::shared_ptr<const Group> alive = control->owner.lock();
    if (!alive) control->open = false;
    // Notices wait in the transport until taken here (every millisecond, and when one that was
    // being received completes): taken before the graves below are swept.
    while (true) {
      if (control->received) {
        std::vector<Notice> arrived;
        arrived.swap(control->arrived);
        control->received = false;
        if (control->open) {
          for (const Notice& notice : arrived) {
            // Of another group that held this id (destroyed, or not yet made here): dropped.
            if (notice.incarnation != control->incarnation) continue;
            if (notice.tree && notice.type != Notice::Type::kNews) {
              relayNotice(*control, notice, notice.encode());
            }
            applyNotice(*control, notice);
          }
        }
        any = true;
      }
      if (!control->open || !takeNotice(*control)) break;
    }
    // Sends finish about in the order made: the finished ones in front leave at every turn, the
    // rest at housekeeping. Walking the whole list at every turn, with sends to a lost host's
    // ranks in it, took a third of a 65 536-rank simulation.
    while (!control->sent.empty() && control->sent.front().request->done) {
      control->sent.pop_front();
    }
    if (!housekeeping) {
      ++i;
      continue;
    }
    control->sent.remove_if([](const GroupNotices::Sent& s) { return s.request->done; });
    // What failed ops left behind, while no later op could take it (the sequence field wraps).
    while (!control->graves.empty() &&
           (now > control->graves.front().until ||
            control->startedSince(control->graves.front().sequence) >= (int64_t{1} << 15))) {
      control->graves.pop_front();
    }
    for (const GroupNotices::Grave& grave : control->graves) {
      // By group, sequence and phase: the point-to-point phases (the top ones) carry a user
      // tag in the sequence field, and are not the failed op's.
      for (const tag::PhaseRange& range : tag::kCollectivePhases) {
        runtime_.transport().discard(
            tag::make(control->groupId, grave.sequence, tag::slot(range.first, 0), 0),
            tag::groupAndSequence(control->wideBits) | range.mask);
      }
    }
    // A closed group's control stays while its leftovers are discarded.
    if (!control->open && (!control->receive || control->receive->done) && control->sent.empty() &&
        control->graves.empty()) {
      controls_.erase(controls_.begin() + static_cast<long>(i));
      continue;
    }
    ++i;
  }
  return any;
}

// --- What an op's end means to its group (Runtime::Supervisor) ---------------------------------

Status Notices::admit(Op& op, Ending* ending) {
  Status refused = op.group().state->refusal();
  if (!refused.ok()) {
    *ending = Ending::kRefused;
    return refused;
  }
  Status lost = runtime_.lostPeerOf(op);
  if (!lost.ok()) {
    *ending = Ending::kLost;
    return lost;
  }
  GroupNotices* control = op.group().notices.get();
  if (op.callCheck().on() && control != nullptr) {
    control->markStarted(op.sequence());
    auto early = control->early.find(op.sequence());
    if (early != control->early.end()) {
      Notice notice = std::move(early->second);
      control->early.erase(early);
      *ending = endingOf(notice);
      return reportOf(notice);
    }
  }
  return Status();
}

void Notices::ended(Op& op, const Status& error, Ending ending, const std::string& where) {
  if (error.ok()) return;
  if (op.callCheck().on() && op.group().notices != nullptr) {
    GroupNotices& control = *op.group().notices;
    // The others learn what ended it here; the messages they sent it are discarded. (A lost
    // peer is told by the news, to every group that has it; a timeout another rank reported
    // reached every rank already.)
    const bool heard = std::find(control.timeoutsHeard.begin(), control.timeoutsHeard.end(),
                                 op.sequence()) != control.timeoutsHeard.end();
    const bool told = ending == Ending::kOwn || (ending == Ending::kTimeout && !heard);
    if (told && control.open && op.size() > 1) {
      Notice notice = control.notice(
          ending == Ending::kTimeout ? Notice::Type::kGroupTimeout : Notice::Type::kOp,
          op.sequence());
      notice.kind = error.kind;
      notice.text = error.detail;
      sendNotice(control, notice);
    }
    buryOp(control, op.sequence());
  }
  // A collective that timed out or lost a peer fails its group: the ranks no longer agree on
  // what was done (monitored barriers and point-to-point ops, which have no call check, leave it
  // usable, as their callers expect).
  const std::shared_ptr<GroupState>& group = op.group().state;
  if (ending == Ending::kLost) {
    for (int r : error.ranks) group->noteGone(r, runtime_.clock().now());
  }
  if (op.callCheck().on() && (ending == Ending::kTimeout || ending == Ending::kLost)) {
    group->fail(error.withDetail(where + " " + error.detail));
    refusalsPending_ = true;
  }
  const bool remote = ending == Ending::kRemote || ending == Ending::kRemoteRefusal;
  group->recordFailure(error.withDetail("ddl: " + where + " " + error.detail), remote);
}

void Notices::halfway(Op& op) { reportWaits(op); }

bool Notices::afterSteps() {
  bool busy = false;
  if (noticesArrived_) busy |= service(false);
  if (refusalsPending_) failRefusedOps();
  return busy;
}

bool Notices::idle() { return !controls_.empty() && service(false); }

void Notices::housekeep() {
  if (!controls_.empty()) service(true);
  floodPendingNews();
}

void Notices::afterLiveness() { announceLost(); }

TimePoint Notices::nextHousekeeping() const {
  TimePoint next = TimePoint::max();
  for (const auto& control : controls_) {
    if (!control->graves.empty()) next = std::min(next, control->graves.front().until);
    if (control->newsPending) next = std::min(next, control->lastFlood + kNewsPeriod);
  }
  return next;
}

void Notices::stopped() {
  for (auto& control : controls_) {
    control->open = false;
    if (control->receive && !control->receive->done) {
      runtime_.transport().cancel(control->receive.get());
    }
  }
}

void Notices::failRefusedOps() {
  refusalsPending_ = false;
  runtime_.endOps([](const Op& op) { return op.group().state->refusal(); }, Ending::kRefused);
}

void Notices::announceLost() {
  for (const auto& [address, why] : runtime_.dueToTell()) learnGone(address, why, "");
  floodPendingNews();
}

void Notices::learnGone(const std::string& address, const std::string& why,
                        const std::string& heard) {
  for (const auto& control : controls_) {
    std::shared_ptr<const Group> alive = control->owner.lock();
    if (!control->open || !alive) continue;
    const int r = alive->directory->rankAt(address);
    if (r >= 0) noteGone(*control, r, why, heard);
  }
}

void Notices::noteGone(GroupNotices& control, int r, const std::string& why,
                       const std::string& heard, int witness) {
  std::shared_ptr<const Group> alive = control.owner.lock();
  if (!control.open || !alive) return;
  const Group& g = *alive;
  if (r == g.rank || !control.newsOf.insert(r).second) return;
  const std::string words = "rank " + std::to_string(r) + " is gone: " + why;
  g.state->noteGone(r, runtime_.clock().now(), witness);
  g.state->fail(Status(StatusKind::kPeerLost, g.name + ": " + words, {r}));
  refusalsPending_ = true;
  if (control.newsWhy.empty()) control.newsWhy = heard.empty() ? words : heard;
  control.newsPending = true;
}

void Notices::floodPendingNews() {
  const TimePoint now = runtime_.clock().now();
  for (const auto& control : controls_) {
    std::shared_ptr<const Group> alive = control->owner.lock();  // held while the news goes out
    if (!control->newsPending || !control->open || !alive) continue;
    if (control->lastFlood != TimePoint::min() && now - control->lastFlood < kNewsPeriod) continue;
    floodNews(*control, *alive);
  }
}

}  // namespace ddl
