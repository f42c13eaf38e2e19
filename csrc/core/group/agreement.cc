#include "agreement.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "../base/tag.h"
#include "../base/types.h"
#include "../base/wire.h"
#include "../runtime/runtime.h"
#include "bootstrap.h"

namespace ddl {
namespace {

constexpr uint64_t kSlot = tag::slot(tag::kControlPhase, tag::kAgreementStep);
constexpr uint64_t kAbortSlot = tag::slot(tag::kControlPhase, tag::kAgreementAbortStep);
constexpr size_t kAbortBytes = 2048;           // a failure's words, cut to this
constexpr uint64_t kMaxAnswerBytes = 1 << 20;  // the decision's words, at most

// The word of failure this op listens for, from any rank: its text after the attempt's 8 bytes.
struct Listening {
  uint64_t attempt;
  const std::set<uint64_t>* ended;
  std::string buffer = std::string(kAbortBytes, '\0');
  const std::vector<int>* excluded = nullptr;  // sorted: ranks this one leaves out
  Request* request = nullptr;
  // Whether a word of this attempt arrived; one of another attempt is dropped and the next
  // listened for. So is one from a rank this one leaves out: whatever that rank was asked, the
  // group formed here is not its (the ranks that stay agree without it; a campaign found one
  // left out, asked to leave out another, failing every other rank's agreement while the new
  // rank 0 had already decided).
  bool heard(Op& op) {
    while (request->done) {
      uint64_t theirs = 0;
      const int from = op.sourceOf(request);
      const bool outsider =
          excluded != nullptr && std::binary_search(excluded->begin(), excluded->end(), from);
      if (!request->failed() && request->receivedBytes > sizeof(theirs) && !outsider) {
        std::memcpy(&theirs, buffer.data(), sizeof(theirs));
        if (theirs == attempt || ended == nullptr || !ended->count(theirs)) return true;
      }
      op.recycle(request);
      request = op.recvAny(kAbortSlot, buffer.data(), buffer.size());
    }
    return false;
  }
  Error error(const Op& op, DeriveResult* out) const {
    const int from = op.sourceOf(request);
    out->heardFrom = from;
    out->asked = "; " + out->mine;
    // The attempt (8 bytes), the failure's kind (1), its words.
    const size_t length = std::min(request->receivedBytes, buffer.size());
    const auto kind = static_cast<uint8_t>(buffer[sizeof(uint64_t)]);
    return Error(Status(
        kind > 0 && kind < kStatusKinds ? static_cast<StatusKind>(kind) : StatusKind::kOther,
        "rank " + std::to_string(from) +
            " reports: " + buffer.substr(sizeof(uint64_t) + 1, length - sizeof(uint64_t) - 1)));
  }
};

// The agreement's framed messages: a header (the attempt, then the length), then that many
// bytes. The attempt lets a frame that an attempt which ended here left behind be told apart
// from this one's: a member that called after the others gave up sent its card under the same
// tag as a retry's (a reconfigure's sequence comes from its handles alone) and, taken, it
// failed the retry as a request that differs.
struct FrameHeader {
  uint64_t attempt = 0;
  uint64_t length = 0;
};

Task sendFrame(Op& op, int peer, uint64_t attempt, std::string bytes) {
  const FrameHeader header{attempt, bytes.size()};
  // In this order (a header, then its bytes): not two arguments of one call.
  Request* sentHeader = op.send(peer, kSlot, &header, sizeof(header));
  Request* sentBytes = op.send(peer, kSlot, bytes.data(), bytes.size());
  co_await op.all(sentHeader, sentBytes);
}

// A frame from `peer` of at most `most` bytes (a longer one fails naming the sender, before
// anything is allocated), unless another member's word that the agreement failed (from any
// member) comes first: then that word is thrown. Frames of an attempt that ended here are
// dropped and the next one awaited.
Task receiveUnlessAborted(Op& op, int peer, uint64_t most, std::string* bytes, Listening* abort,
                          DeriveResult* out) {
  while (true) {
    FrameHeader header;
    Request* r = op.recv(peer, kSlot, &header, sizeof(header));
    co_await op.until([&op, r, abort] { return r->done || abort->heard(op); });
    if (!r->done) throw abort->error(op, out);
    if (r->receivedBytes != sizeof(header) || header.length > most) {
      throw Error("rank " + std::to_string(peer) + " sent an agreement message of " +
                  std::to_string(header.length) + " bytes, more than the " + std::to_string(most) +
                  " it can hold");
    }
    bytes->assign(header.length, '\0');
    r = op.recv(peer, kSlot, bytes->data(), header.length);
    co_await op.until([&op, r, abort] { return r->done || abort->heard(op); });
    if (!r->done) throw abort->error(op, out);
    const bool stale = header.attempt != abort->attempt && abort->ended != nullptr &&
                       abort->ended->count(header.attempt) > 0;
    if (!stale) co_return;
  }
}

Task sendAbort(Op& op, int peer, std::string words) {
  co_await op.all(op.send(peer, kAbortSlot, words.data(), words.size()));
}

// The first card among `cards` asking for something else than `mine`, with its words.
std::optional<std::string> otherRequest(const std::vector<DeriveCard>& cards,
                                        const DeriveCard& mine) {
  for (const DeriveCard& c : cards) {
    if (c.request != mine.request) {
      return "rank " + std::to_string(c.parentRank) + " was asked to " + c.request + ", rank " +
             std::to_string(mine.parentRank) + " was asked to " + mine.request;
    }
  }
  return std::nullopt;
}

}  // namespace

std::string encodeCards(const std::vector<DeriveCard>& cards) {
  Writer w;
  w.number(cards.size());
  for (const DeriveCard& c : cards) {
    w.number(static_cast<uint64_t>(c.rank));
    w.number(static_cast<uint64_t>(c.parentRank));
    w.text(c.request);
    w.text(c.heldIds);
  }
  return w.take();
}

bool decodeCards(const std::string& bytes, size_t most, std::vector<DeriveCard>* cards) {
  Reader r(bytes);
  const uint64_t n = r.number();
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    DeriveCard c;
    const uint64_t rank = r.number(), parentRank = r.number();
    c.request = r.text();
    c.heldIds = r.text();
    if (rank > tag::kMaxRanks || parentRank > tag::kMaxRanks ||
        c.heldIds.size() > tag::kMaxGroups ||
        c.request.size() + c.heldIds.size() + kCardOverhead > most) {
      return false;
    }
    c.rank = static_cast<int>(rank);
    c.parentRank = static_cast<int>(parentRank);
    cards->push_back(std::move(c));
  }
  return r.ok(true);
}

