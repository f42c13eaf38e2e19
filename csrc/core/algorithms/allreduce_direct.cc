// Direct allreduce: for tensors in shared buffers (shm/shared_buffers.h) on every rank of one
// host. No staging and no ring: rank r maps every peer's buffer, reduces chunk r of the tensor
// straight out of all of them (its own first, then the peers' in rank order) into its own
// buffer, and copies the result into chunk r of every peer's buffer. Chunk r is read and written
// by rank r alone, so the ranks need no step-by-step coordination: one round of offers (the
// buffer's key, the element count) before, one round of "done" after, when no rank reads or
// writes another's buffer any more. Each element is reduced once, by one rank: every rank ends
// with the same bits.
//
// The offer round is all-or-nothing: every rank sees every offer, so all take the direct path
// or none does (then allreduce_shared.cc goes on with the ring), and a count mismatch fails all
// ranks at once. As the round costs a message latency, allreduce_shared.cc holds it only for
// large allreduces and while the group's last round found every tensor shared (so a group whose
// tensors are private pays it for large allreduces only). Peers' buffers stay mapped, cached per
// group by (rank, serial), until the owner reports in a later offer that it released them.
//
// Buffers are UCX windows (torch_ddl.empty_shared) or adopted blocks (SharedBuffers::adopt). A
// buffer some peer has not mapped yet may not map everywhere (an adopted one from another PID
// namespace): offers mark it fresh, and a round of "mapped" answers follows; if any rank could
// not map, all go on with the ring before any byte moves.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "../base/log.h"
#include "../base/tag.h"
#include "../reduce/reduce.h"
#include "../runtime/runtime.h"
#include "../shm/shared_buffers.h"
#include "../shm/shared_ring.h"
#include "../topology/ring_plan.h"
#include "algorithms.h"

