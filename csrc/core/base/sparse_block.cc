#include "sparse_block.h"

#include <cstring>
#include <limits>

namespace ddl {
namespace {

constexpr int64_t kMaxDims = 64;

// a * b, false when it overflows size_t.
bool times(size_t a, size_t b, size_t* out) {
  if (b != 0 && a > std::numeric_limits<size_t>::max() / b) return false;
  *out = a * b;
  return true;
}

}  // namespace

bool readSparseBlock(const char* block, size_t length,
                     const std::function<size_t(int64_t dtype)>& valueBytes, SparseBlock* out,
                     std::string* why) {
  int64_t fixed[4];  // sparse_dim, dense_dim, dtype, ndim
  if (length < sizeof(fixed)) {
    *why = "a block of " + std::to_string(length) + " bytes, shorter than its header";
    return false;
  }
  std::memcpy(fixed, block, sizeof(fixed));
  const int64_t ndim = fixed[3];
  // Each bounded before they are added (a sum of two from the wire may overflow: found by
  // fuzzing).
  if (ndim < 0 || ndim > kMaxDims || fixed[0] < 0 || fixed[0] > kMaxDims || fixed[1] < 0 ||
      fixed[1] > kMaxDims || fixed[0] + fixed[1] != ndim) {
    *why = "a header of " + std::to_string(fixed[0]) + " sparse and " + std::to_string(fixed[1]) +
           " dense dimensions of " + std::to_string(ndim);
    return false;
  }
  out->headerBytes = static_cast<size_t>(5 + ndim) * sizeof(int64_t);
  if (length < out->headerBytes) {
    *why = "a block of " + std::to_string(length) + " bytes, shorter than its header";
    return false;
  }
  std::vector<int64_t> header(static_cast<size_t>(5 + ndim));
  std::memcpy(header.data(), block, out->headerBytes);
  out->sparseDim = fixed[0];
  out->denseDim = fixed[1];
  out->dtype = fixed[2];
  out->sizes.assign(header.begin() + 4, header.end() - 1);
  out->nnz = header.back();
  // One entry: an index per sparse dimension, and a value of the dense dimensions' shape.
  size_t values = 1;
  for (size_t d = 0; d < out->sizes.size(); ++d) {
    if (out->sizes[d] < 0) {
      *why = "a negative size " + std::to_string(out->sizes[d]);
      return false;
    }
    if (static_cast<int64_t>(d) >= out->sparseDim &&
        !times(values, static_cast<size_t>(out->sizes[d]), &values)) {
      *why = "dense sizes whose product overflows";
      return false;
    }
  }
  const size_t elementBytes = valueBytes(out->dtype);
  if (elementBytes == 0) {
    *why = "a dtype numbered " + std::to_string(out->dtype) + " that this rank does not know";
    return false;
  }
  size_t index = 0, value = 0, entry = 0;
  if (out->nnz < 0 || !times(static_cast<size_t>(out->sparseDim), sizeof(int64_t), &index) ||
      !times(values, elementBytes, &value) ||
      !times(static_cast<size_t>(out->nnz), index, &out->indexBytes) ||
      !times(static_cast<size_t>(out->nnz), value, &out->valueBytes) ||
      (entry = out->indexBytes + out->valueBytes) < out->indexBytes ||
      length - out->headerBytes != entry) {
    *why = "nnz " + std::to_string(out->nnz) + " that does not match its " +
           std::to_string(length) + " bytes";
    return false;
  }
  return true;
}

}  // namespace ddl