DeriveResult decideDerived(const std::vector<DeriveCard>& cards, const std::string& what) {
  DeriveResult result;
  if (cards.empty()) {
    result.error = Status(StatusKind::kOther, "ddl: " + what + ": no rank answered");
    return result;
  }
  const DeriveCard& first = cards.front();
  std::string differ;
  std::vector<int> differing;  // parent ranks
  for (const DeriveCard& c : cards) {
    if (c.request != first.request) {
      differ += "; rank " + std::to_string(c.parentRank) + " was asked to " + c.request;
      differing.push_back(c.parentRank);
    }
  }
  if (!differ.empty()) {
    result.error =
        Status(StatusKind::kMismatch,
               "ddl: " + what + ": the ranks were asked for different groups: rank " +
                   std::to_string(first.parentRank) + " was asked to " + first.request + differ +
                   " (every rank of the new group must pass the same arguments)",
               differing);
    return result;
  }
  // A wide group takes a whole block of ids below the agreements' (base/tag.h).
  const int wide = tag::wideBits(static_cast<int64_t>(cards.size()));
  const uint32_t top = wide == 0 ? tag::kGroupIds : tag::kAgreementBlock;
  for (uint32_t id = top >> wide; id-- > 0;) {
    bool held = false;
    for (uint32_t x = 0; x < (1u << wide); ++x) {
      const uint32_t i = id << wide | x;
      for (const DeriveCard& c : cards) held = held || (i < c.heldIds.size() && c.heldIds[i] != 0);
    }
    if (!held) {
      result.id = id << wide;
      return result;
    }
  }
  result.error = Status(StatusKind::kInvalidArgument,
                        "ddl: " + what +
                            ": every group id is held by a live group on some rank of the new "
                            "group; destroy the groups the job no longer uses");
  return result;
}

