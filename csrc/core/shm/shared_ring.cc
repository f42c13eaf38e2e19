#include "shared_ring.h"

#include <algorithm>
#include <cstring>

#include "../base/log.h"
#include "../base/tag.h"
#include "../runtime/runtime.h"
#include "../topology/ring_plan.h"
#include "shared_buffers.h"

namespace ddl {
namespace {

constexpr uint32_t kPhase = tag::kSharedPhase;
constexpr uint32_t kKeyStep = 0, kVoteStep = 1, kVerdictStep = 2;  // from firstStep
constexpr size_t kMaxKey = 4096;

struct Geometry {
  uint64_t slotBytes;
  uint64_t slots;
};

void releaseWindows(Transport& transport, SlotWindows& windows) {
  if (windows.outboxWindow != 0) transport.releaseWindow(windows.outboxWindow);
  if (windows.inboxWindow != 0) transport.releaseWindow(windows.inboxWindow);
  windows.outboxWindow = windows.inboxWindow = 0;
  windows.inbox = windows.outbox = nullptr;
}

// Lets go of what this rank allocated and mapped of the staging buffers (the staging count
// stays).
void releaseStage(Transport& transport, StageWindows& stage) {
  for (uint64_t w : stage.windows) {
    if (w != 0) transport.releaseWindow(w);
  }
  const uint64_t sequence = stage.sequence;
  stage = StageWindows{};
  stage.sequence = sequence;
}

void collect(const SlotWindows& windows, std::vector<uint64_t>* ids) {
  if (windows.outboxWindow != 0) ids->push_back(windows.outboxWindow);
  if (windows.inboxWindow != 0) ids->push_back(windows.inboxWindow);
}

}  // namespace

SharedRing::~SharedRing() {
  std::vector<uint64_t> windows;
  for (const auto& [owner, mapped] : peerBuffers) {
    if (mapped.window != 0) {
      windows.push_back(mapped.window);
    } else {
      SharedBuffers::unmapAdopted(mapped.base, mapped.length);
    }
  }
  collect(this->windows, &windows);
  for (uint64_t w : stage.windows) {
    if (w != 0) windows.push_back(w);
  }
  for (const auto& [key, ring] : levelRings) collect(ring, &windows);
  if (windows.empty()) return;
  Runtime* r = runtime;
  Runtime::postIfAlive(r, [r, windows] {
    for (uint64_t w : windows) r->transport().releaseWindow(w);
  });
}

void SharedRing::advance() {
  ++serving;
  while (abandoned.erase(serving) > 0) ++serving;
}

SharedRingTurn::SharedRingTurn(SharedRing& ring, Op& op)
    : SharedRingTurn(ring, op, ring.tickets++) {}

SharedRingTurn::SharedRingTurn(SharedRing& ring, Op& op, uint64_t ticket)
    : ring_(ring), op_(op), ticket_(ticket) {
  what_ = op.name() + " op #" + std::to_string(op.sequence()) + " on " + op.group().name;
  op.hold(this);
}

SharedRingTurn::~SharedRingTurn() {
  if (holds_ && op_.held() == this) op_.hold(nullptr);  // the op lives on: it forgets this turn
  end();
}

void SharedRingTurn::opEnded() {
  holds_ = false;  // the op let go of it (its frame, holding this turn, may outlive it)
  end();
}

void SharedRingTurn::end() {
  if (released_) return;
  released_ = true;
  if (ring_.state == SharedRing::State::kUnknown && ring_.windows.refused) {
    ring_.state = SharedRing::State::kUnavailable;  // its setup cut short after the verdict
  } else if (ring_.state != SharedRing::State::kBroken && !clean_ && !op_.endsCleanly() &&
             !(mends_ && op_.endedWith() == StatusKind::kMismatch)) {
    ring_.state = SharedRing::State::kBroken;
    ring_.broken = "the shared-memory ring of this group is unusable: " + what_ +
                   " failed while using it (destroy and re-create the process group)";
  }
  if (ring_.serving == ticket_) {
    ring_.advance();
  } else {
    ring_.abandoned.insert(ticket_);
  }
}

void SharedRingTurn::release() {
  released_ = true;
  ring_.advance();
}

namespace {

// Each member's byte goes to the first member of `order`, which answers every member with the
// AND of them all (in *answer, on every member). Messages of one round on `voteSlot` and
// `answerSlot`; rounds on the same slots follow each other in order.
Task allOf(Op& op, const std::vector<int>& order, uint64_t voteSlot, uint64_t answerSlot,
           uint8_t mine, uint8_t* answer) {
  const int n = static_cast<int>(order.size());
  *answer = mine;
  std::vector<Request*> requests;
  if (op.rank() != order[0]) {
    requests.push_back(op.send(order[0], voteSlot, &mine, 1));
    requests.push_back(op.recv(order[0], answerSlot, answer, 1));
    co_await op.all(requests);
    co_return;
  }
  std::vector<uint8_t> votes(n, 1);
  for (int p = 1; p < n; ++p) requests.push_back(op.recv(order[p], voteSlot, &votes[p], 1));
  co_await op.all(requests);
  for (int p = 1; p < n; ++p) *answer &= votes[p];
  requests.clear();
  for (int p = 1; p < n; ++p) requests.push_back(op.send(order[p], answerSlot, answer, 1));
  co_await op.all(requests);
}

}  // namespace

Task setUpSlotWindows(Op& op, SlotWindows& windows, std::vector<int> order, size_t slotBytes,
                      size_t slots, uint32_t firstStep) {
  const int n = static_cast<int>(order.size());
  const int position = RingPlan{order}.positionOf(op.rank());
  const int next = order[(position + 1) % n];
  const int prev = order[(position + n - 1) % n];
  const uint64_t keySlot = tag::slot(kPhase, firstStep + kKeyStep);
  const uint64_t voteSlot = tag::slot(kPhase, firstStep + kVoteStep);
  const uint64_t verdictSlot = tag::slot(kPhase, firstStep + kVerdictStep);
  Transport& transport = op.group().runtime->transport();
  Geometry geometry{slotBytes, slots};
  std::string key;
  void* base = nullptr;
  windows.inboxWindow = transport.allocateWindow(geometry.slotBytes * geometry.slots, &base, &key);
  windows.inbox = static_cast<char*>(base);
  std::string offer(reinterpret_cast<const char*>(&geometry), sizeof(geometry));
  if (windows.inboxWindow != 0) offer += key;
  std::vector<char> theirs(kMaxKey);
  Request* sent = op.send(prev, keySlot, offer.data(), offer.size());
  Request* got = op.recvUpTo(next, keySlot, theirs.data(), theirs.size());
  co_await op.all(sent, got);

  Geometry nextGeometry{};
  std::memcpy(&nextGeometry, theirs.data(), std::min(sizeof(nextGeometry), got->receivedBytes));
  uint8_t ok = 0;
  if (windows.inboxWindow != 0 && got->receivedBytes > sizeof(Geometry) &&
      nextGeometry.slotBytes == geometry.slotBytes && nextGeometry.slots == geometry.slots) {
    std::string nextKey(theirs.data() + sizeof(Geometry), got->receivedBytes - sizeof(Geometry));
    size_t length = 0;
    windows.outboxWindow = transport.mapWindow(op.group().peer(next), nextKey, &base, &length);
    windows.outbox = static_cast<char*>(base);
    ok = windows.outboxWindow != 0;
    // The slots the neighbour's geometry says it has must lie in what it shares.
    if (ok && length / geometry.slotBytes < geometry.slots) {
      transport.releaseWindow(windows.outboxWindow);
      windows.outboxWindow = 0;
      windows.outbox = nullptr;
      ok = 0;
    }
  }

  uint8_t verdict = 0;
  co_await allOf(op, order, voteSlot, verdictSlot, ok, &verdict);
  windows.slotBytes = geometry.slotBytes;
  windows.slots = geometry.slots;
  windows.ready = verdict != 0;
  if (!windows.ready) {
    windows.refused = true;
    releaseWindows(transport, windows);
    // One more round before any member goes on (an op that requires the ring fails at once,
    // and its notice to the others must not cut short one still waiting for the verdict):
    // every member has it once the first one has heard back from all.
    uint8_t heard = 0;
    co_await allOf(op, order, voteSlot, verdictSlot, 0, &heard);
    if (logs(LogLevel::kWarn)) {
      logLine(LogLevel::kWarn, op.group().name + " rank " + std::to_string(op.rank()) +
                                   ": a host ring of " + std::to_string(n) +
                                   " ranks moves its bytes over messages: " +
                                   (ok ? "another of its ranks" : "this rank") +
                                   " could not map its neighbour's shared memory");
    }
  }
}

Task setUpStageWindows(Op& op, StageWindows& stage, size_t halfBytes, uint32_t firstStep) {
  const int n = op.size(), rank = op.rank();
  const uint64_t keySlot = tag::slot(kPhase, firstStep + kKeyStep);
  const uint64_t voteSlot = tag::slot(kPhase, firstStep + kVoteStep);
  const uint64_t verdictSlot = tag::slot(kPhase, firstStep + kVerdictStep);
  Transport& transport = op.group().runtime->transport();
  const size_t bytes = StageWindows::kHeaderBytes + 2 * halfBytes;
  stage.windows.assign(n, 0);
  stage.bases.assign(n, nullptr);
  stage.halfBytes = halfBytes;
  std::string key;
  void* base = nullptr;
  stage.windows[rank] = transport.allocateWindow(bytes, &base, &key);
  stage.bases[rank] = static_cast<char*>(base);
  // Flags start at 0 (no staging yet) before any peer can map the window.
  if (base != nullptr) std::memset(base, 0, StageWindows::kHeaderBytes);
  Geometry geometry{halfBytes, 2};
  std::string offer(reinterpret_cast<const char*>(&geometry), sizeof(geometry));
  if (stage.windows[rank] != 0) offer += key;
  std::vector<std::vector<char>> theirs(n);
  std::vector<Request*> requests, received(n, nullptr);
  for (int j = 0; j < n; ++j) {
    if (j == rank) continue;
    theirs[j].resize(sizeof(Geometry) + kMaxKey);
    requests.push_back(op.send(j, keySlot, offer.data(), offer.size()));
    received[j] = op.recvUpTo(j, keySlot, theirs[j].data(), theirs[j].size());
    requests.push_back(received[j]);
  }
  co_await op.all(requests);

  uint8_t ok = stage.windows[rank] != 0;
  for (int j = 0; j < n && ok; ++j) {
    if (j == rank) continue;
    Geometry peer{};
    std::memcpy(&peer, theirs[j].data(), std::min(sizeof(peer), received[j]->receivedBytes));
    if (received[j]->receivedBytes <= sizeof(Geometry) || peer.slotBytes != geometry.slotBytes ||
        peer.slots != geometry.slots) {
      ok = 0;
      break;
    }
    std::string peerKey(theirs[j].data() + sizeof(Geometry),
                        received[j]->receivedBytes - sizeof(Geometry));
    size_t length = 0;
    stage.windows[j] = transport.mapWindow(op.group().peer(j), peerKey, &base, &length);
    stage.bases[j] = static_cast<char*>(base);
    ok = stage.windows[j] != 0 && length >= bytes;  // the halves must lie in what it shares
  }

  uint8_t verdict = 0;
  co_await allOf(op, naturalRing(n, false).order, voteSlot, verdictSlot, ok, &verdict);
  stage.setUp = true;
  stage.ready = verdict != 0;
  if (!stage.ready) {
    releaseStage(transport, stage);
    stage.setUp = true;
    stage.halfBytes = halfBytes;
    if (logs(LogLevel::kWarn)) {
      logLine(LogLevel::kWarn, op.group().name + " rank " + std::to_string(rank) +
                                   ": allreduces of one host are not staged (" +
                                   (ok ? "another rank" : "this rank") +
                                   " could not map every peer's staging buffer): they take the "
                                   "shared-memory ring");
    }
  }
}

namespace {

// The latest mismatched op the resync goes by: the one the op's print carries, the same on every
// rank where the op does not fail as a mismatch.
std::optional<uint32_t> mismatchKnown(const Op& op) {
  if (op.callCheck().carriesMismatches()) return op.callCheck().mismatchAtStart();
  return op.group().state ? op.group().state->lastMismatch() : std::nullopt;
}

}  // namespace

bool resyncDue(std::optional<uint32_t> lastMismatch, const SharedRing& ring) {
  return lastMismatch && (!ring.resyncedAt || !opBefore(*lastMismatch, *ring.resyncedAt));
}

bool resyncDue(const Op& op, const SharedRing& ring) { return resyncDue(mismatchKnown(op), ring); }

namespace {

// What one rank holds of the group's one-host windows, as resyncAfterMismatch compares it.
struct Holding {
  static constexpr uint8_t kNone = 0, kReady = 1, kRefused = 2, kUnlike = 3;
  uint64_t stagings = 0;  // StageWindows::sequence
  uint8_t ring = kNone;
  uint8_t stage = kNone;
  uint8_t reserved[6] = {};
};

Holding holdingOf(const SharedRing& ring) {
  Holding h;
  h.stagings = ring.stage.sequence;
  if (ring.state == SharedRing::State::kReady) h.ring = Holding::kReady;
  if (ring.state == SharedRing::State::kUnavailable) h.ring = Holding::kRefused;
  if (ring.stage.setUp) h.stage = ring.stage.ready ? Holding::kReady : Holding::kRefused;
  return h;
}

}  // namespace

Task resyncAfterMismatch(Op& op, SharedRing& ring, const std::vector<int>& members) {
  Transport& transport = op.group().runtime->transport();
  // Setups the mismatch cut short: nobody heard their verdict.
  if (ring.state == SharedRing::State::kUnknown) {
    releaseWindows(transport, ring.windows);
    ring.windows = SlotWindows{};
  }
  if (!ring.stage.setUp) releaseStage(transport, ring.stage);
  // Host rings: a mismatch on another host may have cut a setup short after some of its members
  // heard the verdict, so every member lets all of them go (set up again when next wanted).
  for (auto& [key, windows] : ring.levelRings) releaseWindows(transport, windows);
  ring.levelRings.clear();
  const uint64_t voteSlot = tag::slot(kPhase, kResyncStep);
  const uint64_t answerSlot = tag::slot(kPhase, kResyncStep + 1);
  const int first = members.front();
  Holding agreed = holdingOf(ring);
  std::vector<Request*> requests;
  if (op.rank() != first) {
    const Holding mine = agreed;
    requests.push_back(op.send(first, voteSlot, &mine, sizeof(mine)));
    requests.push_back(op.recv(first, answerSlot, &agreed, sizeof(agreed)));
    co_await op.all(requests);
  } else {
    std::vector<Holding> held(members.size(), agreed);
    for (size_t i = 1; i < members.size(); ++i) {
      requests.push_back(op.recv(members[i], voteSlot, &held[i], sizeof(Holding)));
    }
    co_await op.all(requests);
    for (const Holding& h : held) {
      agreed.stagings = std::max(agreed.stagings, h.stagings);
      if (h.ring != agreed.ring) agreed.ring = Holding::kUnlike;
      if (h.stage != agreed.stage) agreed.stage = Holding::kUnlike;
    }
    requests.clear();
    for (size_t i = 1; i < members.size(); ++i) {
      requests.push_back(op.send(members[i], answerSlot, &agreed, sizeof(agreed)));
    }
    co_await op.all(requests);
  }
  if (agreed.ring == Holding::kUnlike) {
    releaseWindows(transport, ring.windows);
    ring.windows = SlotWindows{};
    ring.state = SharedRing::State::kUnknown;
  }
  if (agreed.stage == Holding::kUnlike) releaseStage(transport, ring.stage);
  ring.stage.sequence = agreed.stagings;
  ring.lastAllShared = true;
  ring.offered.clear();
  ring.resyncedAt = op.sequence();
}

}  // namespace ddl
