"""Coalesced collectives (the coalescing manager and the *_coalesced calls), PREMUL_SUM and
monitored_barrier over 'ddl'."""

import threading
import time
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from ddl_testing import assert_same, run_ranks


def _coalesced(rank, size):
    warnings.simplefilter("ignore")
    gloo = dist.new_group(backend="gloo")
    shapes = [(3,), (2, 5), (0,), (1021,)]
    # Coalescing manager over all_reduce: one flat allreduce for all the tensors.
    ts = [torch.full(s, float(rank + i)) for i, s in enumerate(shapes)]
    with _coalescing_manager():
        for t in ts:
            dist.all_reduce(t)
    for i, (s, t) in enumerate(zip(shapes, ts)):
        assert_same(t, torch.full(s, float(sum(r + i for r in range(size)))), f"cm all_reduce {i}")
    # The deprecated all_reduce_coalesced, against gloo, with MAX.
    a = [torch.arange(7, dtype=torch.int64) * (rank + 1), torch.tensor([rank, -rank])]
    b = [x.clone() for x in a]
    dist.all_reduce_coalesced(a, op=dist.ReduceOp.MAX)
    dist.all_reduce_coalesced(b, op=dist.ReduceOp.MAX, group=gloo)
    for x, y in zip(a, b):
        assert_same(x, y, "all_reduce_coalesced")
    # Coalesced all_gather_into_tensor.
    ins = [torch.full((n,), float(10 * rank + n)) for n in (1, 4, 9)]
    outs = [torch.zeros(size * n) for n in (1, 4, 9)]
    with _coalescing_manager():
        for o, x in zip(outs, ins):
            dist.all_gather_into_tensor(o, x)
    for o, n in zip(outs, (1, 4, 9)):
        want = torch.cat([torch.full((n,), float(10 * r + n)) for r in range(size)])
        assert_same(o, want, f"cm all_gather_into_tensor n={n}")
    # A non-contiguous output (a transposed view) is written through a staging copy.
    out_t = torch.zeros(3, size).t()
    with _coalescing_manager():
        dist.all_gather_into_tensor(out_t, torch.full((3,), float(rank)))
    assert_same(out_t, torch.arange(size, dtype=torch.float32)[:, None].expand(size, 3),
                "cm all_gather_into_tensor into a view")
    # Coalesced reduce_scatter_tensor.
    ins = [torch.arange(size * n, dtype=torch.float32) + rank for n in (2, 5)]
    outs = [torch.zeros(n) for n in (2, 5)]
    with _coalescing_manager():
        for o, x in zip(outs, ins):
            dist.reduce_scatter_tensor(o, x)
    for o, n in zip(outs, (2, 5)):
        full = sum(torch.arange(size * n, dtype=torch.float32) + r for r in range(size))
        assert_same(o, full[rank * n:(rank + 1) * n], f"cm reduce_scatter_tensor n={n}")
    # all_gather_coalesced: outs[r][i] receives rank r's input i.
    outs = [[torch.zeros(2), torch.zeros(3, 1), torch.zeros(0)] for _ in range(size)]
    ins = [torch.full((2,), float(rank)), torch.full((3, 1), float(-rank)), torch.zeros(0)]
    dist.all_gather_coalesced(outs, ins)
    ref = [[torch.zeros(2), torch.zeros(3, 1), torch.zeros(0)] for _ in range(size)]
    dist.all_gather_coalesced(ref, ins, group=gloo)
    for r in range(size):
        assert_same(outs[r][0], torch.full((2,), float(r)), "all_gather_coalesced 0")
        assert_same(outs[r][1], torch.full((3, 1), float(-r)), "all_gather_coalesced 1")
        for got, want in zip(outs[r], ref[r]):
            assert_same(got, want, "all_gather_coalesced vs gloo")


