"""Adoption of ordinary tensors into shared memory is safe: it loses no write another thread
makes to the rest of a storage, and it needs a bounded amount of extra memory."""

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

from ddl_testing import MemoryCgroup, assert_same, glibc_block, run_ranks

CHUNK = 1024  # float32 elements: 4 KiB


def _allreduce_view_while_writing(rank, size):
    gloo = dist.new_group(backend="gloo")
    storage = glibc_block(1 << 24)  # 64 MiB, a block of its own: what adoption moves
    storage.zero_()
    half = storage.numel() // 2
    view, rest = storage[:half], storage[half:]
    chunks = half // CHUNK

    def write():
        # Chunk i of the second half gets i + 1, once (a lost write stays visible), 4 KiB at a
        # time over about half a second: across the first allreduces of the view.
        for i in range(chunks):
            rest[i * CHUNK:(i + 1) * CHUNK] = float(i + 1)
            if i % 16 == 15:
                time.sleep(0.001)

    writer = threading.Thread(target=write)
    for step in range(4):  # the first allreduces of this storage: when adoption would happen
        view.fill_(float(rank + 1 + step))
        want = view.clone()
        if step == 1:
            writer.start()
        dist.all_reduce(view)
        dist.all_reduce(want, group=gloo)
        assert_same(view, want, f"allreduced view, round {step}")
    writer.join()
    got = rest.view(chunks, CHUNK)
    want = torch.arange(1, chunks + 1, dtype=torch.float32)[:, None]
    lost = int((got != want).any(dim=1).sum())
    assert lost == 0, f"rank {rank}: {lost} of {chunks} chunks written while allreducing were lost"


@pytest.mark.parametrize("size", [2, 3])
def test_writes_to_the_rest_of_a_storage_survive_allreduces_of_a_view(size, monkeypatch):
    monkeypatch.setenv("TORCH_DDL_SHARE_TENSORS", "1")
    run_ranks(_allreduce_view_while_writing, size)


TENSOR_BYTES = 512 << 20
# Each rank holds its tensor once, the move at most one piece (64 MiB) twice, and the rings'
# windows, a few MiB. A move of the whole block at once would need another 512 MiB per rank.
LIMIT = 2 * (TENSOR_BYTES + (160 << 20))


def _allreduce_large_in(rank, size, procs):
    import torch_ddl

    with open(procs, "w") as f:  # what this rank allocates from here on counts
        f.write(str(os.getpid()))
    t = torch.empty(TENSOR_BYTES // 4)
    t.fill_(float(rank + 1))
    total = float(size * (size + 1) // 2)
    for step in range(3):  # seen, adopted, then direct
        dist.all_reduce(t)
        want = total * size**step
        assert float(t[0]) == want and float(t[-1]) == want and bool((t == want).all()), step
    assert torch_ddl._C.adopted_buffers() == 1


def test_adopting_a_large_tensor_needs_bounded_memory(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a memory cgroup")
    cgroup = MemoryCgroup(LIMIT)
    try:
        cgroup.create()
    except OSError as e:
        pytest.skip(f"no memory cgroup can be made here: {e}")
    monkeypatch.setenv("TORCH_DDL_SHARE_TENSORS", "1")
    try:
        run_ranks(_allreduce_large_in, 2, cgroup.procs)
        peak = cgroup.peak()
    finally:
        cgroup.remove()
    assert peak < LIMIT, (peak, LIMIT)
