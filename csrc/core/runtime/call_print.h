// Call prints: what one rank called, as the next rank checks it. Every collective sends a print
// of the call (CallPrint: the collective, its sequence number, dtype, element count, root and
// reduce op) to the next rank of the group and checks the one from the previous rank against
// its own; the op completes only once that print has arrived and agreed. If any two ranks
// disagree, two neighbours do, so at least one rank finds it: it fails the op naming both calls
// (and its group tells the others: group/notices.h). The print is a message of its own, sent as
// the op starts alongside the algorithm's first messages, so the check is the same on every path
// (shared memory or messages, one host or many) and costs no extra round trip.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "../base/status.h"
#include "../base/types.h"
#include "../topology/block_plan.h"

namespace ddl {

enum class Collective : uint8_t {
  kNone,
  kAllreduce,
  kBroadcast,
  kAllgather,
  kAllgatherVarying,
  kBarrier,
  kReduceScatter,
  kReduce,
  kGather,
  kScatter,
  kAlltoall,
  // A window's own collectives (group/window.h), over allreduce, allgather and barrier: prints
  // of their own, so that they never pair with a user's call of the same shape.
  kWindowCreate,
  kWindowRegister,
  kWindowDeregister,
};

// The collective's name, as torch's calls spell it ("all_reduce", "all_gather", ...): the op's
// name in errors, logs and the flight recorder.
const char* collectiveName(Collective collective);

// What one rank called, as the next rank checks it. Fields a collective does not have stay at
// their defaults.
struct CallPrint {
  static constexpr uint32_t kMagic = 0x70646c64;  // "ddlp"
  static constexpr uint8_t kUnset = 0xff;
  uint32_t magic = kMagic;
  uint32_t sequence = 0;
  Collective collective = Collective::kNone;
  uint8_t type = kUnset;    // DataType
  uint8_t reduce = kUnset;  // ReduceOp
  // An allreduce's (CallCheck::carryMismatches): how many ops before this one the latest
  // mismatched op this rank knew of when the op started was (GroupState::lastMismatch; 0: none,
  // 255: that many or more). Ranks that differ could resync their shared-memory windows at
  // different ops (shm/shared_ring.h), so a difference fails the op as a mismatch. 0 for other
  // collectives.
  uint8_t mismatchAge = 0;
  int32_t root = -1;
  uint64_t count = 0;  // elements (per rank where each rank has a block)

  bool operator==(const CallPrint& other) const;
  // e.g. "allreduce(sum, 100 x float32)", "broadcast(4 x int64 from rank 1)".
  std::string describe() const;
  // count elements of its dtype, in bytes (0 for a call without a dtype).
  uint64_t bytes() const;
};
static_assert(sizeof(CallPrint) == 24);

CallPrint callPrint(Collective collective, size_t count = 0,
                    std::optional<DataType> type = std::nullopt,
                    std::optional<ReduceOp> reduce = std::nullopt, int root = -1);

// Whom a rank's print goes to as an op starts (next), and whose it asks for (previous): every
// rank has one next, and its ranks' arrows join every rank to a ring, so where two ranks called
// different things two that print to each other did. In a group without a grid (block_plan.h)
// the ring is the ranks in order (next = rank + 1). In a grid, next is the rank one position on
// along the innermost dimension whose coordinate can grow, and the ranks at the end of every
// dimension go to the next along the outermost, wrapping: each arrow is position + 1 of one
// dimension's ring, which the grid's rings and Bruck's rounds (algorithms/allgather_bruck.cc,
// reduce_scatter_bruck.cc) send to anyway, so that the print needs no message of its own there.
// The ranks at the end of the outermost dimension's other coordinates are the ring; every other
// rank's arrows lead to it. A rank is asked by at most one rank a dimension, and the first rank
// of a host by none.
// Unset (next -1, in groups made by hand): the ranks in order.
struct PrintRing {
  int next = -1;
  std::vector<int> previous;
};
PrintRing printRing(int rank, int size, const BlockPlan* grid);

class Op;
struct Request;

// An op's call check. A collective carries a print of its call; its ranks check it around the
// ring and tell each other when it fails (group/notices.h). Point-to-point ops carry none.
// Every peer the op sends to gets the print before its first message, and every peer it receives
// from is asked for its print before the first receive is posted: a print arrives before that
// peer's data, so no data of a rank that called something else is ever used.
class CallCheck {
 public:
  explicit CallCheck(Op& op) : op_(op) {}
  CallCheck(const CallCheck&) = delete;
  CallCheck& operator=(const CallCheck&) = delete;

