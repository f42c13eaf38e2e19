// Element-wise reduction kernels on type-erased buffers (CPU). Each (dtype, op) pair is a plain
// loop that the compiler vectorises; an AVX2/F16C clone is picked at run time where the CPU has it.
#pragma once

#include <cstddef>

#include "../base/types.h"

namespace ddl {

// dst[i] = dst[i] (op) src[i] for i in [0, count). AVG accumulates as SUM; see finishAverage.
void reduceInto(DataType type, ReduceOp op, void* dst, const void* src, size_t count);

// out[i] = a[i] (op) b[i]; out may alias a or b.
void reduceTo(DataType type, ReduceOp op, void* out, const void* a, const void* b, size_t count);

// The last step of AVG: buf[i] /= divisor (integer types divide with truncation toward zero).
void finishAverage(DataType type, void* buf, size_t count, size_t divisor);

}  // namespace ddl
