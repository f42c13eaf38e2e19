"""Completion hooks and collective timing on a ddl group: ProcessGroup._register_on_completion_hook
gets c10d's WorkInfo for every op, and Work._get_duration() after _enable_collectives_timing."""

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
    kinds = [str(i.op_type) for i in seen]
    assert "ALLREDUCE" in kinds[0] and "ALLREDUCE" in kinds[1] and "BROADCAST" in kinds[2], kinds
    assert "BARRIER" in kinds[3], kinds
    assert [i.seq for i in seen] == sorted(i.seq for i in seen)
    for i in seen:
        assert i.time_finished >= i.time_started
        assert i.active_duration.total_seconds() >= 0
    with pytest.raises(RuntimeError, match="already has a completion hook"):
        pg._register_on_completion_hook(hook)


def test_completion_hooks_and_timing():
    run_ranks(_hooks, 2)
