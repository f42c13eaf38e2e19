"""Bad input is refused before anything moves; a late peer is named within the timeout; an idle
group costs no CPU."""

import resource
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ddl_testing import run_ranks


def _bad_input(rank, size):
    with pytest.raises(ValueError, match="BAND.*float32"):
        dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND)
    with pytest.raises(ValueError, match="AVG.*bool"):
        dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG)
    sparse = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (3,))
    with pytest.raises(ValueError, match="sparse tensors are reduced with ReduceOp.SUM only"):
        dist.all_reduce(sparse, op=dist.ReduceOp.MAX)
    with pytest.raises(ValueError, match="dtype .* is not supported"):
        dist.all_reduce(torch.ones(3, dtype=torch.uint32))
    # Complex SUM works: torch hands it to the backend as its float view.
    z = torch.full((3,), complex(rank, 1), dtype=torch.complex64)
    dist.all_reduce(z)
    assert torch.equal(z, torch.full((3,), complex(size * (size - 1) / 2, size),
                                     dtype=torch.complex64))
    with pytest.raises(ValueError, match="numel|output"):
        dist.all_gather_into_tensor(torch.empty(5), torch.ones(3))
    with pytest.raises((ValueError, RuntimeError)):
        dist.all_gather([torch.empty(3)] * (size + 1), torch.ones(3))
    # Nothing was sent: the group still works and no message is mixed in.
    t = torch.full((10,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((10,), float(size * (size - 1) / 2)))


def test_bad_input_is_refused_and_the_group_still_works():
    run_ranks(_bad_input, 2)


def _late_peer(rank, size):
    gloo = dist.new_group(backend="gloo")
    short = dist.new_group(backend="ddl", timeout=timedelta(milliseconds=1500))
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(dist.DistBackendError) as info:
            dist.all_reduce(torch.ones(1000), group=short)
        waited = time.monotonic() - start
        message = str(info.value)
        assert "Timed out after 1500 ms" in message, message
        assert "rank 1" in message and "allreduce" in message, message
        assert waited < 10, waited
    dist.barrier(group=gloo)  # rank 1 arrives here without joining the allreduce


def test_late_peer_is_named_within_the_timeout():
    run_ranks(_late_peer, 2)


def _idle(rank, size):
    t = torch.ones(1 << 16)
    for _ in range(20):
        dist.all_reduce(t)
    time.sleep(0.3)  # let the progress thread go to sleep
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(2.0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.1, f"an idle process group used {cpu:.3f} s of CPU in 2 s"
    dist.barrier()


def test_idle_group_costs_no_cpu():
    run_ranks(_idle, 2)


def _wait_timeout(rank, size):
    gloo = dist.new_group(backend="gloo")
    if rank == 0:
        work = dist.all_reduce(torch.ones(4), async_op=True)
        with pytest.raises(dist.DistBackendError, match="gave up after 300 ms"):
            work.wait(timeout=timedelta(milliseconds=300))
    dist.barrier(group=gloo)
    if rank == 1:
        dist.all_reduce(torch.ones(4))  # the peer joins late; rank 0's op then completes


def test_wait_with_timeout_gives_up_but_the_op_can_still_finish():
    run_ranks(_wait_timeout, 2)


def _mismatched(rank, size):
    # Ranks that call a collective with different sizes or dtypes raise; none returns a partial
    # or garbled result, and the group goes on working. At 2 ranks both see the other's message
    # and say so; at 3, a rank that only waits on one that failed still times out (the failure
    # is not yet sent to every rank).
    group = dist.new_group(backend="ddl", timeout=timedelta(seconds=3))
    n = 100 if rank == 0 else 200
    cases = [
        ("all_reduce 100 vs 200", lambda: dist.all_reduce(torch.ones(n), group=group)),
        ("all_reduce float32 vs float64", lambda: dist.all_reduce(
            torch.ones(100, dtype=torch.float32 if rank == 0 else torch.float64), group=group)),
        ("all_gather 100 vs 200", lambda: dist.all_gather(
            [torch.empty(n) for _ in range(size)], torch.ones(n), group=group)),
    ]
    expected = "different sizes or dtypes" + ("" if size == 2 else "|Timed out")
    for what, call in cases:
        with pytest.raises(RuntimeError, match=expected):
            call()
        t = torch.ones(5)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((5,), float(size))), what


@pytest.mark.parametrize("size", [2, 3])
def test_mismatched_calls_raise_on_every_rank(size):
    run_ranks(_mismatched, size, timeout=120)