namespace {

// The tree's root: every member's card once, each where it belongs (a card repeated or of a rank
// that is not a member is a sender's fault, never a decision), then the decision as the answer
// sent down: its words, the id (the failure's kind above its 32 bits: ids are 12) and the new
// group's incarnation.
std::string rootAnswer(std::vector<DeriveCard> cards, const RankSet& members,
                       const std::string& what, Runtime& runtime) {
  const int n = members.size();
  std::sort(cards.begin(), cards.end(),
            [](const DeriveCard& a, const DeriveCard& b) { return a.rank < b.rank; });
  for (size_t i = 0; i < cards.size(); ++i) {
    if (cards[i].rank != static_cast<int>(i) || static_cast<int>(i) >= n ||
        cards[i].parentRank != members.at(static_cast<int>(i))) {
      throw Error("the cards sent up hold rank " + std::to_string(cards[i].rank) + " (rank " +
                  std::to_string(cards[i].parentRank) + " of the parent) at place " +
                  std::to_string(i) + " of " + std::to_string(n));
    }
  }
  DeriveResult decided =
      cards.size() == static_cast<size_t>(n)
          ? decideDerived(cards, what)
          : DeriveResult{
                Status(StatusKind::kOther, "ddl: " + what + ": " + std::to_string(cards.size()) +
                                               " of " + std::to_string(n) + " ranks answered"),
                0};
  Writer w;
  w.text(decided.error.detail);
  w.number(decided.id | uint64_t{static_cast<uint8_t>(decided.error.kind)} << 32);
  w.number(runtime.newIncarnation());
  return w.take();
}

// The answer that came down from `parent` (or was decided here), read.
DeriveResult readAnswer(const std::string& down, int parent) {
  Reader r(down);
  DeriveResult result;
  std::string words = r.text();
  const uint64_t number = r.number();
  result.id = static_cast<uint32_t>(number);
  const auto kind = static_cast<uint8_t>(number >> 32);
  result.incarnation = r.number();
  if (!words.empty()) {
    result.error =
        Status(kind > 0 && kind < kStatusKinds ? static_cast<StatusKind>(kind) : StatusKind::kOther,
               std::move(words));
  }
  if (!r.ok(true)) throw Error("rank " + std::to_string(parent) + " sent a malformed answer");
  return result;
}

}  // namespace

Task agreeOnDerived(Op& op, Agreement agreement, DeriveCard mine, std::shared_ptr<DeriveResult> out,
                    std::vector<std::shared_ptr<Work>> told, TimePoint toldBy) {
  const RankSet& members = agreement.members;
  const std::string& what = agreement.what;
  // The words this rank sent first (a shrink's, to the ranks it leaves out) leave before its
  // card goes up, or the time for them runs out.
  if (!told.empty()) {
    const Clock& clock = op.group().runtime->clock();
    op.wakeAt(toldBy);
    co_await op.until([&] {
      return clock.now() >= toldBy ||
             std::all_of(told.begin(), told.end(), [](const auto& w) { return w->done(); });
    });
    told.clear();
  }
  // The tree over the new ranks, its messages between the ranks of the parent they are.
  const int n = members.size();
  const int up = bootstrapParent(mine.rank);
  const int parent = up < 0 ? -1 : members.at(up);
  std::vector<int> children;
  for (int child : bootstrapChildren(mine.rank, n)) children.push_back(members.at(child));
  out->mine = "rank " + std::to_string(mine.parentRank) + " was asked to " + mine.request;
  // The word may still be posted when this coroutine ends (it is cancelled after): its buffer
  // lives with the op's Work, which the engine keeps until the transport lets go.
  auto abort = std::make_shared<Listening>();
  abort->attempt = agreement.attempt;
  abort->ended = agreement.ended;
  abort->excluded = &agreement.excluded;
  op.work->retain(abort);
  abort->request = op.recvAny(kAbortSlot, abort->buffer.data(), abort->buffer.size());
  // What a frame may hold: a card per rank of the sender's subtree (its held ids, and a request
  // as long as this one's, or of a few hundred bytes where it differs and is quoted); the
  // answer, one failure's words.
  const uint64_t cardBytes =
      kCardOverhead + tag::kMaxGroups + 2 * std::max<size_t>(mine.request.size(), 256);
  std::vector<DeriveCard> cards;
  cards.push_back(mine);
  for (int child : children) {
    std::string bytes;
    co_await receiveUnlessAborted(op, child, cardBytes * static_cast<uint64_t>(n), &bytes,
                                  abort.get(), out.get());
    if (!decodeCards(bytes, cardBytes, &cards)) {
      throw Error("rank " + std::to_string(child) + " sent malformed cards");
    }
    // Cards that ask for another group: the views differ, whatever the others say.
    if (std::optional<std::string> other = otherRequest(cards, mine)) {
      throw Error(Status(StatusKind::kMismatch,
                         "ddl: " + what + ": the ranks were asked for different groups: " + *other +
                             " (every rank of the new group must pass the same arguments)",
                         {cards.back().parentRank}));
    }
  }
  std::string down;
  if (parent >= 0) {
    co_await sendFrame(op, parent, agreement.attempt, encodeCards(cards));
    co_await receiveUnlessAborted(op, parent, kMaxAnswerBytes, &down, abort.get(), out.get());
  } else {
    down = rootAnswer(std::move(cards), members, what, *op.group().runtime);
  }
  cards = {};
  DeriveResult result = readAnswer(down, parent);
  for (int child : children) co_await sendFrame(op, child, agreement.attempt, down);
  *out = std::move(result);
}

