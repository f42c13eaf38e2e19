#include "status.h"

namespace ddl {

const char* statusKindName(StatusKind kind) {
  switch (kind) {
    case StatusKind::kOk:
      return "ok";
    case StatusKind::kInvalidArgument:
      return "invalid argument";
    case StatusKind::kMismatch:
      return "mismatch";
    case StatusKind::kTruncated:
      return "truncated";
    case StatusKind::kTimeout:
      return "timeout";
    case StatusKind::kPeerLost:
      return "peer lost";
    case StatusKind::kPartitioned:
      return "partitioned";
    case StatusKind::kClosed:
      return "closed";
    case StatusKind::kCancelled:
      return "cancelled";
    case StatusKind::kOther:
      return "other";
  }
  return "unknown";
}

}  // namespace ddl
