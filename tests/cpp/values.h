// Deterministic per-rank inputs and their exact expected reductions, for every dtype.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../csrc/core/base/types.h"

namespace ddl::test {

inline const std::vector<DataType> kAllTypes = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt8,    DataType::kUInt8,   DataType::kInt16,   DataType::kInt32,
    DataType::kInt64,   DataType::kBool};
inline const std::vector<ReduceOp> kAllOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct,
                                              ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kBand,
                                              ReduceOp::kBor, ReduceOp::kBxor};

inline void storeValue(DataType t, void* p, size_t i, double v) {
  switch (t) {
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    case DataType::kFloat16:
      static_cast<_Float16*>(p)[i] = static_cast<_Float16>(v);
      break;
    case DataType::kBFloat16: {
      float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u >> 16);
      break;
    }
    case DataType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kUInt8:
    case DataType::kBool:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt16:
      static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v);
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
  }
}

inline double loadValue(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DataType::kFloat16:
      return static_cast<double>(static_cast<const _Float16*>(p)[i]);
    case DataType::kBFloat16: {
      uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DataType::kInt8:
      return static_cast<const int8_t*>(p)[i];
    case DataType::kUInt8:
    case DataType::kBool:
      return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt16:
      return static_cast<const int16_t*>(p)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

// Small integers, exact in every dtype, chosen so that no reduction over 12 ranks overflows.
inline int64_t inputValue(DataType t, ReduceOp op, int rank, size_t i) {
  if (t == DataType::kBool) return (rank + i) % 3 == 0;
  bool isUnsigned = t == DataType::kUInt8;
  if (op == ReduceOp::kProduct) {
    if ((rank + i) % 5 == 0) return 2;
    return (!isUnsigned && (rank + i) % 7 == 0) ? -1 : 1;
  }
  int64_t v = static_cast<int64_t>((rank * 7 + i * 3) % 11) - 5;
  return isUnsigned ? v + 5 : v;
}

inline double expectedValue(DataType t, ReduceOp op, int size, size_t i) {
  int64_t acc = inputValue(t, op, 0, i);
  for (int r = 1; r < size; ++r) {
    int64_t v = inputValue(t, op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = t == DataType::kBool ? (acc | v) : acc + v;
        break;
      case ReduceOp::kProduct:
        acc = t == DataType::kBool ? (acc & v) : acc * v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kBand:
        acc &= v;
        break;
      case ReduceOp::kBor:
        acc |= v;
        break;
      case ReduceOp::kBxor:
        acc ^= v;
        break;
    }
  }
  if (op != ReduceOp::kAvg) return static_cast<double>(acc);
  if (isFloatingPoint(t)) return static_cast<double>(acc) / size;
  return static_cast<double>(acc / size);  // truncation toward zero, as C++ and torch do
}

inline double tolerance(DataType t, ReduceOp op, double expected) {
  if (op != ReduceOp::kAvg || !isFloatingPoint(t)) return 0;
  double rel = t == DataType::kFloat16 ? 1e-3 : t == DataType::kBFloat16 ? 1e-2 : 1e-6;
  return rel * std::max(1.0, std::fabs(expected));
}

}  // namespace ddl::test
