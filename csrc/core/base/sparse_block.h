// One rank's sparse COO tensor as it travels in a sparse allreduce (the torch glue packs it,
// torch/sparse.cpp): a header of int64s (sparse_dim, dense_dim, dtype, ndim, the ndim sizes,
// nnz), then nnz indices per sparse dimension (int64), then the values. readSparseBlock checks
// a block from a peer before anything is sized from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddl {

struct SparseBlock {
  int64_t sparseDim = 0, denseDim = 0, dtype = 0;
  std::vector<int64_t> sizes;
  int64_t nnz = 0;
  size_t headerBytes = 0, indexBytes = 0, valueBytes = 0;
};

// The block's layout, or false with `why` set: the block is cut short or too long, its header
// says something impossible (dimensions that do not add up, a negative size or nnz, a dtype
// `valueBytes` does not know: 0), or its lengths overflow. `valueBytes(dtype)`: the size of one
// value element of the block's own dtype (a dtype that differs from this rank's is the caller's
// to name: the block is read whole first).
bool readSparseBlock(const char* block, size_t length,
                     const std::function<size_t(int64_t dtype)>& valueBytes, SparseBlock* out,
                     std::string* why);

}  // namespace ddl
