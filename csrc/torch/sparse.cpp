#include "sparse.hpp"

#include <c10/util/Exception.h>

#include <cstring>
#include <string>
#include <vector>

#include "../core/base/sparse_block.h"
#include "errors.hpp"

namespace ddl {
namespace {

// "[2, 3]": a shape for a message. (Not c10::str: its ostream path for an ArrayRef crashed the
// sparse tests' error cases against torch 2.11.)
std::string shapeText(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + "]";
}

}  // namespace

at::Tensor packSparse(const at::Tensor& sparse) {
  at::Tensor indices = sparse._indices().contiguous();
  at::Tensor values = sparse._values().contiguous();
  std::vector<int64_t> header{sparse.sparse_dim(), sparse.dense_dim(),
                              static_cast<int64_t>(sparse.scalar_type()), sparse.dim()};
  for (int64_t size : sparse.sizes()) header.push_back(size);
  header.push_back(sparse._nnz());
  auto bytes = [](const at::Tensor& t) {
    return t.numel() * static_cast<int64_t>(t.element_size());
  };
  const int64_t headerBytes = static_cast<int64_t>(header.size() * sizeof(int64_t));
  at::Tensor packed = at::empty({headerBytes + bytes(indices) + bytes(values)}, at::kByte);
  auto* out = static_cast<char*>(packed.data_ptr());
  std::memcpy(out, header.data(), headerBytes);
  if (bytes(indices) > 0) std::memcpy(out + headerBytes, indices.data_ptr(), bytes(indices));
  if (bytes(values) > 0) {
    std::memcpy(out + headerBytes + bytes(indices), values.data_ptr(), bytes(values));
  }
  return packed;
}

at::Tensor sumPackedSparse(const VaryingBlocks& blocks, const at::Tensor& like) {
  const int ranks = static_cast<int>(blocks.offsets.size()) - 1;
  std::vector<at::Tensor> indices, values;
  for (int r = 0; r < ranks; ++r) {
    const char* block = blocks.data.data() + blocks.offsets[r];
    const size_t length = blocks.offsets[r + 1] - blocks.offsets[r];
    SparseBlock got;
    std::string why;
    auto valueBytes = [](int64_t dtype) -> size_t {
      if (dtype < 0 || dtype >= static_cast<int64_t>(at::ScalarType::NumOptions)) return 0;
      const auto type = static_cast<at::ScalarType>(dtype);
      return at::isQIntType(type) || type == at::ScalarType::Undefined ? 0 : c10::elementSize(type);
    };
    if (!readSparseBlock(block, length, valueBytes, &got, &why)) {
      torch_errors::raise(
          Status(StatusKind::kMismatch,
                 "ddl: all_reduce: rank " + std::to_string(r) + " sent a malformed block: " + why));
    }
    if (got.sparseDim != like.sparse_dim() || got.denseDim != like.dense_dim() ||
        c10::IntArrayRef(got.sizes) != like.sizes()) {
      torch_errors::raise(Status(StatusKind::kMismatch,
                                 "ddl: all_reduce: rank " + std::to_string(r) +
                                     "'s sparse tensor has sizes " + shapeText(got.sizes) +
                                     " with sparse_dim " + std::to_string(got.sparseDim) +
                                     "; this rank's has sizes " + shapeText(like.sizes()) +
                                     " with sparse_dim " + std::to_string(like.sparse_dim())));
    }
    if (got.dtype != static_cast<int64_t>(like.scalar_type())) {
      const bool known =
          got.dtype >= 0 && got.dtype < static_cast<int64_t>(at::ScalarType::NumOptions);
      torch_errors::raise(Status(StatusKind::kMismatch,
                                 "ddl: all_reduce: rank " + std::to_string(r) +
                                     "'s sparse tensor has dtype " +
                                     (known ? c10::toString(static_cast<at::ScalarType>(got.dtype))
                                            : "number " + std::to_string(got.dtype)) +
                                     "; this rank's has " + c10::toString(like.scalar_type())));
    }
    // Sized only now that the block's length says it holds them.
    std::vector<int64_t> valueShape{got.nnz};
    for (int64_t d = like.sparse_dim(); d < like.dim(); ++d) valueShape.push_back(like.size(d));
    at::Tensor rankIndices = at::empty({like.sparse_dim(), got.nnz}, at::kLong);
    at::Tensor rankValues = at::empty(valueShape, like._values().options());
    if (got.indexBytes > 0) {
      std::memcpy(rankIndices.data_ptr(), block + got.headerBytes, got.indexBytes);
    }
    if (got.valueBytes > 0) {
      std::memcpy(rankValues.data_ptr(), block + got.headerBytes + got.indexBytes, got.valueBytes);
    }
    // Indices out of the tensor's sizes would be written out of bounds by a later to_dense().
    if (got.nnz > 0) {
      const at::Tensor lowest = std::get<0>(rankIndices.min(1));
      const at::Tensor highest = std::get<0>(rankIndices.max(1));
      for (int64_t d = 0; d < like.sparse_dim(); ++d) {
        if (lowest[d].item<int64_t>() < 0 || highest[d].item<int64_t>() >= like.size(d)) {
          torch_errors::raise(Status(StatusKind::kMismatch,
                                     "ddl: all_reduce: rank " + std::to_string(r) +
                                         " sent indices outside sizes " + shapeText(like.sizes()) +
                                         " in dimension " + std::to_string(d)));
        }
      }
    }
    indices.push_back(rankIndices);
    values.push_back(rankValues);
  }
  return at::sparse_coo_tensor(at::cat(indices, 1), at::cat(values, 0), like.sizes(),
                               like.options())
      .coalesce();
}

}  // namespace ddl
