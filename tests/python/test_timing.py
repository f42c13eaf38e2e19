"""Completion hooks and collective timing on a ddl group: ProcessGroup._register_on_completion_hook
gets c10d's WorkInfo for every op, and Work._get_duration() after _enable_collectives_timing."""

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
from ddl_testing import run_ranks


def _hooks(rank, size):
    pg = dist.group.WORLD
    assert not pg._has_hooks()
    infos, lock = [], threading.Lock()

    def hook(info):
        with lock:
            infos.append(info)

    pg._register_on_completion_hook(hook)
    assert pg._has_hooks()
    with pytest.raises(RuntimeError, match="get_duration needs"):
        work = dist.all_reduce(torch.ones(8), async_op=True)
        work.wait()
        work._get_duration()
    pg._enable_collectives_timing()
    x = torch.ones(1 << 20)
    start = time.monotonic()
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    took_ms = (time.monotonic() - start) * 1e3
    duration = work._get_duration()
    assert 0 < duration <= took_ms + 1, (duration, took_ms)
    dist.broadcast(x, src=0)
    dist.barrier()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with lock:
            if len(infos) >= 4:
                break
        time.sleep(0.01)
    with lock:
        seen = list(infos)
    assert len(seen) == 4, [i.op_type for i in seen]
    # Hooks run on the threads that complete Futures: in any order, each op once, numbered in
    # the order the ops were called.
    seen.sort(key=lambda i: i.seq)
    assert len({i.seq for i in seen}) == 4, [i.seq for i in seen]
    kinds = [str(i.op_type) for i in seen]
    assert "ALLREDUCE" in kinds[0] and "ALLREDUCE" in kinds[1] and "BROADCAST" in kinds[2], kinds
    assert "BARRIER" in kinds[3], kinds
    for i in seen:
        assert i.time_finished >= i.time_started
        assert i.active_duration.total_seconds() >= 0
    with pytest.raises(RuntimeError, match="already has a completion hook"):
        pg._register_on_completion_hook(hook)


def test_completion_hooks_and_timing():
    run_ranks(_hooks, 2)


def _logged(rank, size):
    x = torch.ones(1 << 18)
    dist.all_reduce(x)
    dist.all_reduce(x)
    dist.broadcast(x, src=0)


