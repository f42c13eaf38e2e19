// Design note. Half types are reduced in float and rounded back after every operation, which is
// what a sequence of binary operations on the narrow type means (and what Gloo does). bfloat16
// rounds to nearest even; NaN stays NaN. Bool follows torch: SUM/MAX are OR, PRODUCT/MIN are AND.
#include "reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace ddl {
namespace {

#define DDL_ALWAYS_INLINE inline __attribute__((always_inline))
// A build under ThreadSanitizer gets no clones: their resolvers run while the program is
// relocated, before the sanitizer's runtime is up.
#if defined(__SANITIZE_THREAD__)
#define DDL_CLONES
#else
#define DDL_CLONES __attribute__((target_clones("arch=haswell", "default")))
#endif

struct BF16 {
  uint16_t bits;
};

DDL_ALWAYS_INLINE float load(const BF16& v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
DDL_ALWAYS_INLINE BF16 storeBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u;
  bool isNan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return BF16{static_cast<uint16_t>(isNan ? nan : rounded)};
}

struct Sum {
  template <typename T>
  DDL_ALWAYS_INLINE T operator()(T a, T b) const {
    return a + b;
  }
};
struct Prod {
  template <typename T>
  DDL_ALWAYS_INLINE T operator()(T a, T b) const {
    return a * b;
  }
};
struct Min {
  template <typename T>
  DDL_ALWAYS_INLINE T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  DDL_ALWAYS_INLINE T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};
struct Band {
  template <typename T>
  DDL_ALWAYS_INLINE T operator()(T a, T b) const {
    return a & b;
  }
};
struct Bor {
  template <typename T>
  DDL_ALWAYS_INLINE T operator()(T a, T b) const {
    return a | b;
  }
};
struct Bxor {
  template <typename T>
  DDL_ALWAYS_INLINE T operator()(T a, T b) const {
    return a ^ b;
  }
};

template <typename T, typename Op>
DDL_ALWAYS_INLINE void loop(T* out, const T* a, const T* b, size_t n) {
  Op op;
  for (size_t i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
}
template <typename Op>
DDL_ALWAYS_INLINE void loopHalf(_Float16* out, const _Float16* a, const _Float16* b, size_t n) {
  Op op;
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<_Float16>(op(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}
template <typename Op>
DDL_ALWAYS_INLINE void loopBF16(BF16* out, const BF16* a, const BF16* b, size_t n) {
  Op op;
  for (size_t i = 0; i < n; ++i) out[i] = storeBF16(op(load(a[i]), load(b[i])));
}

// One out-of-line, cloned function per (type, op). `out` may alias `a` (the in-place case): the
// loops read element i before writing it, and GCC vectorises them behind its own overlap check.
#define DDL_KERNEL(NAME, T, OP, LOOP)                                                  \
  DDL_CLONES void NAME(void* out, const void* a, const void* b, size_t n) {            \
    LOOP(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n); \
  }
#define DDL_PLAIN(T, OP) loop<T, OP>
#define DDL_HALF(T, OP) loopHalf<OP>
#define DDL_BF16(T, OP) loopBF16<OP>

#define DDL_ARITH_KERNELS(TAG, T, LOOPT)         \
  DDL_KERNEL(TAG##Sum, T, Sum, LOOPT(T, Sum))    \
  DDL_KERNEL(TAG##Prod, T, Prod, LOOPT(T, Prod)) \
  DDL_KERNEL(TAG##Min, T, Min, LOOPT(T, Min))    \
  DDL_KERNEL(TAG##Max, T, Max, LOOPT(T, Max))
#define DDL_BIT_KERNELS(TAG, T)                      \
  DDL_KERNEL(TAG##Band, T, Band, DDL_PLAIN(T, Band)) \
  DDL_KERNEL(TAG##Bor, T, Bor, DDL_PLAIN(T, Bor))    \
  DDL_KERNEL(TAG##Bxor, T, Bxor, DDL_PLAIN(T, Bxor))

DDL_ARITH_KERNELS(f32, float, DDL_PLAIN)
DDL_ARITH_KERNELS(f64, double, DDL_PLAIN)
DDL_ARITH_KERNELS(f16, _Float16, DDL_HALF)
DDL_ARITH_KERNELS(bf16, BF16, DDL_BF16)
DDL_ARITH_KERNELS(i8, int8_t, DDL_PLAIN)
DDL_ARITH_KERNELS(u8, uint8_t, DDL_PLAIN)
DDL_ARITH_KERNELS(i16, int16_t, DDL_PLAIN)
DDL_ARITH_KERNELS(i32, int32_t, DDL_PLAIN)
DDL_ARITH_KERNELS(i64, int64_t, DDL_PLAIN)
DDL_BIT_KERNELS(i8, int8_t)
DDL_BIT_KERNELS(u8, uint8_t)
DDL_BIT_KERNELS(i16, int16_t)
DDL_BIT_KERNELS(i32, int32_t)
DDL_BIT_KERNELS(i64, int64_t)
// Bool is stored as one byte holding 0 or 1: OR and AND on bytes keep it so.
DDL_BIT_KERNELS(b, uint8_t)

using Kernel = void (*)(void*, const void*, const void*, size_t);

#define DDL_ARITH_CASE(TAG)  \
  switch (op) {              \
    case ReduceOp::kSum:     \
    case ReduceOp::kAvg:     \
      return TAG##Sum;       \
    case ReduceOp::kProduct: \
      return TAG##Prod;      \
    case ReduceOp::kMin:     \
      return TAG##Min;       \
    case ReduceOp::kMax:     \
      return TAG##Max;       \
    default:                 \
      return nullptr;        \
  }
#define DDL_INT_CASE(TAG) \
  switch (op) {           \
    case ReduceOp::kBand: \
      return TAG##Band;   \
    case ReduceOp::kBor:  \
      return TAG##Bor;    \
    case ReduceOp::kBxor: \
      return TAG##Bxor;   \
    default:              \
      DDL_ARITH_CASE(TAG) \
  }

Kernel pick(DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32:
      DDL_ARITH_CASE(f32)
    case DataType::kFloat64:
      DDL_ARITH_CASE(f64)
    case DataType::kFloat16:
      DDL_ARITH_CASE(f16)
    case DataType::kBFloat16:
      DDL_ARITH_CASE(bf16)
    case DataType::kInt8:
      DDL_INT_CASE(i8)
    case DataType::kUInt8:
      DDL_INT_CASE(u8)
    case DataType::kInt16:
      DDL_INT_CASE(i16)
    case DataType::kInt32:
      DDL_INT_CASE(i32)
    case DataType::kInt64:
      DDL_INT_CASE(i64)
    case DataType::kBool:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMax:
        case ReduceOp::kBor:
          return bBor;
        case ReduceOp::kProduct:
        case ReduceOp::kMin:
        case ReduceOp::kBand:
          return bBand;
        case ReduceOp::kBxor:
          return bBxor;
        default:
          return nullptr;
      }
  }
  return nullptr;
}

template <typename T>
void divideInt(void* buf, size_t n, size_t divisor) {
  T* p = static_cast<T*>(buf);
  T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
}

}  // namespace

void reduceTo(DataType type, ReduceOp op, void* out, const void* a, const void* b, size_t count) {
  Kernel kernel = pick(type, op);
  if (kernel == nullptr) {
    throw Error(std::string("ddl: no reduction kernel for ") + reduceOpName(op) + " on " +
                dataTypeName(type));
  }
  if (count > 0) kernel(out, a, b, count);
}

void reduceInto(DataType type, ReduceOp op, void* dst, const void* src, size_t count) {
  reduceTo(type, op, dst, dst, src, count);
}

void finishAverage(DataType type, void* buf, size_t count, size_t divisor) {
  if (divisor <= 1) return;
  switch (type) {
    case DataType::kFloat32: {
      float* p = static_cast<float*>(buf);
      float d = static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) p[i] /= d;
      return;
    }
    case DataType::kFloat64: {
      double* p = static_cast<double*>(buf);
      double d = static_cast<double>(divisor);
      for (size_t i = 0; i < count; ++i) p[i] /= d;
      return;
    }
    case DataType::kFloat16: {
      _Float16* p = static_cast<_Float16*>(buf);
      float d = static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) p[i] = static_cast<_Float16>(static_cast<float>(p[i]) / d);
      return;
    }
    case DataType::kBFloat16: {
      BF16* p = static_cast<BF16*>(buf);
      float d = static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) p[i] = storeBF16(load(p[i]) / d);
      return;
    }
    case DataType::kInt8:
      return divideInt<int8_t>(buf, count, divisor);
    case DataType::kUInt8:
      return divideInt<uint8_t>(buf, count, divisor);
    case DataType::kInt16:
      return divideInt<int16_t>(buf, count, divisor);
    case DataType::kInt32:
      return divideInt<int32_t>(buf, count, divisor);
    case DataType::kInt64:
      return divideInt<int64_t>(buf, count, divisor);
    case DataType::kBool:
      throw Error("ddl: AVG is not defined on bool");
  }
}

}  // namespace ddl
