"""Sparse COO all_reduce (SUM, as gloo offers it) against gloo on the same inputs, its errors,
and DDP over an embedding with sparse gradients, at world sizes 1 to 4."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddl_testing import WORLD_SIZES, run_ranks


def _sparse_input(rank, shape, sparse_dim, nnz, dtype):
    g = torch.Generator().manual_seed(31 * rank + nnz + sparse_dim)
    index = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g)
                         for d in range(sparse_dim)]) if nnz else torch.empty(
                             sparse_dim, 0, dtype=torch.long)
    values = torch.randint(-9, 10, (nnz, *shape[sparse_dim:]), generator=g).to(dtype)
    return torch.sparse_coo_tensor(index, values, shape)


CASES = [
    # shape, sparse_dim, nnz on rank r is nnz + r (duplicates included, uncoalesced input)
    ((7,), 1, 0),
    ((7,), 1, 1),
    ((1000,), 1, 97),
    ((13, 5), 2, 11),
    ((50, 3, 2), 1, 23),  # hybrid: dense trailing dimensions
]
# Complex is left out: torch.distributed hands the backend view_as_real(tensor), which for a
# sparse tensor is a copy, so neither gloo nor ddl can update the caller's tensor.
TYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16]


def _against_gloo(rank, size):
    gloo = dist.new_group(backend="gloo")
    for shape, sparse_dim, nnz in CASES:
        for dtype in TYPES:
            x = _sparse_input(rank, shape, sparse_dim, nnz + rank, dtype)
            got, want = x.clone(), x.clone()
            work = dist.all_reduce(got, async_op=True)
            dist.all_reduce(want, group=gloo)
            work.wait()
            what = f"{shape} sparse_dim={sparse_dim} nnz={nnz} {dtype}"
            assert got.is_sparse and got.is_coalesced(), what
            assert torch.equal(got._indices(), want.coalesce()._indices()), what
            assert torch.equal(got._values(), want.coalesce()._values()), what
            assert work.result()[0] is not None
    # Errors: named, before anything moves, on every rank alike.
    x = _sparse_input(rank, (5,), 1, 2, torch.float32)
    with pytest.raises(ValueError, match="ReduceOp.SUM only"):
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    if size > 1:
        y = _sparse_input(rank, (5 + rank,), 1, 2, torch.float32)
        with pytest.raises(RuntimeError, match=r"sparse tensor has sizes \[\d\]"):
            dist.all_reduce(y)
        z = _sparse_input(rank, (5,), 1, 2, torch.float32 if rank == 0 else torch.float64)
        with pytest.raises(RuntimeError, match="sparse tensor has dtype"):
            dist.all_reduce(z)
    # The group is still usable after the failures.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(size)))


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_sparse_all_reduce_matches_gloo(size):
    run_ranks(_against_gloo, size)


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(100, 8, sparse=True)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.embedding(ids).mean(1))


def _train_sparse(group, rank):
    torch.manual_seed(0)
    net = Bag()
    model = DDP(net, process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(6):
        ids = torch.randint(0, 100, (16, 4), generator=gen)
        y = torch.randint(0, 3, (16,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(ids), y).backward()
        opt.step()
    return model, [p.detach().clone() for p in net.parameters()]


def _ddp_sparse(rank, size):
    gloo = dist.new_group(backend="gloo")
    model, got = _train_sparse(dist.group.WORLD, rank)
    _, want = _train_sparse(gloo, rank)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-6), (g - w).abs().max()
    # DDP's logging data names the backend as for gloo, not torch's generic 'custom'.
    assert model._get_ddp_logging_data()["backend_name"] == "ddl"


@pytest.mark.parametrize("size", [2, 3])
def test_ddp_sparse_embedding_matches_gloo(size):
    run_ranks(_ddp_sparse, size)