def _batched(rank, size):
    """batch_isend_irecv and the coalescing manager with a device go through the backend's
    startCoalescing / endCoalescing: one Work for the batch (torch's generic path returns one
    per op), the results equal gloo's."""
    warnings.simplefilter("ignore")
    gloo = dist.new_group(backend="gloo")
    cpu = torch.device("cpu")
    assert dist.group.WORLD._get_backend(cpu).supports_coalescing
    for group in (None, gloo):
        right, left = (rank + 1) % size, (rank - 1) % size
        sends = [torch.full((n,), float(100 * rank + n)) for n in (1, 257, 4099)]
        recvs = [torch.zeros(n) for n in (1, 257, 4099)]
        ops = [dist.P2POp(dist.isend, t, right, group=group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, left, group=group) for t in recvs]
        works = dist.batch_isend_irecv(ops)
        if group is None:
            assert len(works) == 1, works  # one coalesced Work (gloo: one per op)
            assert len(works[0].get_future().wait()) == 6
        else:
            assert len(works) == 6
        for w in works:
            w.wait()
        for t, n in zip(recvs, (1, 257, 4099)):
            assert_same(t, torch.full((n,), float(100 * left + n)), f"batch recv n={n}")
    # The batch is one op of the core: a group with a completion hook sees one COALESCED op
    # for six sends and receives (of several tags, two of them to one peer).
    pg = dist.new_group(backend="ddl")
    infos, lock = [], threading.Lock()

    def hook(info):
        with lock:
            infos.append(info)
    pg._register_on_completion_hook(hook)
    right, left = (rank + 1) % size, (rank - 1) % size
    sends = [torch.full((n,), float(rank * 10 + n)) for n in (3, 1, 2)]
    recvs = [torch.zeros(n) for n in (3, 1, 2)]
    tags = (7, 0, 7)
    ops = [dist.P2POp(dist.isend, t, right, group=pg, tag=g) for t, g in zip(sends, tags)]
    ops += [dist.P2POp(dist.irecv, t, left, group=pg, tag=g) for t, g in zip(recvs, tags)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for t, n in zip(recvs, (3, 1, 2)):
        assert_same(t, torch.full((n,), float(left * 10 + n)), f"tagged batch recv n={n}")
    pg._wait_for_pending_works()
    with lock:
        kinds = [str(i.op_type) for i in infos]
    assert len(kinds) == 1 and "COALESCED" in kinds[0], kinds
    # A member's Work waits with the batch; before the batch is posted it refuses to wait.
    pg._start_coalescing(cpu)
    try:
        early = pg.recv([torch.zeros(1)], left, 0)
        with pytest.raises(RuntimeError, match="has not been posted"):
            early.wait()
        with pytest.raises(ValueError, match="named ranks only"):
            pg.recv_anysource([torch.zeros(1)], 0)
        pg.send([torch.ones(1)], right, 0)
    finally:
        batch = pg._end_coalescing(cpu)
    batch.wait()
    early.wait()
    assert early.is_completed() and early._source_rank() == left
    # The coalescing manager with a device asks the backend to coalesce too.
    ts = [torch.full((n,), float(rank)) for n in (5, 1021)]
    with _coalescing_manager(device=cpu, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for t in ts:
        assert_same(t, torch.full_like(t, float(sum(range(size)))), "cm with a device")


@pytest.mark.parametrize("size", [2, 3])
def test_batch_isend_irecv_and_the_coalescing_manager_coalesce_in_the_backend(size):
    run_ranks(_batched, size)


def _premul(rank, size):
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    assert_same(t, torch.full((5,), 0.5 * size * (size + 1) / 2), "PREMUL_SUM factor")
    t = torch.full((5,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor([2.0], dtype=torch.float64)))
    assert_same(t, torch.full((5,), 2.0 * size * (size + 1) / 2, dtype=torch.float64),
                "PREMUL_SUM tensor factor")
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, torch.ones(2 * size), op=dist._make_nccl_premul_sum(3.0))
    assert_same(out, torch.full((2,), 3.0 * size), "PREMUL_SUM reduce_scatter")
    with pytest.raises(ValueError, match="PREMUL_SUM.*floating"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0))


def _monitored(rank, size):
    gloo = dist.new_group(backend="gloo")
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(wait_all_ranks=True)
    short = dist.new_group(backend="ddl")
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(dist.DistBackendError) as info:
            dist.monitored_barrier(group=short, timeout=timedelta(milliseconds=800),
                                   wait_all_ranks=True)
        message = str(info.value)
        missing = ", ".join(str(r) for r in range(1, size))
        words = "Ranks" if size > 2 else "Rank"
        assert f"{words} {missing} failed to pass monitoredBarrier in 800 ms" in message, message
        assert time.monotonic() - start < 10
    dist.barrier(group=gloo)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_coalesced(size):
    run_ranks(_coalesced, size)


@pytest.mark.parametrize("size", [2, 3])
def test_premul_sum(size):
    run_ranks(_premul, size)


@pytest.mark.parametrize("size", [2, 3])
def test_monitored_barrier_names_missing_ranks(size):
    run_ranks(_monitored, size)


def _no_time_left(rank, size):
    # A coalesced batch whose later member is awaited once no time is left (a 1 ms wait): c10d
    # reads a 0 ms wait as no timeout, and the batch waited for that member without end.
    pg = dist.new_group(backend="ddl", timeout=timedelta(seconds=20))
    t = torch.ones(4)
    pg._start_coalescing(torch.device("cpu"))
    try:
        pg.allreduce([t])
        if rank == 0:
            pg.recv([torch.zeros(1)], 1, 5)  # rank 1 never sends it
    finally:
        batch = pg._end_coalescing(torch.device("cpu"))
    time.sleep(0.5)  # the allreduce is done
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="gave up after 1 ms"):
            batch.wait(timedelta(milliseconds=1))
        assert time.monotonic() - start < 3, time.monotonic() - start
    dist.barrier()


def test_a_coalesced_wait_with_no_time_left_gives_up():
    run_ranks(_no_time_left, 2)
