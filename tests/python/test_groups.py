"""Subgroups over 'ddl': any subset in any order, new_subgroups, groups created while others are
busy, 200 groups without threads, file descriptors or memory growing; sequence numbers; and
TORCH_DISTRIBUTED_DEBUG=DETAIL (torch's collective-fingerprint wrapper around the backend)."""

import gc
import os

import pytest
import torch
import torch.distributed as dist

from ddl_testing import assert_same, run_ranks


def _subsets(rank, size):
    # Ranks listed in reverse order (torch sorts them: group ranks follow global order).
    rev = dist.new_group(ranks=list(reversed(range(size))), backend="ddl")
    t = torch.tensor([float(rank)])
    dist.broadcast(t, src=size - 1, group=rev)  # src is a global rank
    assert t.item() == size - 1
    assert dist.get_group_rank(rev, rank) == rank
    # Two disjoint halves at once, plus a group that skips rank 0.
    evens = dist.new_group(ranks=[r for r in range(size) if r % 2 == 0], backend="ddl")
    odds = dist.new_group(ranks=[r for r in range(size) if r % 2 == 1], backend="ddl")
    tail = dist.new_group(ranks=list(range(1, size)), backend="ddl")
    mine = evens if rank % 2 == 0 else odds
    x = torch.full((1000,), float(rank))
    work = dist.all_reduce(x, group=mine, async_op=True)
    if rank != 0:
        y = torch.full((10,), 1.0)
        dist.all_reduce(y, group=tail)
        assert_same(y, torch.full((10,), float(size - 1)), "tail group")
    work.wait()
    members = [r for r in range(size) if r % 2 == rank % 2]
    assert_same(x, torch.full((1000,), float(sum(members))), "half group")
    sub, subs = dist.new_subgroups(group_size=1 if size == 1 else (2 if size % 2 == 0 else 1),
                                   backend="ddl")
    z = torch.ones(3)
    dist.all_reduce(z, group=sub)
    assert_same(z, torch.full((3,), float(dist.get_world_size(sub))), "new_subgroups")
    # A group created while a large allreduce on the world group is in flight.
    big = torch.ones(1 << 20)
    busy = dist.all_reduce(big, async_op=True)
    late = dist.new_group(backend="ddl")
    w = torch.tensor([1.0])
    dist.all_reduce(w, group=late)
    busy.wait()
    assert w.item() == size and big[0].item() == size


def _resources():
    pid = os.getpid()
    threads = len(os.listdir(f"/proc/{pid}/task"))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return threads, fds, rss


def _many_groups(rank, size):
    def cycle(count):
        for i in range(count):
            g = dist.new_group(backend="ddl")
            t = torch.full((64,), float(i + rank))
            dist.all_reduce(t, group=g)
            assert t[0].item() == size * i + size * (size - 1) / 2
            dist.destroy_process_group(g)
        gc.collect()

    cycle(20)  # warm up: first-use allocations, connections to every peer
    before = _resources()
    cycle(200)
    after = _resources()
    assert after[0] <= before[0], f"threads grew from {before[0]} to {after[0]}"
    assert after[1] <= before[1] + 2, f"file descriptors grew from {before[1]} to {after[1]}"
    grown = (after[2] - before[2]) / 2**20
    assert grown < 64, f"resident memory grew by {grown:.1f} MiB over 200 groups"


def _sequence_and_debug(rank, size):
    # torch's ProcessGroup forwards sequence numbers for its own backend types only; the backend
    # object answers for 'ddl' (under DETAIL it is wrapped, so unwrap when needed).
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    backend = getattr(backend, "wrapped_pg", backend)
    start = backend._get_sequence_number_for_group()
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    assert backend._get_sequence_number_for_group() == start + 3
    seqs = [None] * size
    dist.all_gather_object(seqs, backend._get_sequence_number_for_group())
    assert len(set(seqs)) == 1, f"sequence numbers out of sync: {seqs}"
    # Under DETAIL, torch wraps the backend and checks each collective's fingerprint first.
    x = torch.full((5,), float(rank))
    dist.all_reduce(x)
    assert_same(x, torch.full((5,), float(size * (size - 1) / 2)), "all_reduce under DETAIL")
    outs = [torch.zeros(2) for _ in range(size)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    dist.barrier()
    bad = torch.ones(3 if rank == 0 else 4)
    with pytest.raises(RuntimeError, match="(?i)mismatch"):
        dist.all_reduce(bad)


def _settings_per_group(rank, size):
    import torch_ddl

    def backend(group):
        return group._get_backend(torch.device("cpu"))

    # 64 KiB: recursive doubling by default on one host; each group plans as configured when it
    # was created, whatever the settings are later.
    default = dist.new_group(backend="ddl")
    os.environ["TORCH_DDL_ALLREDUCE_ALGO"] = "ring"
    try:
        torch_ddl._C.check_config()
        ring = dist.new_group(backend="ddl")
    finally:
        del os.environ["TORCH_DDL_ALLREDUCE_ALGO"]
        torch_ddl._C.check_config()
    later = dist.new_group(backend="ddl")
    nbytes = 65536
    plans = {name: backend(g).allreduce_plan(nbytes)
             for name, g in (("default", default), ("ring", ring), ("later", later))}
    assert plans["ring"].startswith("ring"), plans
    assert not plans["default"].startswith("ring"), plans
    assert plans["later"] == plans["default"], plans
    assert all(row[1][0][0] == plans["ring"] for row in backend(ring).plan_rows([nbytes])), plans
    for g in (default, ring, later):
        x = torch.full((nbytes // 4,), float(rank + 1))
        dist.all_reduce(x, group=g)
        assert_same(x, torch.full_like(x, size * (size + 1) / 2), plans)


def test_each_group_plans_with_the_settings_of_its_creation():
    run_ranks(_settings_per_group, 2)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_subgroups(size):
    run_ranks(_subsets, size)


def test_200_groups_do_not_grow_threads_fds_or_memory():
    run_ranks(_many_groups, 2, timeout=400)


def test_sequence_numbers_and_debug_detail(monkeypatch):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    run_ranks(_sequence_and_debug, 2)


def _merge(rank, size):
    # Two separate groups (halves of the world) merge through a store they share into one group
    # of every process: ranks in the order they reached the store, each process once.
    from datetime import timedelta

    half = dist.new_group(ranks=list(range(size // 2)), backend="ddl")
    other = dist.new_group(ranks=list(range(size // 2, size)), backend="ddl")
    mine = half if rank < size // 2 else other
    store = dist.PrefixStore("merge", dist.distributed_c10d._get_default_store())
    merged = mine.merge_remote_group(store, size, timedelta(seconds=60))
    assert merged.size() == size
    backend = merged._get_backend(torch.device("cpu"))
    assert backend.name() == "ddl" or "ddl" in type(backend).__name__.lower()
    x = torch.full((70001,), float(rank + 1))
    merged.allreduce([x]).wait()
    assert torch.equal(x, torch.full((70001,), float(size * (size + 1) // 2)))
    seen = torch.zeros(size)
    seen[merged.rank()] = rank + 1
    merged.allreduce([seen]).wait()
    assert sorted(seen.tolist()) == [float(r + 1) for r in range(size)]


def test_merge_remote_group_forms_one_group_of_separate_groups():
    run_ranks(_merge, 4)
