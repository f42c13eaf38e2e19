// Shared-memory ring allreduce: the ring of allreduce_ring.cc with every byte moved through the
// group's shared windows (shared_ring.h) instead of messages. Messages only say which slot holds
// what (a notice: step, segment, slot) and which slot is free again.
//
// Transfers. Rank r writes into slots of the next rank's inbox. Step 0 copies r's own chunk
// there, segment by segment. On a notice for step s (chunk c = r - s - 1 mod P, segment k):
//   s < P-2:        reduce own chunk c with the slot straight into a slot of the next inbox;
//   s == P-2:       reduce the slot into own chunk c (now final) and copy it to the next inbox;
//   P-2 < s < 2P-3: copy the slot into own chunk c and into the next inbox;
//   s == 2P-3:      copy the slot into own chunk c.
// No kernel copy and no staging on the receiving side: for two ranks this is the copy-based
// design of benchmarks/reference/shm_ring.cc.
//
// Flow control. A rank tracks which slots of the next inbox are free (all, when an op starts).
// New data (step 0) enters only while at least two are free; forwarding may take the last one.
// The ring as a whole then never fills, so some rank can always move: no deadlock. An op ends
// once every slot it wrote has been given back, so the next op finds all slots free again.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>

#include "../engine/engine.h"
#include "../engine/shared_buffers.h"
#include "../engine/tag.h"
#include "../reduce/reduce.h"
#include "../topology/ring_plan.h"
#include "algorithms.h"
#include "shared_ring.h"

namespace ddl {

SharedRing::~SharedRing() {
  std::vector<uint64_t> windows;
  for (const auto& [owner, mapped] : peerBuffers) {
    if (mapped.window != 0) {
      windows.push_back(mapped.window);
    } else {
      SharedBuffers::unmapAdopted(mapped.base, mapped.length);
    }
  }
  if (outboxWindow != 0) windows.push_back(outboxWindow);
  if (inboxWindow != 0) windows.push_back(inboxWindow);
  if (windows.empty()) return;
  Engine* e = engine;
  Engine::postIfAlive(e, [e, windows] {
    for (uint64_t w : windows) e->transport().releaseWindow(w);
  });
}

void SharedRing::advance() {
  ++serving;
  while (abandoned.erase(serving) > 0) ++serving;
}

namespace {

constexpr uint32_t kPhase = tag::kSharedPhase;
constexpr uint32_t kKeyStep = 0, kVoteStep = 1, kVerdictStep = 2, kNoticeStep = 3, kFreeStep = 4;
constexpr size_t kMaxKey = 4096;
constexpr size_t kBlockBytes = 16 << 10;
std::string unavailable(SharedAllreduce mode) {
  return std::string("TORCH_DDL_ALLREDUCE_ALGO=") +
         (mode == SharedAllreduce::kDirect ? "direct" : "shm_ring") +
         ", but not every rank of the group can map its neighbour's shared memory (ranks on other "
         "hosts, or UCX without a shared-memory transport); use auto or ring";
}
constexpr uint32_t kAbandoned = ~uint32_t{0};  // a notice's step when its sender gave up

struct Notice {
  uint64_t count;  // elements of the allreduce, to catch ranks that disagree
  uint64_t segment;
  uint32_t step;
  uint32_t slot;
};

struct Geometry {
  uint64_t slotBytes;
  uint64_t slots;
};

int mod(long a, int n) { return static_cast<int>(((a % n) + n) % n); }

// The op's turn at the windows: taken when the op starts, given up when it ends, however it
// ends. Ending without release() (a failure, a timeout) breaks the ring for later ops.
class Turn {
 public:
  Turn(SharedRing& ring, const Op& op) : ring_(ring), ticket_(ring.tickets++) {
    what_ = op.name() + " op #" + std::to_string(op.sequence()) + " on " + op.group().name;
  }
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;
  ~Turn() {
    if (released_) return;
    if (ring_.status != SharedRing::Status::kBroken) {
      ring_.status = SharedRing::Status::kBroken;
      ring_.broken = "the shared-memory ring of this group is unusable: " + what_ +
                     " failed while using it (destroy and re-create the process group)";
    }
    if (ring_.serving == ticket_) {
      ring_.advance();
    } else {
      ring_.abandoned.insert(ticket_);
    }
  }
  bool ready() const {
    return ring_.serving == ticket_ || ring_.status == SharedRing::Status::kBroken;
  }
  void release() {
    released_ = true;
    ring_.advance();
  }

