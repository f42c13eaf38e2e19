// Sparse COO all_reduce (SUM), as gloo offers it: each rank packs its coalesced tensor into one
// byte block, the blocks (of different sizes) are gathered around the ring, and every rank sums
// and coalesces them.
#pragma once

#include <ATen/ATen.h>

#include "../core/group/communicator.h"

namespace ddl {

// A sparse COO tensor as one byte block: [sparse_dim, dense_dim, dtype, ndim, sizes..., nnz] as
// int64, then the indices (sparse_dim x nnz, int64), then the values (nnz x dense shape).
at::Tensor packSparse(const at::Tensor& sparse);
// The sum of every rank's block of `blocks` (as packSparse wrote them), coalesced; a block that
// does not describe a tensor of `like`'s shape, sparse/dense split and dtype is an error naming
// its rank.
at::Tensor sumPackedSparse(const VaryingBlocks& blocks, const at::Tensor& like);

}  // namespace ddl
