#include "sparse.hpp"

#include <c10/util/Exception.h>

#include <cstring>
#include <string>
#include <vector>

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
    auto shortBlock = [&] {
      torch_errors::raise(
          Status(StatusKind::kMismatch,
                 "ddl: all_reduce: rank " + std::to_string(r) + " sent a malformed block"));
    };
    int64_t fixed[4];  // sparse_dim, dense_dim, dtype, ndim
    if (length < sizeof(fixed)) shortBlock();
    std::memcpy(fixed, block, sizeof(fixed));
    if (fixed[3] < 0 || fixed[3] > 64 || length < (5 + fixed[3]) * sizeof(int64_t)) shortBlock();
    std::vector<int64_t> header(5 + fixed[3]);
    std::memcpy(header.data(), block, header.size() * sizeof(int64_t));
    std::vector<int64_t> sizes(header.begin() + 4, header.end() - 1);
    if (fixed[0] != like.sparse_dim() || fixed[1] != like.dense_dim() ||
        c10::IntArrayRef(sizes) != like.sizes()) {
      torch_errors::raise(Status(StatusKind::kMismatch,
                                 "ddl: all_reduce: rank " + std::to_string(r) +
                                     "'s sparse tensor has sizes " + shapeText(sizes) +
                                     " with sparse_dim " + std::to_string(fixed[0]) +
                                     "; this rank's has sizes " + shapeText(like.sizes()) +
                                     " with sparse_dim " + std::to_string(like.sparse_dim())));
    }
    if (fixed[2] != static_cast<int64_t>(like.scalar_type())) {
      torch_errors::raise(Status(StatusKind::kMismatch,
                                 "ddl: all_reduce: rank " + std::to_string(r) +
                                     "'s sparse tensor has dtype " +
                                     c10::toString(static_cast<at::ScalarType>(fixed[2])) +
                                     "; this rank's has " + c10::toString(like.scalar_type())));
    }
    const int64_t nnz = header.back();
    if (nnz < 0) shortBlock();
    std::vector<int64_t> valueShape{nnz};
    for (int64_t d = like.sparse_dim(); d < like.dim(); ++d) valueShape.push_back(like.size(d));
    at::Tensor rankIndices = at::empty({like.sparse_dim(), nnz}, at::kLong);
    at::Tensor rankValues = at::empty(valueShape, like._values().options());
    const size_t indexBytes = rankIndices.numel() * sizeof(int64_t);
    const size_t valueBytes = rankValues.numel() * rankValues.element_size();
    const size_t headerBytes = header.size() * sizeof(int64_t);
    if (length != headerBytes + indexBytes + valueBytes) shortBlock();
    if (indexBytes > 0) std::memcpy(rankIndices.data_ptr(), block + headerBytes, indexBytes);
    if (valueBytes > 0) {
      std::memcpy(rankValues.data_ptr(), block + headerBytes + indexBytes, valueBytes);
    }
    indices.push_back(rankIndices);
    values.push_back(rankValues);
  }
  return at::sparse_coo_tensor(at::cat(indices, 1), at::cat(values, 0), like.sizes(),
                               like.options())
      .coalesce();
}

}  // namespace ddl
