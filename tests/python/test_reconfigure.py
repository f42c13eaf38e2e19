"""torch 2.14's fault-tolerance API on a ddl group: dist._reconfigure forms the group again from
the processes' handles (survivors after a rank was killed, then a grown set), without a store and
without restarting anyone; abort hooks run on the group's first failure and in abort(). Skipped
under a torch without these calls (2.13)."""

import os
import signal
import tempfile
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from ddl_testing import run_spawned, shrunk_collectives

pytestmark = pytest.mark.skipif(not hasattr(dist, "_reconfigure"),
                                reason="torch before 2.14 has no reconfigure")


def _init(rank, size, store):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ddl  # noqa: F401

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=60))
    assert dist._supports_reconfigure()
    handle = dist._get_reconfigure_handle()
    # Out of band, as a job's manager would: here through the default group's store.
    kv = dist.distributed_c10d._get_default_store()
    kv.set(f"handle/{rank}", handle)
    return [kv.get(f"handle/{r}").decode() for r in range(size)]


def _survivors(rank, size, store):
    handles = _init(rank, size, store)
    pg = dist.group.WORLD
    called, lock = [], threading.Lock()

    def hook():
        with lock:
            called.append(time.monotonic())
    pg.register_abort_hook(7, hook)
    pg.register_abort_hook(8, lambda: None)
    pg.unregister_abort_hook(8)
    with pytest.raises(RuntimeError, match="registered already"):
        pg.register_abort_hook(7, hook)
    x = torch.ones(1 << 18)
    for _ in range(3):
        dist.all_reduce(x)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    with pytest.raises(RuntimeError, match="rank 2 is gone"):
        for _ in range(100000):
            dist.all_reduce(x)
    deadline = time.monotonic() + 10
    while not called and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(called) == 1, called  # once, after the group's first failure
    # The survivors form the group again, in the order listed: rank 1 becomes rank 0.
    start = time.monotonic()
    dist._reconfigure(uuid=11, handles=[handles[1], handles[0]]).wait()
    took = time.monotonic() - start
    assert took < 1.0, f"reconfigure took {took:.2f} s"
    print(f"reconfigure took {took * 1e3:.1f} ms")
    new_rank = 1 - rank
    assert dist.get_rank() == new_rank and dist.get_world_size() == 2
    shrunk_collectives(2, new_rank, None)
    with pytest.raises(ValueError, match="uuid 11 was used before"):
        dist._reconfigure(uuid=11, handles=[handles[1], handles[0]])
    time.sleep(0.2)
    assert len(called) == 1, called  # the new group did not fail
    dist.destroy_process_group()


def _regrow(rank, size, store):
    handles = _init(rank, size, store)
    kv = dist.distributed_c10d._get_default_store()
    # Ranks 0 and 1 go on as a pair (a set: the backend orders it); rank 2 waits.
    if rank < 2:
        dist._reconfigure(uuid=1, handles={handles[0], handles[1]}).wait()
        assert dist.get_world_size() == 2
        pair_rank = dist.get_rank()
        shrunk_collectives(2, pair_rank, None)
        kv.set(f"pair/{rank}", str(pair_rank))
    kv.wait([f"pair/{r}" for r in range(2)])
    assert sorted(int(kv.get(f"pair/{r}")) for r in range(2)) == [0, 1]
    # All three form the group again, in the list's order.
    dist._reconfigure(uuid=2, handles=handles).wait()
    assert dist.get_rank() == rank and dist.get_world_size() == size
    gloo = dist.new_group(backend="gloo")
    shrunk_collectives(size, rank, gloo)
    # A process given another uuid than the others: every one is told.
    with pytest.raises(RuntimeError, match="uuid 4.*uuid 5|uuid 5.*uuid 4"):
        dist._reconfigure(uuid=5 if rank == 1 else 4, handles=handles).wait()
    with pytest.raises(RuntimeError, match="not a ddl reconfigure handle"):
        dist._reconfigure(uuid=6, handles=["ddl1:zz"])
    with pytest.raises(RuntimeError, match="not among"):
        dist._reconfigure(uuid=7, handles=[h for r, h in enumerate(handles) if r != rank])
    dist.barrier(group=gloo)
    # abort() runs the hooks first, then fails the group.
    called = []
    dist.group.WORLD.register_abort_hook(1, lambda: called.append(1))
    dist.group.WORLD.abort()
    assert called == [1]
    with pytest.raises(RuntimeError, match="aborted"):
        dist.all_reduce(torch.ones(3))


def _apart(rank, size, folder):
    """Two processes, each first a group of its own (as newcomers to a grown set are), one with
    another TORCH_DDL_STAGED_BYTES, are asked to form one group: both refuse before a message."""
    if rank == 1:
        os.environ["TORCH_DDL_STAGED_BYTES"] = "4096"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch_ddl  # noqa: F401

    dist.init_process_group("ddl", init_method=f"file://{folder}/store{rank}", rank=0,
                            world_size=1, timeout=timedelta(seconds=60))
    mine = os.path.join(folder, f"handle{rank}")
    with open(mine + ".tmp", "w") as f:
        f.write(dist._get_reconfigure_handle())
    os.rename(mine + ".tmp", mine)
    deadline = time.monotonic() + 60
    paths = [os.path.join(folder, f"handle{r}") for r in range(size)]
    while not all(os.path.exists(p) for p in paths):
        assert time.monotonic() < deadline, "the other process published no handle"
        time.sleep(0.01)
    handles = [open(p).read() for p in paths]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="TORCH_DDL_STAGED_BYTES is 4096 for handle 1 and "
                                           "524288 for handle 0"):
        dist._reconfigure(uuid=3, handles=handles).wait()
    assert time.monotonic() - start < 1.0
    # Each goes on with the group it had.
    x = torch.ones(5)
    dist.all_reduce(x)
    assert torch.equal(x, torch.ones(5))
    dist.destroy_process_group()


def test_processes_whose_settings_differ_are_refused_naming_the_setting():
    with tempfile.TemporaryDirectory() as tmp:
        run_spawned(_apart, 2, (2, tmp), [0, 0])


def _run(fn, size, want):
    with tempfile.TemporaryDirectory() as tmp:
        run_spawned(fn, size, (size, os.path.join(tmp, "store")), want)


def test_survivors_of_a_killed_rank_reconfigure_and_go_on_and_abort_hooks_run_once():
    _run(_survivors, 3, [0, 0, -signal.SIGKILL])


def test_a_pair_reconfigures_then_the_three_form_the_group_again():
    _run(_regrow, 3, [0, 0, 0])
