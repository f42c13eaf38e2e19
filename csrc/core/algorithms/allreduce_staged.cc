// Staged allreduce: for ranks of one host and medium tensors that are not in shared buffers. Each
// rank has a staging window that every other rank maps (StageWindows, shm/shared_ring.h): a
// header of flags and two halves. Per piece of the tensor (at most a half):
//   1. copy the piece into this rank's half (of the piece's parity), all but chunk r, which no
//      other rank reads, then raise `staged`;
//   2. once every rank's `staged` is up, reduce chunk r of the piece out of the tensor and every
//      peer's half (in rank order) into its own half, and copy it back into the tensor, then
//      raise `reduced`;
//   3. once every rank's `reduced` is up, copy every other rank's chunk out of its half.
// The flags carry the staging's number (the group's count of pieces staged, the same on every
// rank), so they only ever rise and need no reset. Nothing but the flags paces the ranks: no
// message moves, and each element is reduced once, by one rank, so every rank ends with the same
// bits.
//
// Why two halves suffice: a rank writes half h at staging s only after every rank raised
// `staged` for s - 1, which each did after step 3 of s - 2, the last read of half h.
//
// Waiting: the runtime looks at the flags every turn (Op::poll), spinning for as long as a peer may
// take to do the same work (TORCH_DDL_SPIN_US, and the piece's bytes at 1 GB/s), then every
// housekeeping period while it sleeps: no peer can wake it, and it never spins long on a core it
// shares. Each rank's header also says what it staged (op number, element counts, dtype, reduce
// op): a rank that staged another shape fails every rank before any byte of it is used.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <set>

#include "../reduce/reduce.h"
#include "../runtime/runtime.h"
#include "../runtime/waits.h"
#include "../shm/shared_ring.h"
#include "../topology/ring_plan.h"
#include "algorithms.h"

namespace ddl {
namespace {

// A rank's header: what it staged last, then each flag on a cache line of its own.
struct StagedCall {
  uint64_t total;     // elements of the op
  uint64_t count;     // of the piece
  uint32_t sequence;  // of the op in its group
  uint16_t type;
  uint16_t reduce;
  bool operator==(const StagedCall&) const = default;
};
constexpr size_t kCallAt = 0, kStagedAt = 64, kReducedAt = 128;
// The one-step allreduce keeps its header, one per half, in the `staged` flag's cache line (a
// rank that has seen every flag up for staging s may stage s + 1, waiting for no second flag,
// while a slower peer still reads its header of s), and the data too where it fits in 8 bytes
// (a scalar: a loss, a count): then a peer's whole contribution is one line.
struct OnceCall {
  static constexpr uint16_t kMark = 0x01ce;
  uint32_t sequence;  // of the op in its group
  uint32_t count;     // elements
  uint8_t type;
  uint8_t reduce;
  uint16_t mark;  // kMark: written by a one-step allreduce
  uint32_t reserved;
};
static_assert(sizeof(OnceCall) == 16);
constexpr size_t kOnceCallAt[2] = {72, 88};
constexpr size_t kOnceDataAt[2] = {104, 112};
constexpr size_t kOnceInlineBytes = 8;
static_assert(kOnceDataAt[1] + kOnceInlineBytes <= kReducedAt && kOnceCallAt[0] >= kStagedAt + 8);

std::atomic_ref<uint64_t> flag(char* base, size_t at) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + at));
}

// The ranks whose flag at `at` is below `staging`.
std::vector<int> behind(const StageWindows& stage, size_t at, uint64_t staging) {
  std::vector<int> late;
  for (size_t j = 0; j < stage.bases.size(); ++j) {
    if (flag(stage.bases[j], at).load(std::memory_order_acquire) < staging) {
      late.push_back(static_cast<int>(j));
    }
  }
  return late;
}

// How long a peer may take to raise its flag after this rank did, having copied or reduced as many
// bytes: the spin time, and the bytes at kSlowestCopy (a peer descheduled for longer costs a
// housekeeping period).
constexpr double kSlowestCopy = 1e9;  // bytes per second
std::chrono::nanoseconds peerMayTake(const Op& op, size_t bytes) {
  return std::chrono::microseconds(op.group().runtime->config().spinMicros) +
         std::chrono::nanoseconds(static_cast<int64_t>(1e9 * bytes / kSlowestCopy));
}

// Until every rank's flag at `at` reached `staging`, after this rank's `bytes` of work: looked at
// every turn of the runtime (the op's deadline still holds: the runtime ends it).
Op::Until flagsReached(Op& op, const StageWindows& stage, size_t at, uint64_t staging,
                       size_t bytes) {
  return op.poll([&stage, at, staging] { return behind(stage, at, staging).empty(); },
                 peerMayTake(op, bytes));
}

