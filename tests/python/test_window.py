"""One-sided windows (torch_ddl.new_window; torch's dist._new_window from 2.14 on) in real
processes on one host: puts and signals against send/recv of the same data at 2 - 4 ranks, over
mapped shared memory and over UCX's puts; refusals before anything moves, on every rank; a wait
for a signal that never comes, and one from a peer that died, end naming the peer."""

import datetime
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
from ddl_testing import NO_GLIBC_BLOCKS, SANITIZED, WORLD_SIZES, run_ranks, run_spawned
from window_checks import every_round

import torch_ddl


def _rounds(rank, size):
    # A large tensor whose storage glibc mapped for it moves into shared memory as it registers
    # (first: once glibc freed such a block it serves that size from its heap).
    if not SANITIZED:
        seen = every_round(rank, size, [(1 << 18) + 3], dtypes=[torch.float32],
                           memories=["block"])
        assert seen["block"] == {"mapped"}, seen
    seen = every_round(rank, size, [0, 1, 1031])
    # Shared memory on one host: every peer is mapped; small plain tensors (not blocks of their
    # own) travel by UCX's puts.
    assert seen["shared"] == {"mapped"}, seen
    assert seen["plain"] == {"put"}, seen


@pytest.mark.parametrize("size", [s for s in WORLD_SIZES if s >= 2])
def test_puts_and_signals_match_send_recv(size):
    run_ranks(_rounds, size)


def _refusals(rank, size):
    # Shapes differ on one rank: every rank raises, naming it.
    t = torch.zeros(8 if rank != 2 else 9)
    with pytest.raises(ValueError, match=r"same dtype and shape: rank 0 Float \[8\] on cpu, "
                                         r"rank 2 Float \[9\] on cpu"):
        torch_ddl.new_window(t)
    # A rank's tensor refused where it stands: every rank raises, naming it.
    t = torch.zeros(4, 4)
    w = torch_ddl.new_window()
    with pytest.raises(ValueError, match="rank 1: the tensor is not contiguous"):
        w.tensor_register(t.t() if rank == 1 else t)
    target = torch.full((16,), 5.0)
    w.tensor_register(target)
    with pytest.raises(ValueError, match="already holds a tensor on rank 0, 1, 2"):
        w.tensor_register(target)
    peer = (rank + 1) % size
    bad = [
        (lambda: w.put(torch.ones(4), peer, 13, False), "4 elements at element offset 13 do not "
                                                        "fit in the 16 elements"),
        (lambda: w.put(torch.ones(4), peer, -1, False), "element offset -1"),
        (lambda: w.put(torch.ones(4, dtype=torch.int32), peer, 0, False), "the window's are Float"),
        (lambda: w.put(torch.ones(4), size, 0, False), "dst 3 is not a rank of a group of size 3"),
        (lambda: w.signal(rank, False), "cannot signal itself"),
        (lambda: w.wait_signal(rank, False), "from itself"),
        (lambda: w.map_remote_tensor(peer), "cannot be mapped here: its memory is not shared"),
    ]
    for call, words in bad:
        with pytest.raises(ValueError, match=words):
            call()
    dist.barrier()
    assert torch.equal(target, torch.full((16,), 5.0))  # nothing moved
    w.tensor_deregister()
    with pytest.raises(ValueError, match="holds no tensor"):
        w.put(torch.ones(1), peer, 0, False)


def test_bad_calls_are_refused_before_anything_moves():
    run_ranks(_refusals, 3)


def _late(rank, size):
    group = dist.new_group(backend="ddl", timeout=datetime.timedelta(seconds=1))
    w = torch_ddl.new_window(torch.zeros(4), group)
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(dist.DistBackendError,
                           match="Timed out after 1000 ms waiting for a signal from rank 1"):
            w.wait_signal(1, False)
        assert time.monotonic() - start < 10
    dist.barrier()  # the default group's, whose timeout is long
    # The group goes on after a point-to-point wait timed out.
    w.put(torch.ones(4), 1 - rank, 0, False)
    w.signal(1 - rank, False)
    w.wait_signal(1 - rank, False)
    w.tensor_deregister()


def test_a_signal_that_never_comes_times_out_naming_the_peer():
    run_ranks(_late, 2)


def _dies(rank, size, store):
    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    w = torch_ddl.new_window(torch.zeros(1 << 10))
    if rank == 1:
        os._exit(3)
    start = time.monotonic()
    with pytest.raises(dist.DistNetworkError, match="rank 1"):
        w.wait_signal(1, False)
    # Found by the peer's exit, long before the 60 s timeout.
    assert time.monotonic() - start < 15, time.monotonic() - start
    os._exit(0)


def test_a_peer_that_dies_fails_the_wait_naming_it():
    with tempfile.TemporaryDirectory() as tmp:
        run_spawned(_dies, 2, (2, os.path.join(tmp, "store")), [0, 3], timeout=90)


def _not_adopted(rank, size):
    seen = every_round(rank, size, [(1 << 18) + 3], dtypes=[torch.float32], memories=["block"])
    assert seen["block"] == {"put"}, seen
    assert torch_ddl._C.adopted_buffers() == 0


