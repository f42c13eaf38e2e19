// Type-erased buffer description shared by every layer of the core: element types, reduce ops,
// and the error type that carries a user-facing message up to the torch glue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "status.h"

namespace ddl {

enum class DataType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
};

enum class ReduceOp : uint8_t { kSum, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor };

size_t elementSize(DataType type);
const char* dataTypeName(DataType type);
const char* reduceOpName(ReduceOp op);
bool isFloatingPoint(DataType type);

// Empty string when `op` is defined on `type`; otherwise the reason it is not.
std::string checkReduceOp(DataType type, ReduceOp op);

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
