// Design note. One grid-stride kernel per (dtype, op): each thread moves 16 bytes at a time
// (uint4 loads and stores) when both buffers are 16-byte aligned, then a scalar tail. Half
// types are reduced in float and rounded back (to nearest even) after every operation, as on
// the CPU path (reduce/reduce.cc), so a result does not depend on where it was reduced. MIN and
// MAX use the CPU's comparisons (a NaN in `dst` stays, one in `src` is passed over); bool is
// SUM/MAX = OR, PRODUCT/MIN = AND.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "kernels.h"

namespace ddl::cuda {
namespace {

template <typename T>
struct Num {
  using V = T;
  __device__ static V in(T v) { return v; }
  template <typename U>
  __device__ static T out(U v) {
    return static_cast<T>(v);
  }
};
template <>
struct Num<__half> {
  using V = float;
  __device__ static float in(__half v) { return __half2float(v); }
  __device__ static __half out(float v) { return __float2half_rn(v); }
};
template <>
struct Num<__nv_bfloat16> {
  using V = float;
  __device__ static float in(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 out(float v) { return __float2bfloat16_rn(v); }
};

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return Num<T>::out(Num<T>::in(a) + Num<T>::in(b));
  }
};
struct Prod {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return Num<T>::out(Num<T>::in(a)*Num<T>::in(b));
  }
};
struct Min {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return Num<T>::in(b) < Num<T>::in(a) ? b : a;
  }
};
struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return Num<T>::in(a) < Num<T>::in(b) ? b : a;
  }
};
struct Band {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return static_cast<T>(a & b);
  }
};
struct Bor {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return static_cast<T>(a | b);
  }
};
struct Bxor {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return static_cast<T>(a ^ b);
  }
};

template <typename T, typename F>
__global__ void reduceKernel(T* __restrict__ dst, const T* __restrict__ src, size_t n, F f,
                             bool vectors) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  constexpr int kPerVector = 16 / sizeof(T);
  size_t head = 0;
  if (vectors) {
    const size_t packs = n / kPerVector;
    auto* d = reinterpret_cast<uint4*>(dst);
    const auto* s = reinterpret_cast<const uint4*>(src);
    for (size_t p = tid; p < packs; p += stride) {
      uint4 a = d[p];
      const uint4 b = s[p];
      T* av = reinterpret_cast<T*>(&a);
      const T* bv = reinterpret_cast<const T*>(&b);
#pragma unroll
      for (int k = 0; k < kPerVector; ++k) av[k] = f(av[k], bv[k]);
      d[p] = a;
    }
    head = packs * kPerVector;
  }
  for (size_t i = head + tid; i < n; i += stride) dst[i] = f(dst[i], src[i]);
}

template <typename T>
__global__ void averageKernel(T* buf, size_t n, size_t divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    if constexpr (std::is_integral_v<T>) {
      buf[i] = static_cast<T>(static_cast<long long>(buf[i]) / static_cast<long long>(divisor));
    } else {
      using V = typename Num<T>::V;
      buf[i] = Num<T>::out(Num<T>::in(buf[i]) / static_cast<V>(divisor));
    }
  }
}

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 2048;

int blocksFor(size_t work) {
  return static_cast<int>(std::clamp<size_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// f with its operands the other way round: src[i] (op) dst[i].
template <typename F>
struct SourceFirst {
  F f;
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return f(b, a);
  }
};

template <typename T, typename F>
cudaError_t run(F f, void* dst, const void* src, size_t n, Operands order, cudaStream_t stream) {
  const bool vectors =
      (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 == 0;
  const size_t work = vectors ? n / (16 / sizeof(T)) + 16 : n;
  if (order == Operands::kSrcFirst) {
    reduceKernel<T><<<blocksFor(work), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), n, SourceFirst<F>{f}, vectors);
  } else {
    reduceKernel<T><<<blocksFor(work), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), n, f, vectors);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t reduceAs(ReduceOp op, void* dst, const void* src, size_t n, Operands order,
                     cudaStream_t stream) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return run<T>(Sum{}, dst, src, n, order, stream);
    case ReduceOp::kProduct:
      return run<T>(Prod{}, dst, src, n, order, stream);
    case ReduceOp::kMin:
      return run<T>(Min{}, dst, src, n, order, stream);
    case ReduceOp::kMax:
      return run<T>(Max{}, dst, src, n, order, stream);
    default:
      break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case ReduceOp::kBand:
        return run<T>(Band{}, dst, src, n, order, stream);
      case ReduceOp::kBor:
        return run<T>(Bor{}, dst, src, n, order, stream);
      case ReduceOp::kBxor:
        return run<T>(Bxor{}, dst, src, n, order, stream);
      default:
        break;
    }
  }
  return cudaErrorInvalidValue;
}

// Bool as bytes that are 0 or 1: every op is a bitwise one.
cudaError_t reduceBool(ReduceOp op, void* dst, const void* src, size_t n, Operands order,
                       cudaStream_t stream) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return run<uint8_t>(Bor{}, dst, src, n, order, stream);
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return run<uint8_t>(Band{}, dst, src, n, order, stream);
    case ReduceOp::kBxor:
      return run<uint8_t>(Bxor{}, dst, src, n, order, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t averageAs(void* buf, size_t n, size_t divisor, cudaStream_t stream) {
  averageKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(static_cast<T*>(buf), n, divisor);
  return cudaGetLastError();
}

// Calls fn(T{}) with the element type T of `type` (bool as uint8_t).
template <typename Fn>
cudaError_t forType(DataType type, Fn&& fn) {
  switch (type) {
    case DataType::kFloat32:
      return fn(float{});
    case DataType::kFloat64:
      return fn(double{});
    case DataType::kFloat16:
      return fn(__half{});
    case DataType::kBFloat16:
      return fn(__nv_bfloat16{});
    case DataType::kInt8:
      return fn(int8_t{});
    case DataType::kUInt8:
    case DataType::kBool:
      return fn(uint8_t{});
    case DataType::kInt16:
      return fn(int16_t{});
    case DataType::kInt32:
      return fn(int32_t{});
    case DataType::kInt64:
      return fn(int64_t{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launchReduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
                         Operands order, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (type == DataType::kBool) return reduceBool(op, dst, src, count, order, stream);
  return forType(type, [&](auto element) {
    return reduceAs<decltype(element)>(op, dst, src, count, order, stream);
  });
}

cudaError_t launchAverage(DataType type, void* buf, size_t count, size_t divisor,
                          cudaStream_t stream) {
  if (count == 0 || divisor <= 1) return cudaSuccess;
  if (type == DataType::kBool) return cudaErrorInvalidValue;
  return forType(type, [&](auto element) {
    return averageAs<decltype(element)>(buf, count, divisor, stream);
  });
}

}  // namespace ddl::cuda
