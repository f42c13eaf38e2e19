"""dist.shrink_group on a ddl group: the survivors of a rank killed mid-allreduce form a group by
themselves within a second, and its collectives equal gloo's on the survivors; ranks asked for
different groups get an error naming who was asked what. split_group: subsets of a group form
groups of their own through ddl's split, without the store."""

import os
import signal
import tempfile
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from ddl_testing import fault_call, random_fault, run_spawned, shrunk_collectives

TIMEOUT = timedelta(seconds=60)


def _survivor(rank, size, victim, store, stamp, flags, op="all_reduce", before=3, pause_us=0):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ddl  # noqa: F401

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=TIMEOUT)
    call = fault_call(op, size)
    for _ in range(before):
        call()
    if rank == victim:
        time.sleep(pause_us / 1e6)  # the others are somewhere inside their next op
        with open(stamp, "w") as f:
            f.write("dead")
        os.kill(os.getpid(), signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"rank {victim} is gone"):
        for _ in range(100000):
            call()
    failed = time.monotonic()
    group = dist.shrink_group([victim], shrink_flags=flags)
    took = time.monotonic() - failed
    assert took < 1.0, f"shrink_group took {took:.2f} s"
    assert dist.get_world_size() == size - 1 and group.size() == size - 1
    new_rank = rank - (rank > victim)
    assert dist.get_rank() == new_rank
    gloo = dist.new_group(backend="gloo")
    shrunk_collectives(size - 1, new_rank, gloo)
    # torch registers a shrunk group's backend as gloo's; torch_ddl makes it CUSTOM again, so
    # that DDP (whose logger reads gloo's options out of a "gloo" backend) works on it.
    assert group._get_backend_name() == "custom", group._get_backend_name()
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    dist.destroy_process_group()


def _run(fn, size, *args, want=None):
    shm_before = set(os.listdir("/dev/shm"))
    with tempfile.TemporaryDirectory() as tmp:
        run_spawned(fn, size, (size, *args[:1], os.path.join(tmp, "store"),
                               os.path.join(tmp, "stamp"), *args[1:]), want)
    left = set(os.listdir("/dev/shm")) - shm_before
    assert not left, f"left in /dev/shm: {sorted(left)}"


@pytest.mark.parametrize("size,victim,flags", [(3, 1, 0), (4, 0, 1), (4, 3, 0)])
def test_survivors_of_a_killed_rank_shrink_and_go_on(size, victim, flags):
    want = [0] * size
    want[victim] = -signal.SIGKILL
    _run(_survivor, size, victim, flags, want=want)


SHRINK_TRIALS = int(os.environ.get("DDL_SHRINK_TRIALS", "3"))


@pytest.mark.parametrize("trial", range(SHRINK_TRIALS))
def test_random_kill_then_shrink_and_twenty_collectives(trial):
    seed, size, _, op, _, victim, before, pause_us = random_fault(trial + 500, [3, 4])
    flags = trial % 2
    print(f"seed {seed}: rank {victim} of {size} killed after {before} x {op} + {pause_us} us,"
          f" shrink flags {flags}")
    want = [0] * size
    want[victim] = -signal.SIGKILL
    _run(_survivor, size, victim, flags, op, before, pause_us, want=want)


def _disagree(rank, size, _unused, store, stamp):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch_ddl  # noqa: F401

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=5))
    dist.barrier()
    if rank == 3:
        return  # excluded by ranks 0 - 2: it does not call shrink_group
    asked = [3] if rank != 2 else [3, 1]
    if rank == 1 and asked != [3]:
        pass
    with pytest.raises(RuntimeError) as error:
        dist.shrink_group(asked)
    message = str(error.value)
    if rank == 0:
        assert "asked for different groups" in message and "exclude 1, 3" in message, message


def test_ranks_asked_for_different_groups_fail_naming_the_difference():
    _run(_disagree, 4, None, want=[0, 0, 0, 0])