  // The call to check, numbered as the op is (collective kNone: none).
  void set(const CallPrint& print);
  bool on() const { return print_.collective != Collective::kNone; }
  const CallPrint& print() const { return print_; }
  // A small allreduce at two ranks carries its data in the print (one message each way instead
  // of two): set before the op starts; the bytes are read when it starts.
  static constexpr size_t kInlineMax = 1024;
  void setInline(const void* data, size_t bytes);
  bool inlined() const { return inlineBytes_ > 0; }
  // The op's body may resync the group's shared-memory windows after a mismatch (an allreduce):
  // its print carries the latest mismatched op known when it starts, which the resync goes by
  // (resyncDue). Set before the op starts.
  void carryMismatches() { carries_ = true; }
  // The group's latest mismatched op known here when the op started (none before it has, or
  // where its print carries none).
  std::optional<uint32_t> mismatchAtStart() const { return mismatchAtStart_; }
  bool carriesMismatches() const { return carries_ && started_; }
  // The op's body decides, holding its group's shared-memory turn, whether the call is checked
  // by prints (start()) or through the staging buffers (watch()): the one-step allreduce
  // (algorithms/allreduce_staged.cc), whose ranks send no print. Set before the op starts.
  void defer() { deferred_ = true; }
  bool deferred() const { return deferred_ && !started_ && !watching_; }
  // Sends this rank's print to the next rank and asks for the previous rank's.
  void start();
  // Sends nothing, and asks the ranks start() would ask for their prints, not waiting for them
  // (done() does not): one that comes is from a rank that checks this op by prints where this
  // rank does not (it called another collective, or decided otherwise whether the group's
  // windows must be mended first), and fails the op as a mismatch (verdict). What has not come
  // when the op ends is cancelled with it.
  void watch();
  bool watching() const { return watching_; }
  // Whether every print sent and asked for so far is done (the op completes once they are).
  bool done() const;
  // Before the op's first message to `peer`, and its first receive from it (once started).
  void beforeSend(int peer) {
    if (started_) send(peer);
  }
  void beforeReceive(int peer) {
    if (started_) ask(peer);
  }
  // What a print that arrived (`req`, done and not failed) says: ok where it agrees with this
  // rank's call, else the failure naming both calls.
  Status verdict(const Request& req) const;
  // The print the previous rank sends as it starts (missing: it has not started the op).
  bool isStartPrint(const Request& req) const;
  // The print asked from `peer` (nullptr if none), and the data it carried once it arrived.
  Request* printFrom(int peer) const;
  const char* inlinePayload(int peer) const;

 private:
  void send(int peer);
  void ask(int peer);
  void askPrevious();  // the ranks whose print this rank checks (PrintRing::previous)
  // Which peers were sent this op's print and asked for theirs: bits of the masks in groups of
  // up to 64 ranks, kSent | kAsked by peer met in larger ones.
  static constexpr uint8_t kSent = 1, kAsked = 2;
  bool mark(int peer, uint8_t bit);  // sets it; whether it was set
  struct PrintIn {
    alignas(8) char bytes[sizeof(CallPrint) + kInlineMax];
    Request* request;
  };
  const PrintIn* in(int peer) const;

  Op& op_;
  CallPrint print_;  // collective kNone: no call check
  bool started_ = false;
  bool deferred_ = false;
  bool watching_ = false;
  bool carries_ = false;
  std::optional<uint32_t> mismatchAtStart_;
  uint64_t sentMask_ = 0, askedMask_ = 0;
  std::array<std::pair<int, uint8_t>, 16> few_;  // the first peers met, in large groups
  size_t fewMet_ = 0;
  std::unordered_map<int, uint8_t> flags_;  // all of them, once more than few_ are met
  // One per peer asked: the first here (most ops ask one peer), the others in ins_.
  PrintIn firstIn_;
  bool askedOne_ = false;
  std::vector<std::unique_ptr<PrintIn>> ins_;
  std::unordered_map<int, PrintIn*> inByPeer_;  // all of them, by peer, in large groups
  const void* inlineData_ = nullptr;
  size_t inlineBytes_ = 0;
  alignas(8) char out_[sizeof(CallPrint) + kInlineMax];  // the print and its data, if it carries
  std::vector<Request*> requests_;
};

}  // namespace ddl