std::string describe(const StagedCall& c) {
  const bool known = c.type <= static_cast<uint16_t>(DataType::kBool) &&
                     c.reduce <= static_cast<uint16_t>(ReduceOp::kBxor);
  const std::string op = "op #" + std::to_string(c.sequence) + " (";
  const std::string piece = c.count == c.total + 1
                                ? std::string(", in one step)")  // (onceAsStaged)
                                : ", a piece of " + std::to_string(c.count) + ")";
  if (!known) return op + "an unknown dtype or reduce op" + piece;
  return op + reduceOpName(static_cast<ReduceOp>(c.reduce)) + " of " + std::to_string(c.total) +
         " x " + dataTypeName(static_cast<DataType>(c.type)) + piece;
}

// Whom a timeout waited for at `staging`: the ranks that did not stage it (or, all having
// staged, did not reduce their share), and whether they had started the op at all. A rank whose
// call print has not arrived either is left to the runtime's words ("has not started this op").
// The op each rank staged last: from its header at kCallAt, or (`once`) its one-step header of
// `staging`'s half.
uint32_t lastStaged(const StageWindows& stage, int j, uint64_t staging, bool once) {
  if (once) {
    OnceCall theirs;
    std::memcpy(&theirs, stage.bases[j] + kOnceCallAt[staging & 1], sizeof(theirs));
    return theirs.sequence;
  }
  StagedCall theirs;
  std::memcpy(&theirs, stage.bases[j] + kCallAt, sizeof(theirs));
  return theirs.sequence;
}

// The one-step allreduce (`once`) waits for `staged` alone.
std::string timeoutWords(const Op& op, const StageWindows& stage, uint64_t staging,
                         bool once = false) {
  const std::set<int> notStarted = waitsOf(op).notStarted;
  std::vector<int> late = behind(stage, kStagedAt, staging);
  const bool staged = late.empty();
  if (staged) late = behind(stage, kReducedAt, staging);
  std::string said;
  for (int j : late) {
    const uint32_t last = lastStaged(stage, j, staging, once);
    std::string words = "rank " + std::to_string(j);
    if (staged) {
      words += " has not reduced its share";
    } else if (last != op.sequence()) {
      if (notStarted.count(j) > 0) continue;
      words += " has not started this op (the last it staged was op #" + std::to_string(last) + ")";
    } else {
      words += " has not staged its next piece";
    }
    said += (said.empty() ? ": " : "; ") + words;
  }
  return "Timed out after " + std::to_string(op.timeout().count()) + " ms" + said +
         " (staged allreduce over shared memory, staging " + std::to_string(staging) + ")";
}

// The words of a mismatch: rank j's call and this rank's.
[[noreturn]] void raiseMismatch(Op& op, int j, const StagedCall& theirs, const StagedCall& call) {
  // Worded as the call check words it (CallCheck::verdict), whichever finds it first.
  op.raise(Error("the ranks' calls differ: rank " + std::to_string(j) + " called " +
                     describe(theirs) + ", rank " + std::to_string(op.rank()) + " called " +
                     describe(call) + " (staged over shared memory)",
                 StatusKind::kMismatch));
}

// Every rank staged the same call as this one, once all raised `staged`.
void checkCalls(Op& op, const StageWindows& stage, const StagedCall& call) {
  for (size_t j = 0; j < stage.bases.size(); ++j) {
    StagedCall theirs;
    std::memcpy(&theirs, stage.bases[j] + kCallAt, sizeof(theirs));
    if (!(theirs == call)) raiseMismatch(op, static_cast<int>(j), theirs, call);
  }
}

// Clears the op's words for a timeout and whom it awaits as the algorithm's frame goes (they
// refer to it), however it is left.
struct ForgetWaitWords {
  Op& op;
  ~ForgetWaitWords() {
    op.describeTimeout = nullptr;
    op.awaitedPeers = nullptr;
  }
};

// The halves' offset at `staging`.
size_t halfAt(const StageWindows& stage, uint64_t staging) {
  return StageWindows::kHeaderBytes + (staging & 1) * stage.halfBytes;
}

// What the one-step allreduce writes in its header.
OnceCall onceCall(uint32_t sequence, size_t count, DataType type, ReduceOp reduce) {
  return OnceCall{sequence,
                  static_cast<uint32_t>(count),
                  static_cast<uint8_t>(type),
                  static_cast<uint8_t>(reduce),
                  OnceCall::kMark,
                  0};
}

// A one-step header in the staged words (describe): a count one above the total.
StagedCall onceAsStaged(const OnceCall& c) {
  if (c.mark != OnceCall::kMark) return StagedCall{0, 0, c.sequence, 0xffff, 0xffff};
  return StagedCall{c.count, uint64_t{c.count} + 1, c.sequence, c.type, c.reduce};
}