namespace ddl {
namespace {

constexpr uint32_t kPhase = tag::kSharedPhase;  // the shared ring's sub-phase
constexpr uint32_t kOfferStep = 5, kDoneStep = 6, kMappedStep = 7;
constexpr size_t kMaxKey = 4096;
constexpr size_t kMaxReleased = 64;  // released serials reported per offer
constexpr size_t kBlockBytes = 16 << 10;

struct OfferHeader {
  uint64_t count;
  uint64_t serial;  // 0: this rank's tensor is not in a shared buffer
  uint64_t offset;  // of the tensor in its buffer
  uint32_t released;
  uint32_t keyBytes;
  uint32_t flags;
  uint32_t reserved;
};
constexpr uint32_t kAdopted = 1;  // the key is for SharedBuffers::mapAdopted
constexpr uint32_t kFresh = 2;    // not every peer has mapped this buffer yet
constexpr size_t kMaxOffer = sizeof(OfferHeader) + kMaxReleased * sizeof(uint64_t) + kMaxKey;

struct Offer {
  OfferHeader header{};
  std::string key;
};

std::string listRanks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// Why TORCH_DDL_ALLREDUCE_ALGO=direct refuses an allreduce whose tensor of these ranks is private.
std::string notSharedWords(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  return "TORCH_DDL_ALLREDUCE_ALGO=direct, but the tensor of rank(s) " + listRanks(ranks) +
         " is not in a shared buffer (allocate it with torch_ddl.empty_shared, or set "
         "TORCH_DDL_SHARED_ALLOCATOR=1 for tensors of at least TORCH_DDL_DIRECT_MIN_BYTES; pass "
         "it contiguous)";
}

// What this rank offers: its tensor's buffer (when it lies in a shared one), and the buffers it
// released since its last offer, which peers unmap.
struct OwnOffer {
  SharedBuffers::Found buffer;
  bool shared = false;
  bool fresh = false;  // not offered to this group before
  std::string bytes;
};

OwnOffer makeOffer(SharedBuffers& buffers, SharedRing& ring, void* data, size_t bytes,
                   size_t count) {
  OwnOffer own;
  own.shared = buffers.find(data, bytes, &own.buffer) && own.buffer.key.size() <= kMaxKey;
  std::vector<uint64_t> released = buffers.releasedSince(&ring.releasedSeen, kMaxReleased);
  for (uint64_t serial : released) ring.offered.erase(serial);
  own.fresh = own.shared && ring.offered.count(own.buffer.serial) == 0;
  OfferHeader header{count,
                     own.shared ? own.buffer.serial : 0,
                     own.buffer.offset,
                     static_cast<uint32_t>(released.size()),
                     static_cast<uint32_t>(own.shared ? own.buffer.key.size() : 0),
                     (own.shared && own.buffer.adopted ? kAdopted : 0) | (own.fresh ? kFresh : 0),
                     0};
  own.bytes.assign(reinterpret_cast<const char*>(&header), sizeof(header));
  own.bytes.append(reinterpret_cast<const char*>(released.data()),
                   released.size() * sizeof(uint64_t));
  if (own.shared) own.bytes += own.buffer.key;
  return own;
}

// Reads rank j's offer of `received` bytes into *o, and lets go of the buffers it says j
// released. False where it is malformed.
bool readOffer(const std::vector<char>& incoming, size_t received, int j, SharedRing& ring,
               Transport& transport, Offer* o) {
  if (received < sizeof(OfferHeader)) return false;
  std::memcpy(&o->header, incoming.data(), sizeof(OfferHeader));
  const size_t listBytes = size_t{o->header.released} * sizeof(uint64_t);
  if (o->header.released > kMaxReleased || o->header.keyBytes > kMaxKey ||
      received != sizeof(OfferHeader) + listBytes + o->header.keyBytes) {
    return false;
  }
  const char* list = incoming.data() + sizeof(OfferHeader);
  for (uint32_t i = 0; i < o->header.released; ++i) {
    uint64_t serial;
    std::memcpy(&serial, list + i * sizeof(uint64_t), sizeof(serial));
    auto it = ring.peerBuffers.find({j, serial});
    if (it != ring.peerBuffers.end()) {
      if (it->second.window != 0) {
        transport.releaseWindow(it->second.window);
      } else {
        SharedBuffers::unmapAdopted(it->second.base, it->second.length);
      }
      ring.peerBuffers.erase(it);
    }
  }
  o->key.assign(list + listBytes, o->header.keyBytes);
  return true;
}

// The offer round: every peer's offer in (*offers)[j], read as it came (*malformed says which
// was not).
Task exchangeOffers(Op& op, const std::string& mine, SharedRing& ring, std::vector<Offer>* offers,
                    std::string* malformed) {
  const int n = op.size(), rank = op.rank();
  std::vector<std::vector<char>> incoming(n);
  std::vector<Request*> requests;
  std::atomic_thread_fence(std::memory_order_release);  // the tensor's bytes before the offer
  for (int j = 0; j < n; ++j) {
    if (j == rank) continue;
    incoming[j].resize(kMaxOffer);
    requests.push_back(op.send(j, tag::slot(kPhase, kOfferStep), mine.data(), mine.size()));
    requests.push_back(
        op.recvUpTo(j, tag::slot(kPhase, kOfferStep), incoming[j].data(), kMaxOffer));
  }
  co_await op.all(requests);
  std::atomic_thread_fence(std::memory_order_acquire);
  Transport& transport = op.group().runtime->transport();
  for (int j = 0; j < n; ++j) {
    if (j == rank) continue;
    const Request* got = requests[2 * (j < rank ? j : j - 1) + 1];
    if (!readOffer(incoming[j], got->receivedBytes, j, ring, transport, &(*offers)[j])) {
      *malformed = "malformed allreduce offer from rank " + std::to_string(j);
      co_return;
    }
  }
}

// Every peer's buffer, mapped here into at[j] (mappings are kept in the ring, by rank and serial):
// "" or why one could not be.
std::string mapPeers(Op& op, SharedRing& ring, const std::vector<Offer>& offers, size_t bytes,
                     std::vector<char*>& at) {
  Transport& transport = op.group().runtime->transport();
  const int rank = op.rank();
  for (int j = 0; j < op.size(); ++j) {
    if (j == rank) continue;
    const Offer& o = offers[j];
    auto it = ring.peerBuffers.find({j, o.header.serial});
    if (it == ring.peerBuffers.end()) {
      SharedRing::Mapped mapped{0, nullptr, 0};
      std::string why;
      if (o.header.flags & kAdopted) {
        mapped.base = SharedBuffers::mapAdopted(o.key, &mapped.length, &why);
      } else {
        void* base = nullptr;
        mapped.window = transport.mapWindow(op.group().peer(j), o.key, &base, &mapped.length);
        mapped.base = mapped.window != 0 ? static_cast<char*>(base) : nullptr;
      }
      if (mapped.base == nullptr) {
        std::string failure = "rank " + std::to_string(rank) +
                              " cannot map the shared buffer of rank " + std::to_string(j) +
                              (why.empty() ? "" : ": " + why);
        if (logs(LogLevel::kWarn)) {
          logLine(LogLevel::kWarn, op.group().name + ": " + failure +
                                       "; the allreduce takes the shared-memory ring instead");
        }
        return failure;
      }
      it = ring.peerBuffers.emplace(std::make_pair(j, o.header.serial), mapped).first;
    }
    // The buffer the offer names must lie in what the peer shares.
    const size_t length = it->second.length;
    if (o.header.offset > length || bytes > length - o.header.offset) {
      return "rank " + std::to_string(j) + " offers " + std::to_string(bytes) + " bytes at byte " +
             std::to_string(o.header.offset) + " of a shared buffer of " + std::to_string(length);
    }
    at[j] = it->second.base + o.header.offset;
  }
  return "";
}

// Whether every rank could (a byte from each at tag step `step`, ordered after this rank's writes
// before it and before its reads after): *unable lists those that could not, in rank order.
Task ranksUnable(Op& op, uint32_t step, bool able, std::vector<int>* unable) {
  std::vector<uint8_t> all(op.size(), 1);
  all[op.rank()] = able ? 1 : 0;
  std::vector<Request*> requests;
  std::atomic_thread_fence(std::memory_order_release);
  for (int j = 0; j < op.size(); ++j) {
    if (j == op.rank()) continue;
    requests.push_back(op.send(j, tag::slot(kPhase, step), &all[op.rank()], 1));
    requests.push_back(op.recv(j, tag::slot(kPhase, step), &all[j], 1));
  }
  co_await op.all(requests);
  std::atomic_thread_fence(std::memory_order_acquire);
  for (int j = 0; j < op.size(); ++j) {
    if (!all[j]) unable->push_back(j);
  }
}

// This rank's chunk: reduced out of every buffer into its own, then copied into every peer's. On
// the turning thread: it gives up the turn every Op::kTurnSlice, so that heartbeats leave while
// a large buffer is reduced (peers count a rank silent for long gone for good).
Task reduceOwnChunk(Op& op, std::vector<char*> at, size_t count, DataType type, ReduceOp reduce) {
  const int n = op.size(), rank = op.rank();
  const size_t es = elementSize(type);
  const Range chunk = evenPart(count, n, rank);
  const size_t block = std::max<size_t>(kBlockBytes / es, 1);
  char* own = at[rank] + chunk.offset * es;
  for (size_t begin = 0; begin < chunk.length; begin += block) {
    if (op.turnDue()) co_await op.yieldTurn();
    const size_t length = std::min(block, chunk.length - begin);
    const size_t byteOffset = (chunk.offset + begin) * es;
    for (int j = 0; j < n; ++j) {
      if (j != rank) reduceInto(type, reduce, own + begin * es, at[j] + byteOffset, length);
    }
    for (int j = 0; j < n; ++j) {
      if (j != rank) std::memcpy(at[j] + byteOffset, own + begin * es, length * es);
    }
  }
}

}  // namespace

Task allreduceDirect(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                     SharedRing& ring, bool required, SharedRingTurn& turn, bool* used) {
  *used = false;
  const int n = op.size(), rank = op.rank();
  const size_t bytes = count * elementSize(type);
  const OwnOffer own = makeOffer(*op.group().buffers, ring, data, bytes, count);

  // Until every offer is in, no rank touches another's buffer: a failure here breaks nothing.
  turn.setClean(true);
  std::vector<Offer> offers(n);
  std::string malformed;
  co_await exchangeOffers(op, own.bytes, ring, &offers, &malformed);
  // Errors before any rank touches another's buffer leave the windows usable by later ops.
  auto refuse = [&](std::string message) {
    turn.release();
    return Error(std::move(message));
  };
  if (!malformed.empty()) throw refuse(malformed);
  std::vector<int> notShared, otherCount;
  bool anyFresh = own.fresh;
  if (!own.shared) notShared.push_back(rank);
  for (int j = 0; j < n; ++j) {
    if (j == rank) continue;
    if (offers[j].header.count != count) otherCount.push_back(j);
    if (offers[j].header.serial == 0) notShared.push_back(j);
    if (offers[j].header.flags & kFresh) anyFresh = true;
  }
  ring.lastAllShared = notShared.empty();
  if (!otherCount.empty()) {
    const int j = otherCount.front();
    throw refuse("rank " + std::to_string(j) + " allreduces " +
                 std::to_string(offers[j].header.count) + " elements, this rank " +
                 std::to_string(count) + " (every rank must pass the same shape)");
  }
  if (!notShared.empty()) {
    if (required) throw refuse(notSharedWords(std::move(notShared)));
    co_return;  // the caller goes on with the ring
  }

  std::vector<char*> at(n);
  at[rank] = static_cast<char*>(data);
  const std::string failure = mapPeers(op, ring, offers, bytes, at);

  // A buffer offered for the first time may not be mappable everywhere (another machine,
  // another PID namespace): then every rank learns it before any byte moves, and all go on
  // with the ring.
  if (anyFresh) {
    std::vector<int> unable;
    co_await ranksUnable(op, kMappedStep, failure.empty(), &unable);
    if (!unable.empty()) {
      ring.lastAllShared = false;
      if (required) {
        throw refuse("TORCH_DDL_ALLREDUCE_ALGO=direct, but rank(s) " + listRanks(unable) +
                     " cannot map their peers' shared buffers" +
                     (failure.empty() ? std::string() : " (" + failure + ")"));
      }
      co_return;  // the caller goes on with the ring
    }
    if (own.shared) ring.offered.insert(own.buffer.serial);
  }
  *used = true;
  turn.setClean(false);
  if (failure.empty()) co_await reduceOwnChunk(op, at, count, type, reduce);
  // Later ops may take the windows now: their offers leave after this rank's writes.
  turn.release();

  std::vector<int> unable;
  co_await ranksUnable(op, kDoneStep, failure.empty(), &unable);
  if (!failure.empty()) throw Error(failure);
  if (!unable.empty()) {
    throw Error("rank " + std::to_string(unable.front()) +
                " could not map every peer's shared buffer; its share of the result is missing");
  }
}

}  // namespace ddl
