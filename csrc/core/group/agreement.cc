#include "agreement.h"

#include <algorithm>

#include "../base/tag.h"
#include "../base/types.h"
#include "../base/wire.h"
#include "../runtime/runtime.h"
#include "bootstrap.h"

namespace ddl {
namespace {

constexpr uint64_t kSlot = tag::slot(tag::kControlPhase, tag::kAgreementStep);
constexpr uint64_t kAbortSlot = tag::slot(tag::kControlPhase, tag::kAgreementAbortStep);
constexpr size_t kAbortBytes = 2048;  // a failure's words, cut to this

// A framed message (bootstrap.h's receiveFramed) from `peer`, unless another member's word that
// the agreement failed (`abort`, from any member) comes first: then that word is thrown.
Task receiveUnlessAborted(Op& op, int peer, std::string* bytes, Request* abort,
                          const std::string* abortText, DeriveResult* out) {
  auto ended = [abort, abortText, out] {
    const int from = static_cast<int>(tag::source(abort->senderTag));
    out->heardFrom = from;
    out->asked = "; " + out->mine;
    return Error("rank " + std::to_string(from) + " reports: " +
                 abortText->substr(0, std::min(abort->receivedBytes, abortText->size())));
  };
  uint64_t length = 0;
  Request* r = op.recv(peer, kSlot, &length, sizeof(length));
  co_await op.until([r, abort] { return r->done || abort->done; });
  if (!r->done) throw ended();
  bytes->assign(length, '\0');
  r = op.recv(peer, kSlot, bytes->data(), length);
  co_await op.until([r, abort] { return r->done || abort->done; });
  if (!r->done) throw ended();
}

Task sendAbort(Op& op, int peer, std::string text) {
  co_await op.all(op.send(peer, kAbortSlot, text.data(), text.size()));
}

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

bool decodeCards(const std::string& bytes, std::vector<DeriveCard>* cards) {
  Reader r(bytes);
  const uint64_t n = r.number();
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    DeriveCard c;
    c.rank = static_cast<int>(r.number());
    c.parentRank = static_cast<int>(r.number());
    c.request = r.text();
    c.heldIds = r.text();
    cards->push_back(std::move(c));
  }
  return r.ok(true);
}

}  // namespace

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
  for (uint32_t id = tag::kGroupIds; id-- > 0;) {
    bool held = false;
    for (const DeriveCard& c : cards) held = held || (id < c.heldIds.size() && c.heldIds[id] != 0);
    if (!held) {
      result.id = id;
      return result;
    }
  }
  result.error = Status(StatusKind::kInvalidArgument,
                        "ddl: " + what +
                            ": every group id is held by a live group on some rank of the new "
                            "group; destroy the groups the job no longer uses");
  return result;
}

Task agreeOnDerived(Op& op, std::vector<int> members, DeriveCard mine, std::string what,
                    std::shared_ptr<DeriveResult> out, std::vector<std::shared_ptr<Work>> told,
                    TimePoint toldBy) {
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
  const int n = static_cast<int>(members.size());
  const int up = bootstrapParent(mine.rank);
  const int parent = up < 0 ? -1 : members[up];
  std::vector<int> children;
  for (int child : bootstrapChildren(mine.rank, n)) children.push_back(members[child]);
  out->mine = "rank " + std::to_string(mine.parentRank) + " was asked to " + mine.request;
  // The word may still be posted when this coroutine ends (it is cancelled after): its buffer
  // lives with the op's Work, which the engine keeps until the transport lets go.
  auto abortText = std::make_shared<std::string>(kAbortBytes, '\0');
  op.work->retain(abortText);
  Request* abort = op.recvAny(kAbortSlot, abortText->data(), abortText->size());
  std::vector<DeriveCard> cards;
  cards.push_back(std::move(mine));
  for (int child : children) {
    std::string bytes;
    co_await receiveUnlessAborted(op, child, &bytes, abort, abortText.get(), out.get());
    if (!decodeCards(bytes, &cards)) {
      throw Error("rank " + std::to_string(child) + " sent malformed cards");
    }
  }
  std::string down;
  if (parent >= 0) {
    co_await sendFramed(op, parent, kSlot, encodeCards(cards));
    co_await receiveUnlessAborted(op, parent, &down, abort, abortText.get(), out.get());
  } else {
    std::sort(cards.begin(), cards.end(),
              [](const DeriveCard& a, const DeriveCard& b) { return a.rank < b.rank; });
    DeriveResult decided =
        cards.size() == static_cast<size_t>(n)
            ? decideDerived(cards, what)
            : DeriveResult{
                  Status(StatusKind::kOther, "ddl: " + what + ": " + std::to_string(cards.size()) +
                                                 " of " + std::to_string(n) + " ranks answered"),
                  0};
    // The id's number carries the failure's kind above its 32 bits (ids are 12).
    Writer w;
    w.text(decided.error.detail);
    w.number(decided.id | uint64_t{static_cast<uint8_t>(decided.error.kind)} << 32);
    down = w.take();
  }
  cards = {};
  Reader r(down);
  DeriveResult result;
  std::string words = r.text();
  const uint64_t number = r.number();
  result.id = static_cast<uint32_t>(number);
  const auto kind = static_cast<uint8_t>(number >> 32);
  if (!words.empty()) {
    result.error =
        Status(kind > 0 && kind < kStatusKinds ? static_cast<StatusKind>(kind) : StatusKind::kOther,
               std::move(words));
  }
  if (!r.ok(true)) throw Error("rank " + std::to_string(parent) + " sent a malformed answer");
  for (int child : children) co_await sendFramed(op, child, kSlot, down);
  *out = std::move(result);
}

