// Status: how anything in the core ends, from a transport request through an op to the Work a
// caller holds. One kind (what went wrong), the ranks it concerns (whom a timeout still waited
// for, which peers are gone, who called something else), and the words a user reads. The torch
// glue picks torch's exception type from the kind alone (csrc/torch/errors.hpp); nothing matches
// text to learn what happened.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddl {

enum class StatusKind : uint8_t {
  kOk = 0,
  kInvalidArgument,  // a call's arguments were refused (here, or by another rank): nothing moved
  kMismatch,         // the ranks called different things (or a peer's call check or data did
                     // not fit this rank's call: collective, size, dtype, root, group)
  kTruncated,        // transport: a message longer than the receive posted for it
  kTimeout,          // a deadline passed; ranks: the peers still awaited
  kPeerLost,         // a peer is gone (its process, its host, the link to it); ranks: which
  kPartitioned,      // this side of a partition holds no quorum of the group; ranks: the others
  kClosed,           // the group was closed (abort, shutdown, reconfigure) or the engine stopped
  kCancelled,        // transport: a request taken back before it completed
  kOther,            // any other failure (of the transport, the system, a malformed message)
};
inline constexpr int kStatusKinds = static_cast<int>(StatusKind::kOther) + 1;

// "ok", "invalid argument", "mismatch", ... (for messages and the Python API).
const char* statusKindName(StatusKind kind);

struct Status {
  StatusKind kind = StatusKind::kOk;
  std::vector<int> ranks;  // group ranks the failure concerns (none where it names nobody)
  std::string detail;      // the user-facing words, complete ("ddl: allreduce on group 3 ...")

  Status() = default;
  Status(StatusKind k, std::string words, std::vector<int> who = {})
      : kind(k), ranks(std::move(who)), detail(std::move(words)) {}
  bool ok() const { return kind == StatusKind::kOk; }
  // The same failure in other words (a prefix naming where it happened, say).
  Status withDetail(std::string words) const { return Status(kind, std::move(words), ranks); }
};

// Every error the core reports to a user: bad input, timeouts, transport failures. It carries
// the Status it stands for (the kind says which; kOther where the thrower named none).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, StatusKind kind = StatusKind::kOther)
      : std::runtime_error(message), kind_(kind) {}
  explicit Error(const Status& status)
      : std::runtime_error(status.detail), kind_(status.kind), ranks_(status.ranks) {}
  StatusKind kind() const { return kind_; }
  Status status() const { return Status(kind_, what(), ranks_); }

 private:
  StatusKind kind_;
  std::vector<int> ranks_;
};

}  // namespace ddl