@pytest.mark.skipif(SANITIZED, reason=NO_GLIBC_BLOCKS)
def test_share_tensors_off_leaves_a_windows_tensor_where_it_is(monkeypatch):
    monkeypatch.setenv("TORCH_DDL_SHARE_TENSORS", "0")
    run_ranks(_not_adopted, 2)


def _subgroup(rank, size):
    # Ranks are the group's: global ranks 1 and 2 are its 0 and 1.
    group = dist.new_group([1, 2], backend="ddl")
    if rank == 0:
        return
    me = rank - 1
    t = torch.zeros(4)
    w = torch_ddl.new_window(t, group)
    w.put(torch.full((2,), float(rank)), 1 - me, 2 * me, False)
    w.signal(1 - me, False)
    w.wait_signal(1 - me, False)
    other = 3 - rank
    assert t.tolist() == ([float(other)] * 2 + [0.0] * 2 if me == 1 else
                          [0.0] * 2 + [float(other)] * 2), t
    with pytest.raises(ValueError, match="dst 2 is not a rank of a group of size 2"):
        w.put(torch.ones(1), 2, 0, False)
    w.tensor_deregister()


def test_a_window_on_a_subgroup_speaks_its_ranks():
    run_ranks(_subgroup, 3)


def _dropped(rank, size, log):
    import gc

    w = torch_ddl.new_window(torch.zeros(1 << 10))
    if rank == 0:
        del w
        gc.collect()
    dist.barrier()
    if rank == 1:
        # Rank 0's tensor is still registered: the put lands in memory it keeps.
        w.put(torch.ones(8), 0, 0, False)
        w.signal(0, False)
        del w  # (tensor_deregister is collective: rank 0 cannot join it)
    dist.barrier()
    if rank == 0:
        with open(log) as f:
            text = f.read()
        assert "was dropped while it held a tensor" in text, text


@pytest.mark.skipif(SANITIZED, reason=NO_GLIBC_BLOCKS)
def test_a_window_dropped_while_registered_keeps_its_tensor(monkeypatch, tmp_path):
    log = str(tmp_path / "ddl.log")
    monkeypatch.setenv("TORCH_DDL_DEBUG", "WARN")
    monkeypatch.setenv("TORCH_DDL_DEBUG_FILE", log)
    run_ranks(_dropped, 2, log)


def _own_view(rank, size):
    import gc

    # The window owns the tensor (nothing else refers to it): this rank's own view stays valid
    # after tensor_deregister, as the docs promise (before, it viewed memory freed with it).
    n = 1 << 20  # 4 MiB: glibc maps a block of its own, unmapped once freed
    w = torch_ddl.new_window()
    w.tensor_register(torch.full((n,), float(rank + 7)))
    view = w.map_remote_tensor(rank)
    assert view.shape == (n,)
    w.tensor_deregister()
    gc.collect()
    junk = [torch.full((n,), -1.0) for _ in range(4)]  # would take the freed block's place
    assert float(view[0]) == rank + 7 and float(view[-1]) == rank + 7
    assert bool((view == rank + 7).all())
    del junk


def test_this_ranks_own_view_outlives_deregistration():
    run_ranks(_own_view, 2)


def _failed_deregistration(rank, size):
    # Rank 1 never deregisters: rank 0's tensor_deregister fails, and its tensor stays registered
    # and alive (a peer may still put into it): rank 1's put lands, and rank 0 reads it.
    group = dist.new_group(backend="ddl", timeout=datetime.timedelta(seconds=1))
    w = torch_ddl.new_window(torch.zeros(16), group)
    if rank == 0:
        with pytest.raises(RuntimeError, match="stays registered"):
            w.tensor_deregister()
        assert w.map_remote_tensor(0).shape == (16,)
    dist.barrier()
    # The window's group failed with the timeout; the tensor is still there to read.
    if rank == 0:
        assert bool((w.map_remote_tensor(0) == 0).all())


def test_a_failed_deregistration_keeps_the_tensor():
    run_ranks(_failed_deregistration, 2)


def _torch_api(rank, size):
    assert dist.group.WORLD.supports_window if hasattr(dist.group.WORLD, "supports_window") else True
    w = dist._new_window(torch_ddl.empty_shared(8))
    assert isinstance(w, torch_ddl._C.Window)
    from torch._C._distributed_c10d import PutOptions, WaitSignalOptions, WindowAccessType
    w.map_remote_tensor(rank).fill_(0)
    dist.barrier()
    peer = 1 - rank
    w.put(torch.full((4,), float(rank + 1)), peer, 4, False, PutOptions())
    w.signal(peer, False)
    opts = WaitSignalOptions()
    opts.timeout = datetime.timedelta(seconds=30)
    w.wait_signal(peer, False, opts)
    assert w.map_remote_tensor(rank).tolist() == [0.0] * 4 + [float(peer + 1)] * 4
    assert w.get_attr(peer).access_type == WindowAccessType.UNIFIED
    w.tensor_deregister()


@pytest.mark.skipif(not hasattr(dist, "_new_window"),
                    reason=f"torch {torch.__version__} has no one-sided windows (2.14 adds them)")
def test_torch_window_api():
    run_ranks(_torch_api, 2)