std::shared_ptr<Work> startAgreement(const std::shared_ptr<Group>& agreement, uint32_t sequence,
                                     const std::vector<int>& members, DeriveCard mine,
                                     const std::string& what, std::chrono::milliseconds timeout,
                                     std::vector<std::shared_ptr<Work>> told, TimePoint toldBy,
                                     std::shared_ptr<DeriveResult> out) {
  const int index = mine.rank;
  auto work = std::make_shared<Work>(what);
  // A member whose agreement fails here tells its neighbours at once, from the turning thread,
  // whether or not anyone waits for this Work yet (a simulated rank's caller looks only later).
  // (The hook holds the agreement's group: the op that held it is gone when the hook runs.)
  work->setCompletionHook(
      [group = agreement, sequence, members, index, out, work = work.get(), timeout] {
        if (!work->failed()) return;
        tellNeighbours(*group, sequence, members, index, work->error() + out->asked,
                       std::min(timeout, std::chrono::milliseconds(10000)));
      });
  auto op = std::make_unique<Op>(agreement, sequence, what, timeout, work);
  op->task = agreeOnDerived(*op, members, std::move(mine), what, out, std::move(told), toldBy);
  agreement->runtime->submit(std::move(op));
  return work;
}

void tellNeighbours(const Group& agreement, uint32_t sequence, const std::vector<int>& members,
                    int index, std::string text, std::chrono::milliseconds timeout) {
  std::vector<int> to;
  const int up = bootstrapParent(index);
  if (up >= 0) to.push_back(members[up]);
  for (int child : bootstrapChildren(index, static_cast<int>(members.size()))) {
    to.push_back(members[child]);
  }
  tellRanks(agreement, sequence, to, std::move(text), timeout);
}

std::vector<std::shared_ptr<Work>> tellRanks(const Group& agreement, uint32_t sequence,
                                             const std::vector<int>& ranks, std::string text,
                                             std::chrono::milliseconds timeout,
                                             const std::vector<PeerId>& endpoints) {
  std::vector<std::shared_ptr<Work>> works;
  if (text.size() > kAbortBytes) text.resize(kAbortBytes);
  for (int peer : ranks) {
    // A group of its own per message: a neighbour that is gone fails this op alone.
    auto group = std::make_shared<Group>();
    group->runtime = agreement.runtime;
    group->rank = agreement.rank;
    group->size = agreement.size;
    group->id = agreement.id;
    group->name = agreement.name;
    group->addresses = agreement.addresses;
    // The endpoint opened before, if any (no op of the agreement's group changes them
    // meanwhile), and no other: an op fails when any rank of its group is lost.
    const std::vector<PeerId>& known = endpoints.empty() ? agreement.peers : endpoints;
    group->peers.assign(static_cast<size_t>(agreement.size), -1);
    if (static_cast<size_t>(peer) < known.size()) group->peers[peer] = known[peer];
    auto work = std::make_shared<Work>("agreement failure notice");
    auto op = std::make_unique<Op>(group, sequence, "agreement failure notice", timeout, work);
    op->task = sendAbort(*op, peer, text);
    agreement.runtime->submit(std::move(op));
    works.push_back(std::move(work));
  }
  return works;
}

}  // namespace ddl
