// Launchers of ddl's CUDA kernels (kernels.cu): element-wise reductions for every dtype and
// reduce op of the CPU path, and the last step of AVG. Each enqueues on `stream` and returns the
// launch's status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../core/base/types.h"

namespace ddl::cuda {

// dst[i] = dst[i] (op) src[i], or src[i] (op) dst[i] (Operands); AVG accumulates as SUM.
cudaError_t launchReduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
                         Operands order, cudaStream_t stream);
// buf[i] /= divisor (integers truncate toward zero).
cudaError_t launchAverage(DataType type, void* buf, size_t count, size_t divisor,
                          cudaStream_t stream);

}  // namespace ddl::cuda
