"""A peer that dies or exits fails the survivors' operations within seconds, naming it, not at
the group's timeout; later operations of the group fail at once with the same cause."""

import os
import signal
import tempfile
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from ddl_testing import fault_call, random_fault, run_spawned, spawn

TIMEOUT = timedelta(seconds=60)
BOUND_S = 2.0


def _rank(rank, size, victim, how, op, store, stamp, before=5, pause_us=0):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ddl

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=TIMEOUT)
    call = fault_call(op, size)
    for _ in range(before):
        call()
    if rank == victim:
        time.sleep(pause_us / 1e6)  # the others are somewhere inside their next op
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "destroy":
            dist.destroy_process_group()
        os._exit(0)
    try:
        for _ in range(100000):
            call()
        raise AssertionError("the survivors never noticed")
    except RuntimeError as error:
        failed = time.time()
        message = str(error)
        kind = type(error)
    died = float(open(stamp).read())
    assert f"rank {victim} is gone" in message, message
    # The kind and the rank, without reading the words.
    assert issubclass(kind, dist.DistNetworkError), kind
    info = torch_ddl.failure()
    assert info["kind"] == "peer lost" and victim in info["ranks"], info
    assert failed - died < BOUND_S, f"noticed after {failed - died:.2f} s: {message}"
    # Later calls fail at once with the cause.
    start = time.time()
    with pytest.raises(RuntimeError, match=f"rank {victim} is gone"):
        call()
    assert time.time() - start < 0.5


def _run_fault(size, victim, how, op, before=5, pause_us=0):
    shm_before = set(os.listdir("/dev/shm"))
    want = [0] * size
    want[victim] = -signal.SIGKILL if how == "kill" else 0
    with tempfile.TemporaryDirectory() as tmp:
        args = (size, victim, how, op, os.path.join(tmp, "store"), os.path.join(tmp, "stamp"),
                before, pause_us)
        run_spawned(_rank, size, args, want, timeout=90)
    # Nothing is left in /dev/shm, not even by the rank killed with SIGKILL (ddl's shared
    # memory is memfds and UCX's unlinked segments: the kernel frees them with the process).
    left = set(os.listdir("/dev/shm")) - shm_before
    assert not left, f"left in /dev/shm: {sorted(left)}"


@pytest.mark.parametrize("how", ["kill", "exit", "destroy"])
@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "all_gather", "reduce_scatter"])
def test_a_peer_that_dies_fails_the_survivors_in_seconds(op, how):
    _run_fault(3, hash((op, how)) % 3, how, op)


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_peer_that_dies_in_a_staged_all_reduce_fails_the_survivors_in_seconds(how):
    # The survivors wait on its flags in shared memory, not on a message from it.
    _run_fault(3, 1, how, "all_reduce_256kib", pause_us=300)


FAULT_TRIALS = int(os.environ.get("DDL_FAULT_TRIALS", "6"))


@pytest.mark.parametrize("trial", range(FAULT_TRIALS))
def test_random_rank_dies_at_a_random_point_of_a_random_collective(trial):
    seed, _, size, op, how, victim, before, pause_us = random_fault(trial, [2, 3, 4])
    print(f"seed {seed}: {size} ranks, rank {victim} {how} after {before} x {op} + {pause_us} us")
    _run_fault(size, victim, how, op, before, pause_us)