// Where a rank's data of `staging` lies: in its flag's line where it fits, else its half.
const char* onceData(const StageWindows& stage, int j, uint64_t staging, size_t bytes) {
  return stage.bases[j] +
         (bytes <= kOnceInlineBytes ? kOnceDataAt[staging & 1] : halfAt(stage, staging));
}

// Whom a one-step allreduce at `staging` waits for.
std::set<int> onceAwaited(const StageWindows& stage, uint64_t staging, int rank) {
  std::vector<int> late = behind(stage, kStagedAt, staging);
  std::set<int> peers(late.begin(), late.end());
  peers.erase(rank);
  return peers;
}

// Step 2 of a piece: this rank's chunk (`length` elements at `at` of every half) reduced out of
// the tensor (`source`) and every peer's half, in rank order, into its own half, and copied back
// into the tensor. Block by block: the copy back, and each further peer's pass, then read what
// the block's first pass has just left in the nearest cache, not the whole chunk again.
constexpr size_t kReduceBlockBytes = 8 << 10;
void reduceChunk(const StageWindows& stage, int rank, size_t at, char* source, size_t length,
                 DataType type, ReduceOp reduce) {
  const size_t es = elementSize(type);
  const size_t block = std::max<size_t>(kReduceBlockBytes / es, 1);
  char* mine = stage.bases[rank] + at;
  for (size_t done = 0; done < length; done += block) {
    const size_t elements = std::min(block, length - done), offset = done * es;
    bool firstPeer = true;
    for (size_t j = 0; j < stage.bases.size(); ++j) {
      if (static_cast<int>(j) == rank) continue;
      const char* theirs = stage.bases[j] + at + offset;
      if (firstPeer) {
        reduceTo(type, reduce, mine + offset, source + offset, theirs, elements);
      } else {
        reduceInto(type, reduce, mine + offset, theirs, elements);
      }
      firstPeer = false;
    }
    std::memcpy(source + offset, mine + offset, elements * es);
  }
}

}  // namespace

bool onceMayRun(const SharedRing& ring, size_t bytes, std::optional<uint32_t> lastMismatch) {
  return ring.state == SharedRing::State::kReady && ring.stage.ready &&
         ring.stage.halfBytes >= bytes && !resyncDue(lastMismatch, ring);
}

uint64_t onceStage(StageWindows& stage, int rank, uint32_t sequence, const void* data, size_t count,
                   DataType type, ReduceOp reduce) {
  const uint64_t staging = ++stage.sequence;
  char* own = stage.bases[rank];
  const size_t bytes = count * elementSize(type);
  std::memcpy(const_cast<char*>(onceData(stage, rank, staging, bytes)), data, bytes);
  const OnceCall call = onceCall(sequence, count, type, reduce);
  std::memcpy(own + kOnceCallAt[staging & 1], &call, sizeof(call));
  flag(own, kStagedAt).store(staging, std::memory_order_release);
  return staging;
}

bool onceArrived(const StageWindows& stage, uint64_t staging) {
  for (char* base : stage.bases) {
    if (flag(base, kStagedAt).load(std::memory_order_acquire) < staging) return false;
  }
  return true;
}

bool onceAgrees(const StageWindows& stage, uint64_t staging, int rank) {
  const size_t at = kOnceCallAt[staging & 1];
  for (size_t j = 0; j < stage.bases.size(); ++j) {
    if (std::memcmp(stage.bases[j] + at, stage.bases[rank] + at, sizeof(OnceCall)) != 0) {
      return false;
    }
  }
  return true;
}

void onceReduce(const StageWindows& stage, uint64_t staging, void* data, size_t count,
                DataType type, ReduceOp reduce) {
  const size_t es = elementSize(type), bytes = count * es, n = stage.bases.size();
  // Chunk c (splitEven's) in the order the staged and direct allreduces reduce it, on rank c:
  // rank c's data first, then the others' in rank order. The same bits whichever path runs.
  for (size_t c = 0; c < n; ++c) {
    const auto [first, length] = evenPart(count, n, c);
    if (length == 0) continue;
    const size_t at = first * es;
    char* out = static_cast<char*>(data) + at;
    const size_t second = c == 0 ? 1 : 0;
    reduceTo(type, reduce, out, onceData(stage, static_cast<int>(c), staging, bytes) + at,
             onceData(stage, static_cast<int>(second), staging, bytes) + at, length);
    for (size_t j = second + 1; j < n; ++j) {
      if (j == c) continue;
      reduceInto(type, reduce, out, onceData(stage, static_cast<int>(j), staging, bytes) + at,
                 length);
    }
  }
}

