// Call prints: what one rank called, as the next rank checks it. Every collective sends a print
// of the call (CallPrint: the collective, its sequence number, dtype, element count, root and
// reduce op) to the next rank of the group and checks the one from the previous rank against
// its own; the op completes only once that print has arrived and agreed. If any two ranks
// disagree, two neighbours do, so at least one rank finds it: it fails the op naming both calls
// (and its group tells the others: group/notices.h). The print is a message of its own, sent as
// the op starts alongside the algorithm's first messages, so the check is the same on every path
// (shared memory or messages, one host or many) and costs no extra round trip.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "../base/types.h"

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

// A collective made for another call: its print and its name are that call's.
struct CallAs {
  Collective collective;
  const char* name;
};

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
  uint8_t reserved = 0;
  int32_t root = -1;
  uint64_t count = 0;  // elements (per rank where each rank has a block)

  bool operator==(const CallPrint& other) const;
  // e.g. "allreduce(sum, 100 x float32)", "broadcast(4 x int64 from rank 1)".
  std::string describe() const;
};
static_assert(sizeof(CallPrint) == 24);

CallPrint callPrint(Collective collective, size_t count = 0,
                    std::optional<DataType> type = std::nullopt,
                    std::optional<ReduceOp> reduce = std::nullopt, int root = -1);

}  // namespace ddl
