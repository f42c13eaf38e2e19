"""What torch 2.15 adds to a backend, on a ddl group: completion hooks (fired once per op that
succeeded, with a key that is never reused and, while timing is on, the op's duration; nothing
for a failed op), supports_abort_hooks, and the time estimator through torch's own binding.
Skipped under older torch, which has none of them."""

import datetime
import time

import pytest
import torch
import torch.distributed as dist
from ddl_testing import run_ranks

import torch_ddl

pytestmark = pytest.mark.skipif(
    not hasattr(torch_ddl._C.ProcessGroupDDL, "_record_completions"),
    reason=f"torch {torch.__version__} has no completion hooks (torch 2.15 adds them)")


def _wait_for(hook_id, count, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        calls = torch_ddl._C.ProcessGroupDDL._recorded_completions(hook_id)
        if len(calls) >= count:
            return calls
        time.sleep(0.01)
    return torch_ddl._C.ProcessGroupDDL._recorded_completions(hook_id)


def _api(rank, size):
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert backend.supports_abort_hooks
    backend._record_completions(7)
    with pytest.raises(RuntimeError, match="registered already"):
        backend._record_completions(7)
    t = torch.ones(64)
    for _ in range(4):
        dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.all_reduce(t, async_op=True).wait()
    calls = _wait_for(7, 6)
    time.sleep(0.2)  # nothing more comes
    calls = torch_ddl._C.ProcessGroupDDL._recorded_completions(7)
    assert len(calls) == 6, calls
    keys = [key for key, _ in calls]
    assert len(set(keys)) == 6 and all(k > 0 for k in keys), keys
    assert all(duration is None for _, duration in calls), calls  # timing is off
    dist.group.WORLD._enable_collectives_timing()
    dist.all_reduce(torch.ones(1 << 18))
    calls = _wait_for(7, 7)
    assert len(calls) == 7 and calls[-1][1] is not None and calls[-1][1] >= 0, calls
    assert calls[-1][0] not in keys
    # A failed op fires nothing: rank 0 alone on a group with a 1 s timeout.
    late = dist.new_group(backend="ddl", timeout=datetime.timedelta(seconds=1))
    late_backend = late._get_backend(torch.device("cpu"))
    late_backend._record_completions(8)
    if rank == 0:
        with pytest.raises(dist.DistBackendError):
            dist.all_reduce(torch.ones(4), group=late)
    dist.barrier()
    time.sleep(0.2)
    assert torch_ddl._C.ProcessGroupDDL._recorded_completions(8) == []
    # The time estimator through torch's binding of the base class (torch 2.15 makes it virtual).
    backend._start_time_estimate()
    dist.all_reduce(torch.ones(1 << 20))
    estimate = backend._end_time_estimate()
    assert isinstance(estimate, float) and estimate > 0, estimate


@pytest.mark.parametrize("size", [2, 3])
def test_torch_215_backend_api(size):
    run_ranks(_api, size)