std::shared_ptr<Work> startAgreement(const Agreement& agreement, DeriveCard mine,
                                     std::vector<std::shared_ptr<Work>> told, TimePoint toldBy,
                                     std::shared_ptr<DeriveResult> out) {
  auto work = std::make_shared<Work>(agreement.what);
  // A member whose agreement fails here tells the others at once, from the turning thread,
  // whether or not anyone waits for this Work yet (a simulated rank's caller looks only later):
  // the ranks at distances 1, 2, 4, ... after it among those its request keeps, so that news
  // passed on so reaches every one of them however many of the ranks left out sit between.
  work->setCompletionHook([agreement, out, work = work.get()] {
    if (agreement.ended != nullptr) agreement.ended->insert(agreement.attempt);
    if (!work->failed()) return;
    tellRanks(
        agreement,
        successorsAmong(agreement.everyone->rank, agreement.everyone->size, agreement.excluded),
        work->error() + out->asked, {}, work->status().kind);
  });
  auto op = std::make_unique<Op>(agreement.group, agreement.sequence, agreement.what,
                                 agreement.timeout, work);
  op->task = agreeOnDerived(*op, agreement, std::move(mine), out, std::move(told), toldBy);
  agreement.group->runtime->submit(std::move(op));
  return work;
}

std::vector<int> successorsAmong(int rank, int size, const std::vector<int>& leftOut) {
  std::vector<int> kept;  // after `rank`, in order
  for (int k = 1; k < size; ++k) {
    const int r = (rank + k) % size;
    if (std::find(leftOut.begin(), leftOut.end(), r) == leftOut.end()) kept.push_back(r);
  }
  std::vector<int> to;
  for (size_t step = 1; step <= kept.size(); step <<= 1) to.push_back(kept[step - 1]);
  return to;
}

std::vector<std::shared_ptr<Work>> tellRanks(const Agreement& agreement,
                                             const std::vector<int>& ranks, std::string text,
                                             const std::unordered_map<int, PeerId>& endpoints,
                                             StatusKind kind) {
  const Group& everyone = *agreement.everyone;
  std::vector<std::shared_ptr<Work>> works;
  std::string words(sizeof(agreement.attempt), '\0');
  std::memcpy(words.data(), &agreement.attempt, sizeof(agreement.attempt));
  words.push_back(static_cast<char>(kind));
  words += text.substr(0, kAbortBytes - words.size());
  const auto timeout = std::min(agreement.timeout, std::chrono::milliseconds(10000));
  for (int peer : ranks) {
    if (peer < 0 || peer >= everyone.size) continue;
    const std::string address = everyone.directory->address(peer);
    if (address.empty()) continue;
    // A group of its own per message, with its one peer's address and endpoint (opened before,
    // if it was: no op of the agreement's group changes them meanwhile), and no other: an op
    // fails when any rank of its group is lost, and this one must fail only when its peer is.
    auto group = std::make_shared<Group>();
    group->runtime = everyone.runtime;
    group->rank = everyone.rank;
    group->size = everyone.size;
    group->id = everyone.id;
    group->name = everyone.name;
    group->directory = std::make_shared<PeerDirectory>();
    group->directory->learn(peer, address);
    const std::unordered_map<int, PeerId>& known = endpoints.empty() ? everyone.peers : endpoints;
    if (auto it = known.find(peer); it != known.end()) group->peers[peer] = it->second;
    auto work = std::make_shared<Work>("agreement failure notice");
    auto op =
        std::make_unique<Op>(group, agreement.sequence, "agreement failure notice", timeout, work);
    op->task = sendAbort(*op, peer, words);
    everyone.runtime->submit(std::move(op));
    works.push_back(std::move(work));
  }
  return works;
}

}  // namespace ddl
