// Type-erased buffer description shared by every layer of the core: element types and reduce
// ops (the error the core throws, Error, is status.h's).
#pragma once

#include <cstddef>
#include <cstdint>
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

// Which operand an element-wise reduction takes first. The result can depend on it (MAX of NaN
// and 1, or of -0.0 and +0.0): ranks that each compute the same element from each other's data
// take them in one order, the lower rank's first, so that they end with the same bits.
enum class Operands : uint8_t { kDstFirst, kSrcFirst };

size_t elementSize(DataType type);
const char* dataTypeName(DataType type);
const char* reduceOpName(ReduceOp op);
bool isFloatingPoint(DataType type);

// Empty string when `op` is defined on `type`; otherwise the reason it is not.
std::string checkReduceOp(DataType type, ReduceOp op);

}  // namespace ddl