Task allreduceOnce(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                   SharedRing& ring, SharedRingTurn& turn, uint64_t staged) {
  StageWindows& stage = ring.stage;
  const int rank = op.rank();
  op.callCheck().watch();
  turn.mendsAfterMismatch();  // the next op resyncs the windows after a mismatch
  turn.setClean(false);
  const uint64_t staging =
      staged != 0 ? staged : onceStage(stage, rank, op.sequence(), data, count, type, reduce);
  op.describeTimeout = [&op, &stage, staging] { return timeoutWords(op, stage, staging, true); };
  op.awaitedPeers = [&stage, staging, rank] { return onceAwaited(stage, staging, rank); };
  const ForgetWaitWords forget{op};
  co_await flagsReached(op, stage, kStagedAt, staging, count * elementSize(type));
  const OnceCall call = onceCall(op.sequence(), count, type, reduce);
  for (int j = 0; j < op.size(); ++j) {
    OnceCall theirs;
    std::memcpy(&theirs, stage.bases[j] + kOnceCallAt[staging & 1], sizeof(theirs));
    if (std::memcmp(&theirs, &call, sizeof(call)) != 0) {
      raiseMismatch(op, j, onceAsStaged(theirs), onceAsStaged(call));
    }
  }
  onceReduce(stage, staging, data, count, type, reduce);
  turn.release();
}

Task allreduceOnceFrom(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                       std::unique_ptr<SharedRingTurn> turn, uint64_t staging) {
  co_await allreduceOnce(op, data, count, type, reduce, *op.group().sharedRing, *turn, staging);
}

Task allreduceStaged(Op& op, void* data, size_t count, DataType type, ReduceOp reduce,
                     SharedRing& ring, SharedRingTurn& turn) {
  StageWindows& stage = ring.stage;
  const int n = op.size(), rank = op.rank();
  const size_t es = elementSize(type);
  const size_t pieceCount = std::max<size_t>(stage.halfBytes / es, 1);
  char* tensor = static_cast<char*>(data);
  uint64_t waitedFor = 0;  // the staging a timeout waits on
  op.describeTimeout = [&op, &stage, &waitedFor] { return timeoutWords(op, stage, waitedFor); };
  // Whom it waits for now: the ranks that did not stage the piece, else did not reduce it.
  op.awaitedPeers = [&stage, &waitedFor, rank] {
    std::vector<int> late = behind(stage, kStagedAt, waitedFor);
    if (late.empty()) late = behind(stage, kReducedAt, waitedFor);
    std::set<int> peers(late.begin(), late.end());
    peers.erase(rank);
    return peers;
  };
  const ForgetWaitWords forget{op};

  for (size_t first = 0; first < count; first += pieceCount) {
    if (op.turnDue()) co_await op.yieldTurn();
    const size_t length = std::min(pieceCount, count - first);
    const uint64_t staging = ++stage.sequence;
    const size_t half = StageWindows::kHeaderBytes + (staging & 1) * stage.halfBytes;
    char* own = stage.bases[rank];
    // 1. The piece into this rank's half, but for its own chunk, which only it reads.
    turn.setClean(false);
    const std::vector<Range> chunks = splitEven(length, n);
    const Range chunk = chunks[rank];
    const size_t before = chunk.offset * es, after = (chunk.offset + chunk.length) * es;
    std::memcpy(own + half, tensor + first * es, before);
    std::memcpy(own + half + after, tensor + first * es + after, length * es - after);
    const StagedCall call{count, length, op.sequence(), static_cast<uint16_t>(type),
                          static_cast<uint16_t>(reduce)};
    std::memcpy(own + kCallAt, &call, sizeof(call));
    flag(own, kStagedAt).store(staging, std::memory_order_release);
    waitedFor = staging;
    co_await flagsReached(op, stage, kStagedAt, staging, length * es);
    checkCalls(op, stage, call);
    // 2. This rank's chunk, reduced out of the tensor and every peer's half into its own half,
    // and back into the tensor.
    reduceChunk(stage, rank, half + before, tensor + first * es + before, chunk.length, type,
                reduce);
    flag(own, kReducedAt).store(staging, std::memory_order_release);
    co_await flagsReached(op, stage, kReducedAt, staging, chunk.length * es * n);
    // 3. Every other rank's chunk, out of its half.
    for (int j = 0; j < n; ++j) {
      if (j == rank) continue;
      std::memcpy(tensor + (first + chunks[j].offset) * es,
                  stage.bases[j] + half + chunks[j].offset * es, chunks[j].length * es);
    }
  }
  turn.release();
}

}  // namespace ddl
