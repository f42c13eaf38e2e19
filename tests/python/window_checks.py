"""One-sided windows checked against send/recv (test_window.py on one host; window_worker.py on
emulated hosts): every rank puts its block into every peer's window, asynchronously, then
signals; once it has every peer's signal its window must hold exactly what a send/recv of the
same blocks delivers."""

import torch
import torch.distributed as dist

import torch_ddl
from ddl_testing import glibc_block

# What a window's tensor is made of: shared memory (torch_ddl.empty_shared), a small tensor in
# the heap (only the transport's puts reach it), or a tensor whose storage glibc mapped for it
# (moved into shared memory as it registers).
MEMORY = {
    "shared": lambda n, dtype: torch_ddl.empty_shared(n, dtype=dtype),
    "plain": lambda n, dtype: torch.empty(n, dtype=dtype),
    "block": glibc_block,
}

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8]


def block_of(rank, n, dtype):
    if dtype == torch.uint8:
        return ((torch.arange(n) * 7 + rank * 31) % 251).to(dtype)
    return (torch.arange(n, dtype=torch.float64) * 0.25 + rank * 1000 + 0.5).to(dtype)


def window_round(rank, world, dtype, n, memory, group=None):
    """One round; returns how each peer was reached ({peer: route})."""
    peers = [p for p in range(world) if p != rank]
    total = n * world
    t = MEMORY[memory](total, dtype)
    t.fill_(3)
    mine = block_of(rank, n, dtype)
    t[rank * n:(rank + 1) * n] = mine
    w = torch_ddl.new_window(t, group)
    routes = {p: w.route(p) for p in peers}
    # Asynchronous puts, each followed at once by its signal: the signal must still be seen
    # after the put.
    works = []
    for p in peers:
        works.append(w.put(mine, p, rank * n, True))
        works.append(w.signal(p, True))
    for p in peers:
        w.wait_signal(p, False)
    for work in works:
        work.wait()
    # The reference: the same blocks through send/recv.
    reference = torch.full((total,), 3, dtype=dtype)
    reference[rank * n:(rank + 1) * n] = mine
    ops = []
    for p in peers:
        ops.append(dist.P2POp(dist.isend, mine, p, group))
        ops.append(dist.P2POp(dist.irecv, reference[p * n:(p + 1) * n], p, group))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    assert torch.equal(t, reference), (
        f"rank {rank}: window {dtype} n={n} {memory} routes={routes}: "
        f"{(t != reference).nonzero()[:5].flatten().tolist()} differ")
    if memory != "plain":
        for p in range(world):
            if routes.get(p, "self") in ("mapped", "self"):
                view = w.map_remote_tensor(p)
                assert view.shape == t.shape and view.dtype == dtype
    w.tensor_deregister()
    return routes


def every_round(rank, world, sizes, dtypes=DTYPES, memories=("shared", "plain"), group=None):
    """window_round over dtypes, sizes and kinds of memory; the routes seen, by kind."""
    seen = {}
    for memory in memories:
        for dtype in dtypes:
            for n in sizes:
                routes = window_round(rank, world, dtype, n, memory, group)
                if n > 0:
                    seen.setdefault(memory, set()).update(routes.values())
    return seen