def test_the_debug_log_says_what_each_group_found_and_did(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_DDL_DEBUG", "TRACE")
    monkeypatch.setenv("TORCH_DDL_DEBUG_FILE", str(tmp_path / "ddl_%h_%p.log"))
    run_ranks(_logged, 2)
    logs = sorted(tmp_path.glob("ddl_*.log"))
    assert len(logs) == 2, logs  # one per process, named by host and pid
    for log in logs:
        lines = log.read_text().splitlines()
        assert any(" INFO " in line and "created: 1 host" in line and "links " in line
                   for line in lines), lines
        plans = [line for line in lines if "allreduce of 1048576 bytes:" in line]
        assert len(plans) == 1, lines  # once per size class, not per call
        ops = [line for line in lines if " TRACE " in line]
        assert len(ops) == 3 and "broadcast(262144 x float32 from rank 0)" in ops[2], ops


def test_a_bad_debug_level_is_refused_naming_it():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import torch_ddl, torch_ddl._C"],
                         env={**__import__("os").environ, "TORCH_DDL_DEBUG": "LOUD"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "TORCH_DDL_DEBUG=LOUD" in out.stderr, out.stderr[-2000:]


def _allocated(rank, size):
    import torch_ddl
    cpu = torch.device("cpu")
    backend = dist.group.WORLD._get_backend(cpu)
    assert backend.supports_tensor_alloc(cpu)
    live = torch_ddl._C.shared_buffers_live()
    t = backend.allocate_tensor(1 << 20, dtype=torch.float64, device=cpu)
    assert t.dtype == torch.float64 and t.numel() == 1 << 20 and t.device == cpu
    assert torch_ddl._C.shared_buffers_live() == live + 1  # shared memory: the direct path
    gloo = dist.new_group(backend="gloo")
    for step in range(3):
        t.copy_(torch.arange(1 << 20, dtype=torch.float64) * (rank + step))
        want = t.clone()
        dist.all_reduce(t)
        dist.all_reduce(want, group=gloo)
        assert torch.equal(t, want)
    with pytest.raises((ValueError, RuntimeError), match="not on cuda"):
        backend.allocate_tensor(4, dtype=torch.float32, device=torch.device("cuda", 0))
    del t


def test_allocate_tensor_gives_shared_memory_that_allreduces_like_gloo():
    run_ranks(_allocated, 2)


def _estimates(rank, size, results):
    x = torch.full((1 << 22,), float(rank))  # 16 MiB
    outs = [torch.empty(1 << 18) for _ in range(size)]
    with dist._time_estimator() as whole:
        dist.all_reduce(x)
    with dist._time_estimator() as several:
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        dist.all_gather(outs, x[: 1 << 18])
        dist.broadcast(x, src=0)
        dist.barrier()
    # Nothing was sent: every tensor is as it was.
    assert torch.equal(x, torch.full((1 << 22,), float(rank)))
    assert whole.estimated_time > 0 and several.estimated_time > whole.estimated_time
    # What the group then measures for the same allreduce.
    dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(x)
    measured_us = (time.perf_counter() - start) / 3 * 1e6
    assert torch.equal(x, torch.full((1 << 22,), float(sum(range(size)) * size ** 3)))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    backend._start_time_estimate()
    with pytest.raises(RuntimeError, match="already estimates"):
        backend._start_time_estimate()
    backend._end_time_estimate()
    with pytest.raises(RuntimeError, match="without _start_time_estimate"):
        backend._end_time_estimate()
    if rank == 0:
        with open(results, "w") as f:
            f.write(f"{whole.estimated_time} {measured_us}")


@pytest.mark.parametrize("size", [2, 3])
def test_time_estimator_predicts_without_communicating(size, tmp_path):
    results = str(tmp_path / "estimate")
    run_ranks(_estimates, size, results)
    estimated, measured = (float(v) for v in open(results).read().split())
    print(f"{size} ranks, 16 MiB allreduce: estimated {estimated:.0f} us, measured "
          f"{measured:.0f} us ({estimated / measured:.2f}x)")
    assert estimated > 0 and measured > 0


def _unwaited_ops_progress(rank, size):
    x = torch.ones(1 << 16)
    dist.barrier()
    # An async op whose caller does not wait: the progress thread runs it, and the peer's
    # blocking call (turned by its own caller) ends while this rank sleeps.
    if rank == 0:
        work = dist.all_reduce(x, async_op=True)
        time.sleep(1.0)
        work.wait()
    else:
        start = time.monotonic()
        dist.all_reduce(x)
        took = time.monotonic() - start
        assert took < 0.5, f"the peer's async op waited for its caller: {took:.3f} s"
    assert torch.equal(x, torch.full_like(x, 2.0))
    dist.barrier()
    time.sleep(0.05)  # both progress threads asleep
    # A call made as a blocking one (asyncOp false) but polled instead of waited for: polling
    # wakes the progress thread at once (with no heartbeats it would sleep up to a second).
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    y = torch.ones(4)
    start = time.monotonic()
    work = dist.group.WORLD.allreduce([y], opts)
    while not work.is_completed() and time.monotonic() - start < 5:
        time.sleep(0.0005)
    took = time.monotonic() - start
    assert work.is_completed() and torch.equal(y, torch.full_like(y, 2.0))
    assert took < 0.3, f"a polled blocking call took {took:.3f} s"


def test_ops_progress_whether_or_not_their_callers_wait(monkeypatch):
    monkeypatch.setenv("TORCH_DDL_HEARTBEAT_MS", "0")
    run_ranks(_unwaited_ops_progress, 2)


def _thread_seconds():
    """CPU seconds of each thread of this process, by thread id."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def _waited_ops_leave_the_thread_asleep(rank, size):
    x, y = torch.ones(2), torch.ones(2)
    for _ in range(2000):
        dist.all_reduce(x)
    before, start = _thread_seconds(), time.monotonic()
    while time.monotonic() - start < 2.0:
        # Every hundredth op is left to the progress thread (async_op, waited for later): woken
        # for it, the thread must go back to sleep, not run the blocking ones after it.
        work = dist.all_reduce(y, async_op=True)
        for _ in range(100):
            dist.all_reduce(x)
        work.wait()
    wall = time.monotonic() - start
    after = _thread_seconds()
    main = threading.get_native_id()
    others = sum(s - before.get(t, 0.0) for t, s in after.items() if t != main)
    # The callers turn the runtime themselves; the progress thread sleeps but for its timers and
    # the async ops (0.04 - 0.05 of a core on 2 cores).
    assert others < 0.12 * wall, f"the other threads took {others:.2f} s of CPU in {wall:.2f} s"


def test_a_caller_that_waits_leaves_the_progress_thread_asleep():
    # Before, the progress thread, woken for a timer, took the turn between the caller's ops and
    # kept it, running them itself and spinning on: 0.3 - 0.85 of a core beside such a loop.
    # Then, kept off while a caller waits, it still took the ops submitted but not yet waited
    # for, each renewing its spin: 0.15 - 0.3 of a core beside this loop (0.01 - 0.85 without
    # its async ops, by chance).
    run_ranks(_waited_ops_leave_the_thread_asleep, 1)
