// A rank's sparse block in a sparse allreduce (base/sparse_block.h).
#include "../../csrc/core/base/sparse_block.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(sparse) {
  using namespace ddl;
  if (size == 0) return 0;
  // Element sizes of 1 - 8 bytes for dtypes 0 - 15 (as torch's first ones are), none beyond.
  const size_t shift = data[0] % 4;
  auto valueBytes = [shift](int64_t dtype) -> size_t {
    return dtype >= 0 && dtype < 16 ? size_t{1} << ((dtype + shift) % 4) : 0;
  };
  SparseBlock block;
  std::string why;
  if (!readSparseBlock(reinterpret_cast<const char*>(data + 1), size - 1, valueBytes, &block,
                       &why)) {
    DDL_FUZZ_CHECK(!why.empty());
    return 0;
  }
  // Everything it says lies in the block.
  DDL_FUZZ_CHECK(block.headerBytes + block.indexBytes + block.valueBytes == size - 1);
  DDL_FUZZ_CHECK(block.nnz >= 0 &&
                 block.sparseDim + block.denseDim == static_cast<int64_t>(block.sizes.size()));
  return 0;
}