def _other_leader(rank, size, outcomes, store, stamp):
    """Views that differ in who leads the new group: ranks 0 and 1 exclude rank 3 (a group led
    by rank 0), ranks 2 and 3 exclude rank 0 (led by rank 1); or, with `disjoint`, two pairs
    that each exclude the other. The ranks left out are told at once: nobody waits for the 60 s
    timeout, and the two views never both become working groups. Of two disjoint halves the one
    without rank 0 holds no quorum and fails before it sends anything."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch_ddl  # noqa: F401

    disjoint = os.path.basename(outcomes) == "disjoint"
    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=TIMEOUT)
    dist.barrier()
    if disjoint:
        asked = [2, 3] if rank < 2 else [0, 1]
    else:
        asked = [3] if rank < 2 else [0]
    start = time.monotonic()
    try:
        dist.shrink_group(asked)
        outcome = "formed"
    except RuntimeError as error:
        outcome = f"failed {time.monotonic() - start:.3f} {error}"
    with open(os.path.join(outcomes, str(rank) + ".tmp"), "w") as f:
        f.write(outcome)
    os.rename(os.path.join(outcomes, str(rank) + ".tmp"), os.path.join(outcomes, str(rank)))
    deadline = time.monotonic() + 30  # every rank has its outcome before any exits
    while len(os.listdir(outcomes)) < size and time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(0)  # a group formed on one side may have a peer that failed: no teardown


@pytest.mark.parametrize("case", ["overlapping", "disjoint"])
def test_views_that_differ_in_their_leader_fail_at_once_and_never_form_two_groups(case):
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = os.path.join(tmp, case)
        os.mkdir(outcomes)
        _run(_other_leader, 4, outcomes, want=[0, 0, 0, 0])
        got = {}
        for rank in range(4):
            with open(os.path.join(outcomes, str(rank))) as f:
                got[rank] = f.read()
    for rank, outcome in got.items():
        if outcome == "formed":
            continue
        took = float(outcome.split()[1])
        assert took < 5, f"rank {rank}: {outcome}"
        if case == "disjoint" and rank >= 2:
            assert "are no quorum" in outcome, outcome
        else:
            assert "asked for different groups" in outcome and "exclude" in outcome, outcome
    sides = [(0, 1), (2, 3)]
    formed = [all(got[r] == "formed" for r in side) for side in sides]
    assert not all(formed), got
    if case == "overlapping":  # neither view can form without a rank of the other
        assert not any(formed), got


def _stale(rank, size, _unused, store, stamp):
    """Ranks 2 and 3 die; the survivors first ask to exclude rank 2 only (a view that still has
    the dead rank 3): they fail within seconds naming rank 3, not at the 60 s timeout, and then
    shrink with both excluded and go on."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch_ddl  # noqa: F401

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=TIMEOUT)
    dist.barrier()
    if rank >= 2:
        os.kill(os.getpid(), signal.SIGKILL)
    with pytest.raises(RuntimeError, match="is gone"):
        for _ in range(100000):
            dist.all_reduce(torch.ones(1 << 16))
    time.sleep(0.5)  # both are dead by now
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 3 is gone") as error:
        dist.shrink_group([2])
    took = time.monotonic() - start
    assert took < 5, f"{took:.1f} s: {error.value}"
    group = dist.shrink_group([2, 3])
    assert group.size() == 2 and dist.get_rank() == rank
    shrunk_collectives(2, rank, None)
    dist.destroy_process_group()


def test_a_view_that_still_has_a_dead_rank_fails_at_once_naming_it():
    _run(_stale, 4, None, want=[0, 0, -signal.SIGKILL, -signal.SIGKILL])


def _bad_arguments(rank, size, _unused, store, stamp):
    import torch_ddl  # noqa: F401

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size)
    with pytest.raises((ValueError, RuntimeError), match="out of bounds|not a rank"):
        dist.shrink_group([5])
    with pytest.raises((ValueError, RuntimeError), match="[Dd]uplicate|twice"):
        dist.shrink_group([1, 1])
    dist.barrier()  # nothing was sent: the group goes on
    dist.destroy_process_group()


def test_bad_arguments_fail_before_anything_moves():
    _run(_bad_arguments, 2, None, want=[0, 0])


def _split(rank, size, _unused, store, stamp):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ddl  # noqa: F401

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=TIMEOUT)
    world = dist.group.WORLD
    assert world._get_backend(torch.device("cpu")).supports_splitting
    halves = [[0, 1], [2, 3]]
    gloo = [dist.new_group(h, backend="gloo") for h in halves]
    mine = halves[rank // 2]
    # What dist.split_group calls (it asks for an accelerator before it gets there).
    sub = world.split_group(mine, timeout=None, opts=None, group_name=f"half{rank // 2}",
                            group_desc="split")
    assert sub is not None and sub.size() == 2 and sub.rank() == rank % 2
    assert sub._get_backend(torch.device("cpu")).name() == "ddl"
    shrunk_collectives(2, rank % 2, gloo[rank // 2], ddl=sub)
    # Three of four, the fourth not taking part.
    if rank != 1:
        trio = world.split_group([0, 2, 3], timeout=None, opts=None, group_name="trio",
                                 group_desc="split")
        t = torch.full((5,), float(rank + 1))
        trio.allreduce([t]).wait()
        assert torch.equal(t, torch.full((5,), 1.0 + 3 + 4)), t
    dist.barrier()
    dist.destroy_process_group()


def test_split_forms_subgroups_through_ddl():
    _run(_split, 4, None, want=[0, 0, 0, 0])