def _stopped(rank, size, store, heartbeat):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch_ddl

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=3))
    x = torch.ones(1 << 18)
    dist.all_reduce(x)
    stopped = size - 1
    if rank == stopped:
        os.kill(os.getpid(), signal.SIGSTOP)  # alive, but its progress thread stands still
        return
    start = time.time()
    with pytest.raises(RuntimeError) as info:
        for _ in range(1000):
            dist.all_reduce(x)
    took = time.time() - start
    message = str(info.value)
    print(f"rank {rank} after {took:.2f} s: {message}", flush=True)
    if heartbeat:
        # Its watchers hear no heartbeat for 2 s (TORCH_DDL_HEARTBEAT_TIMEOUT_MS), before the op's
        # 3 s timeout: every survivor names it gone, by their word or its own.
        assert f"rank {stopped} is gone: " in message and "no heartbeat" in message, message
        assert took < 3, took
        assert type(info.value) is dist.DistNetworkError
        info = torch_ddl.failure()
        assert info["kind"] == "peer lost" and stopped in info["gone"], info
    else:
        # Without heartbeats only the timeout names it. The stopped rank is the end of every
        # survivor's wait: its next rank misses its call print, the others follow what the ranks
        # they wait for reported halfway to the deadline.
        assert "Timed out after 3000 ms" in message, message
        assert took < 6, took
        assert (f"rank {stopped} has not started this op" in message
                or f"to rank {stopped}, which" in message), message
        assert type(info.value) is dist.DistBackendError
        assert torch_ddl.failure()["kind"] == "timeout", torch_ddl.failure()
    # Every survivor stays until all have failed: one that exits is a lost peer to the rest.
    store = dist.distributed_c10d._get_default_store()
    store.add("failed", 1)
    deadline = time.time() + 20
    while store.add("failed", 0) < size - 1 and time.time() < deadline:
        time.sleep(0.05)
    os._exit(0)


@pytest.mark.parametrize("heartbeat", [True, False], ids=["heartbeat", "timeout"])
@pytest.mark.parametrize("size", [2, 4])
def test_a_stopped_peer_is_named_by_the_heartbeat_or_else_the_timeout(size, heartbeat,
                                                                       monkeypatch):
    monkeypatch.setenv("TORCH_DDL_HEARTBEAT_MS", "250" if heartbeat else "0")
    with tempfile.TemporaryDirectory() as tmp:
        ctx = spawn(_stopped, size, (size, os.path.join(tmp, "store"), heartbeat))
        try:
            for p in ctx.processes[:-1]:
                p.join(60)
            codes = [p.exitcode for p in ctx.processes[:-1]]
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
    assert codes == [0] * (size - 1), codes


def _aborted(rank, size, store, done):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch_ddl  # noqa: F401
    from torch._C._distributed_c10d import ErrorType

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=TIMEOUT)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    assert backend.get_error() == ErrorType.SUCCESS
    if rank == 1:  # stays alive, never joins the next all_reduce
        deadline = time.time() + 60
        while not os.path.exists(done) and time.time() < deadline:
            time.sleep(0.05)
        os._exit(0)
    work = dist.all_reduce(x, async_op=True)
    time.sleep(0.2)
    assert not work.is_completed()
    start = time.time()
    backend.abort()
    with pytest.raises(RuntimeError, match="abort\\(\\) was called"):
        work.wait()
    assert time.time() - start < 1.0
    assert backend.get_error() == ErrorType.COMM_ERROR
    start = time.time()
    with pytest.raises(RuntimeError, match="abort\\(\\) was called"):
        dist.all_reduce(x)
    assert time.time() - start < 0.5
    open(done, "w").close()
    os._exit(0)


def _timed_out(rank, size, store, done):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch_ddl  # noqa: F401
    from torch._C._distributed_c10d import ErrorType

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=1))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    if rank == 1:
        deadline = time.time() + 60
        while not os.path.exists(done) and time.time() < deadline:
            time.sleep(0.05)
        os._exit(0)
    with pytest.raises(RuntimeError, match="Timed out"):
        dist.all_reduce(torch.ones(10))
    assert backend.get_error() == ErrorType.TIMEOUT
    open(done, "w").close()
    os._exit(0)


@pytest.mark.parametrize("body", [_aborted, _timed_out])
def test_abort_fails_ops_in_flight_and_get_error_names_the_first_failure(body):
    size = 2
    with tempfile.TemporaryDirectory() as tmp:
        args = (size, os.path.join(tmp, "store"), os.path.join(tmp, "done"))
        run_spawned(body, size, args, [0, 0], timeout=90)