 private:
  SharedRing& ring_;
  uint64_t ticket_;
  std::string what_;
  bool released_ = false;
};

void releaseWindows(Transport& transport, SharedRing& ring) {
  if (ring.outboxWindow != 0) transport.releaseWindow(ring.outboxWindow);
  if (ring.inboxWindow != 0) transport.releaseWindow(ring.inboxWindow);
  ring.outboxWindow = ring.inboxWindow = 0;
  ring.inbox = ring.outbox = nullptr;
}

// Every rank allocates its inbox and sends the key to the previous rank, which maps it; rank 0
// collects whether everyone could and tells everyone. All or nothing.
Task setUp(Op& op, SharedRing& ring, PipelineSettings settings) {
  const int n = op.size();
  const int rank = op.rank();
  const int next = (rank + 1) % n;
  const int prev = (rank + n - 1) % n;
  Transport& transport = op.group().engine->transport();
  Geometry geometry{settings.segmentBytes, std::max<uint64_t>(2 * settings.depth, 2)};
  std::string key;
  void* base = nullptr;
  ring.inboxWindow = transport.allocateWindow(geometry.slotBytes * geometry.slots, &base, &key);
  ring.inbox = static_cast<char*>(base);
  std::string offer(reinterpret_cast<const char*>(&geometry), sizeof(geometry));
  if (ring.inboxWindow != 0) offer += key;
  std::vector<char> theirs(kMaxKey);
  Request* sent = op.send(prev, tag::slot(kPhase, kKeyStep), offer.data(), offer.size());
  Request* got = op.recvUpTo(next, tag::slot(kPhase, kKeyStep), theirs.data(), theirs.size());
  co_await op.all(sent, got);

  Geometry nextGeometry{};
  std::memcpy(&nextGeometry, theirs.data(), std::min(sizeof(nextGeometry), got->receivedBytes));
  uint8_t ok = 0;
  if (ring.inboxWindow != 0 && got->receivedBytes > sizeof(Geometry) &&
      nextGeometry.slotBytes == geometry.slotBytes && nextGeometry.slots == geometry.slots) {
    std::string nextKey(theirs.data() + sizeof(Geometry), got->receivedBytes - sizeof(Geometry));
    ring.outboxWindow = transport.mapWindow(op.group().peers[next], nextKey, &base);
    ring.outbox = static_cast<char*>(base);
    ok = ring.outboxWindow != 0;
  }

  uint8_t verdict = ok;
  if (rank == 0) {
    std::vector<uint8_t> votes(n, 1);
    std::vector<Request*> requests;
    for (int r = 1; r < n; ++r) {
      requests.push_back(op.recv(r, tag::slot(kPhase, kVoteStep), &votes[r], 1));
    }
    co_await op.all(requests);
    for (int r = 1; r < n; ++r) verdict &= votes[r];
    requests.clear();
    for (int r = 1; r < n; ++r) {
      requests.push_back(op.send(r, tag::slot(kPhase, kVerdictStep), &verdict, 1));
    }
    co_await op.all(requests);
  } else {
    Request* vote = op.send(0, tag::slot(kPhase, kVoteStep), &ok, 1);
    Request* answer = op.recv(0, tag::slot(kPhase, kVerdictStep), &verdict, 1);
    co_await op.all(vote, answer);
  }
  ring.slotBytes = geometry.slotBytes;
  ring.slots = geometry.slots;
  ring.status = verdict ? SharedRing::Status::kReady : SharedRing::Status::kUnavailable;
  if (!verdict) releaseWindows(transport, ring);
}

}  // namespace

Task allreduceShared(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                     PipelineSettings settings, SharedAllreduce mode, Adoptable adoptable) {
  const bool required = mode != SharedAllreduce::kAuto;
  const int n = op.size();
  if (n == 1 || count == 0) co_return;
  SharedRing& ring = *op.group().sharedRing;
  const size_t es = elementSize(type);
  if (ring.status == SharedRing::Status::kUnavailable) {
    if (required) throw Error(unavailable(mode));
    co_await allreduceRing(op, data, count, type, reduce, settings);
    co_return;
  }
  Turn turn(ring, op);
  co_await op.until([&turn] { return turn.ready(); });
  if (ring.status == SharedRing::Status::kBroken) throw Error(ring.broken);
  if (ring.status == SharedRing::Status::kUnknown) co_await setUp(op, ring, settings);
  if (ring.status == SharedRing::Status::kUnavailable) {
    turn.release();
    if (required) throw Error(unavailable(mode));
    co_await allreduceRing(op, data, count, type, reduce, settings);
    co_return;
  }
  if (adoptable.base != nullptr) {
    // Here, holding the turn, no earlier op of this group still writes the tensor.
    op.group().engine->sharedBuffers()->adopt(adoptable.base, adoptable.bytes);
  }
  if (mode == SharedAllreduce::kDirect ||
      (mode == SharedAllreduce::kAuto &&
       (ring.lastAllShared || count * es >= settings.directMinBytes))) {
    bool used = false;
    std::function<void()> releaseTurn = [&turn] { turn.release(); };
    co_await allreduceDirect(op, data, count, type, reduce, ring, mode == SharedAllreduce::kDirect,
                             releaseTurn, &used);
    if (used) co_return;
  }
  if (settings.segmentBytes < es) {  // slots too small for one element
    turn.release();
    co_await allreduceRing(op, data, count, type, reduce, settings);
    co_return;
  }

  const int rank = op.rank();
  const int next = (rank + 1) % n;
  const int prev = (rank + n - 1) % n;
  const uint32_t steps = 2 * static_cast<uint32_t>(n - 1);
  const size_t slots = ring.slots;
  std::vector<Range> chunks = splitEven(count, n);
  size_t largest = 0;
  for (const Range& c : chunks) largest = std::max(largest, c.length);
  const size_t segment = ring.slotBytes / es;
  const uint64_t segments = (largest + segment - 1) / segment;
  const uint64_t transfers = steps * segments;  // each rank writes and reads this many slots
  char* buffer = static_cast<char*>(data);
  auto part = [&](int chunk, uint64_t k) {
    const Range& c = chunks[chunk];
    size_t begin = std::min(k * segment, c.length);
    return Range{c.offset + begin, std::min(segment, c.length - begin)};
  };

  std::vector<uint32_t> freeSlots;  // of the next inbox
  for (size_t s = slots; s-- > 0;) freeSlots.push_back(static_cast<uint32_t>(s));
  std::vector<Notice> noticeIn(slots);
  std::vector<uint32_t> freedIn(slots);
  std::deque<Request*> noticeRecvs, freedRecvs;
  uint64_t noticesPosted = 0, noticesTaken = 0, freedPosted = 0, freedTaken = 0;
  std::deque<Notice> arrived;  // notices taken, slots not yet consumed
  std::deque<Notice> noticesOut;
  std::deque<uint32_t> freedOut;
  std::vector<Request*> sends;
  uint64_t injected = 0, consumed = 0, written = 0;

  auto notify = [&](uint32_t step, uint64_t k, uint32_t slot) {
    std::atomic_thread_fence(std::memory_order_release);  // the slot's bytes before the notice
    noticesOut.push_back(Notice{count, k, step, slot});
    sends.push_back(
        op.send(next, tag::slot(kPhase, kNoticeStep), &noticesOut.back(), sizeof(Notice)));
    ++written;
  };
  auto takeSlot = [&] {
    uint32_t s = freeSlots.back();
    freeSlots.pop_back();
    return s;
  };
  // Consumes one slot of the inbox; false when it must forward and the next inbox is full.
  auto consume = [&](const Notice& m) {
    const bool forwards = m.step + 1 < steps;
    if (forwards && freeSlots.empty()) return false;
    Range g = part(mod(static_cast<long>(rank) - m.step - 1, n), m.segment);
    const size_t bytes = g.length * es;
    char* mine = buffer + g.offset * es;
    const char* in = ring.inbox + m.slot * ring.slotBytes;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (forwards) {
      uint32_t slot = takeSlot();
      char* out = ring.outbox + slot * ring.slotBytes;
      if (m.step + 2 < static_cast<uint32_t>(n)) {
        reduceTo(type, reduce, out, mine, in, g.length);
      } else if (m.step + 2 == static_cast<uint32_t>(n)) {
        // Final: into the tensor, and on to the next inbox block by block, while in L1.
        const size_t block = std::max<size_t>(kBlockBytes / es, 1);
        for (size_t at = 0; at < g.length; at += block) {
          size_t length = std::min(block, g.length - at);
          reduceTo(type, reduce, mine + at * es, mine + at * es, in + at * es, length);
          std::memcpy(out + at * es, mine + at * es, length * es);
        }
      } else {
        std::memcpy(out, in, bytes);
        std::memcpy(mine, in, bytes);
      }
      notify(m.step + 1, m.segment, slot);
    } else {
      std::memcpy(mine, in, bytes);
    }
    freedOut.push_back(m.slot);
    sends.push_back(op.send(prev, tag::slot(kPhase, kFreeStep), &freedOut.back(), 4));
    ++consumed;
    return true;
  };

  // A rank that gives up tells the next one, which then gives up too: around the ring, nobody
  // is left waiting for data that will not come.
  auto abandon = [&] {
    noticesOut.push_back(Notice{count, 0, kAbandoned, 0});
    op.send(next, tag::slot(kPhase, kNoticeStep), &noticesOut.back(), sizeof(Notice));
  };
  op.describeTimeout = [&] {
    std::string why = "Timed out after " + std::to_string(op.timeout().count()) + " ms: ";
    if (consumed < transfers && arrived.empty()) {
      return why + "no data from rank " + std::to_string(prev) +
             " (shared-memory ring: " + std::to_string(consumed) + " of " +
             std::to_string(transfers) + " slots received)";
    }
    return why + "rank " + std::to_string(next) + " does not consume its slots (" +
           std::to_string(freedTaken) + " of " + std::to_string(written) +
           " written slots given back)";
  };

  while (true) {
    while (noticesPosted < transfers && noticeRecvs.size() < slots) {
      noticeRecvs.push_back(op.recv(prev, tag::slot(kPhase, kNoticeStep),
                                    &noticeIn[noticesPosted % slots], sizeof(Notice)));
      ++noticesPosted;
    }
    while (freedPosted < transfers && freedRecvs.size() < slots) {
      freedRecvs.push_back(
          op.recv(next, tag::slot(kPhase, kFreeStep), &freedIn[freedPosted % slots], 4));
      ++freedPosted;
    }
    // Receives of one tag from one sender complete in posting order.
    while (!freedRecvs.empty() && freedRecvs.front()->done) {
      uint32_t slot = freedIn[freedTaken++ % slots];
      if (slot >= slots) throw Error("rank " + std::to_string(next) + " freed a slot it never had");
      freeSlots.push_back(slot);
      freedRecvs.pop_front();
    }
    while (!noticeRecvs.empty() && noticeRecvs.front()->done) {
      Notice m = noticeIn[noticesTaken++ % slots];
      noticeRecvs.pop_front();
      if (m.count != count) {
        abandon();
        throw Error("rank " + std::to_string(prev) + " allreduces " + std::to_string(m.count) +
                    " elements, this rank " + std::to_string(count) +
                    " (every rank must pass the same shape)");
      }
      if (m.step == kAbandoned) {
        abandon();
        throw Error("rank " + std::to_string(prev) +
                    " abandoned it (the ranks do not all pass the same number of elements)");
      }
      if (m.step >= steps || m.segment >= segments || m.slot >= slots) {
        abandon();
        throw Error("malformed notice from rank " + std::to_string(prev));
      }
      arrived.push_back(m);
    }
    for (auto it = arrived.begin(); it != arrived.end();) {
      it = consume(*it) ? arrived.erase(it) : std::next(it);
    }
    while (injected < segments && freeSlots.size() >= 2) {
      Range g = part(rank, injected);
      uint32_t slot = takeSlot();
      std::memcpy(ring.outbox + slot * ring.slotBytes, buffer + g.offset * es, g.length * es);
      notify(0, injected++, slot);
    }
    std::erase_if(sends, [](Request* r) { return r->done; });
    if (consumed == transfers && injected == segments && freedTaken == written && sends.empty()) {
      break;
    }
    co_await op.next();
  }
  op.describeTimeout = nullptr;
  turn.release();
}

}  // namespace ddl
