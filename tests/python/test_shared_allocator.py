"""TORCH_DDL_SHARED_ALLOCATOR=1: torch's CPU tensors of at least TORCH_DDL_DIRECT_MIN_BYTES come
from shared memory, so that their allreduces take the direct path; results match gloo's, a
forked child gets its own copy, and a bad setting is refused at import."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ddl_testing import assert_same, run_ranks

# Elements: 64 KiB of float32 (the allocator's smallest) and up, primes among them.
SIZES = [16384, 16411, 65537, 262147, 1 << 20]


def _random(n, dtype, gen):
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=gen, dtype=dtype)


def _direct_forced(rank, size):
    import torch_ddl

    info = torch_ddl._C.shared_allocator()
    assert info["installed"] and info["min_bytes"] == 65536, info
    gloo = dist.new_group(backend="gloo")
    gen = torch.Generator().manual_seed(rank)
    for dtype in (torch.float32, torch.float64, torch.int32):
        for n in SIZES:
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                t = _random(n, dtype, gen)
                want = t.clone()
                # TORCH_DDL_ALLREDUCE_ALGO=direct: refused unless every rank's tensor is shared.
                dist.all_reduce(t, op=op)
                dist.all_reduce(want, op=op, group=gloo)
                assert_same(t, want, f"{dtype} x {n} {op}")
    # A view inside a larger allocation lies in shared memory too.
    big = torch.full((1 << 18,), float(rank + 1))
    view = big[1000:1000 + 20011]
    dist.all_reduce(view)
    assert bool((view == size * (size + 1) / 2).all()) and float(big[999]) == rank + 1
    # Below the allocator's size a tensor is private: refused on every rank, naming them all,
    # before any byte moves; the group goes on.
    small = torch.ones(1000)
    with pytest.raises(RuntimeError, match=r"tensor of rank\(s\) 0, 1.* is not in a shared"):
        dist.all_reduce(small)
    assert float(small[0]) == 1.0
    t = torch.ones(16384)
    dist.all_reduce(t)
    assert float(t.sum()) == size * 16384


@pytest.mark.parametrize("size", [2, 3])
def test_its_tensors_take_the_direct_path_and_match_gloo(size, monkeypatch):
    monkeypatch.setenv("TORCH_DDL_SHARED_ALLOCATOR", "1")
    monkeypatch.setenv("TORCH_DDL_ALLREDUCE_ALGO", "direct")
    run_ranks(_direct_forced, size)


def _auto_mixed(rank, size):
    import torch_ddl

    gloo = dist.new_group(backend="gloo")
    gen = torch.Generator().manual_seed(10 + rank)
    private = torch.from_numpy(np.zeros(200003, dtype=np.float32))  # numpy's memory: not shared
    whole = torch.zeros(300007)
    cases = [("private", private), ("view", whole[7:100007])]
    for n in [1, 1000, 16384, 100003, 3000, 1 << 20, 65536, 5, 262147]:
        cases.append((f"{n}", torch.empty(n)))
    for round_ in range(2):
        for name, t in cases:
            t.copy_(torch.randn(t.numel(), generator=gen))
            want = t.clone()
            dist.all_reduce(t)
            dist.all_reduce(want, group=gloo)
            assert_same(t, want, f"round {round_}, {name}")
    info = torch_ddl._C.shared_allocator()
    assert info["blocks"] >= 6 and info["segments"] >= 1, info


@pytest.mark.parametrize("size", [2, 3])
def test_shared_and_private_tensors_mixed_match_gloo(size, monkeypatch):
    monkeypatch.setenv("TORCH_DDL_SHARED_ALLOCATOR", "1")
    run_ranks(_auto_mixed, size)


FORK = """
import os, torch, torch_ddl
t = torch.ones(1 << 16)
assert torch_ddl._C.shared_allocator()["blocks"] == 1
pid = os.fork()
if pid == 0:
    t.fill_(7.0)
    u = torch.ones(1 << 16)  # the child's own allocator: torch's again
    ok = float(t[5]) == 7.0 and float(u.sum()) == 1 << 16
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert status == 0, status
assert bool((t == 1.0).all()), "the child's writes reached the parent"
t.fill_(3.0)
assert float(t.sum()) == 3 * (1 << 16)
print("ok")
"""


def test_a_forked_child_writes_its_own_copy():
    # One thread: torch's OpenMP pool, once used, hangs a forked child whatever the allocator.
    env = {**os.environ, "TORCH_DDL_SHARED_ALLOCATOR": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", FORK], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_a_bad_setting_is_refused_at_import_naming_it():
    env = {**os.environ, "TORCH_DDL_SHARED_ALLOCATOR": "yes"}
    out = subprocess.run([sys.executable, "-c", "import torch_ddl"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "TORCH_DDL_SHARED_ALLOCATOR=yes" in out.stderr, \
        out.stderr[-2000:]


def _ddp_buckets(rank, size):
    import torch_ddl
    from test_ddp import _train_wide

    gloo = dist.new_group(backend="gloo")
    got = _train_wide(dist.group.WORLD, 8, rank)
    # The buckets came from the arena: nothing was adopted.
    assert torch_ddl._C.adopted_buffers() == 0
    assert torch_ddl._C.shared_allocator()["blocks"] > 0
    want = _train_wide(gloo, 8, rank)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-5), (
            f"P={size}: parameter {i} differs by {(g - w).abs().max().item()}")


def test_ddp_over_its_tensors_matches_gloo(monkeypatch):
    monkeypatch.setenv("TORCH_DDL_SHARED_ALLOCATOR", "1")
    run_ranks(_ddp_buckets, 2)


def _window_rounds(rank, size):
    import torch_ddl
    from window_checks import every_round

    # Ordinary tensors of 64 KiB and more lie in the arena: every peer on the host maps them.
    seen = every_round(rank, size, [(1 << 18) + 3, 20011], dtypes=[torch.float32, torch.float64],
                       memories=["plain"])
    assert seen["plain"] == {"mapped"}, seen
    assert torch_ddl._C.shared_allocator()["segments"] >= 1


@pytest.mark.parametrize("size", [2, 3])
def test_window_puts_into_its_tensors_are_mapped_and_match_send_recv(size, monkeypatch):
    monkeypatch.setenv("TORCH_DDL_SHARED_ALLOCATOR", "1")
    run_ranks(_window_rounds, size)


MIXED = r"""
import os, sys, time
import torch, torch.distributed as dist
import torch_ddl
start = time.monotonic()
try:
    dist.init_process_group("ddl", init_method="file://" + sys.argv[1], rank=int(sys.argv[2]),
                            world_size=2, timeout=__import__("datetime").timedelta(seconds=60))
    # 256 KiB then 768 KiB: after the first, the rank with the allocator asks for the direct path
    # and the other takes the shared-memory ring (at a34e269: each timed out waiting on the other).
    for n in (65536, 196608):
        t = torch.ones(n)
        dist.all_reduce(t)
    print("made", float(t[0]))
except Exception as e:
    print(f"refused after {time.monotonic() - start:.1f} s:", e)
"""


def test_ranks_with_and_without_the_allocator_are_refused_at_creation(tmp_path):
    """The allocator on one rank only lowers its TORCH_DDL_DIRECT_MIN_BYTES: its allreduces of 64
    KiB - 1 MiB ask for the direct path where the other's do not, and the two wait for each other
    until the timeout. Both ranks' group creation fails instead, at once, naming it."""
    store = str(tmp_path / "store")
    procs = []
    for rank in range(2):
        env = {**os.environ, "TORCH_DDL_SHARED_ALLOCATOR": str(1 - rank)}
        env.pop("TORCH_DDL_DIRECT_MIN_BYTES", None)
        procs.append(subprocess.Popen([sys.executable, "-c", MIXED, store, str(rank)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for out, err in outs:
        assert out.startswith("refused after"), out + err[-2000:]
        assert float(out.split()[2]) < 30, out
        assert ("TORCH_DDL_DIRECT_MIN_BYTES is 1048576 on rank 1 and 65536 on rank 0" in out
                and "TORCH_DDL_SHARED_ALLOCATOR=1 makes it 65536" in out), out


GIVE_BACK = r"""
import time, torch, torch_ddl
info = lambda: torch_ddl._C.shared_allocator()
big = [torch.ones(16 << 20) for _ in range(3)]  # 64 MiB each: a segment each
small = torch.ones(1 << 20)                        # 4 MiB in a fourth
assert info()["segments"] == 4, info()
del big
assert info()["given_back"] == 0, info()  # a training step's tensors find their pages again
time.sleep(1.2)
torch.ones(1 << 20)  # the arena's next call looks at its free segments
assert info()["given_back"] == 2 and info()["blocks"] == 1, info()
again = torch.zeros(16 << 20)  # served where memory was kept
assert info()["given_back"] == 2 and float(again.sum()) == 0.0, info()
print("ok")
"""


def test_free_segments_but_one_give_their_memory_back():
    """After a peak, the arena keeps the segments its live tensors hold and one free one; the
    memory of the others goes back to the system once they stayed free for a second."""
    env = {**os.environ, "TORCH_DDL_SHARED_ALLOCATOR": "1"}
    out = subprocess.run([sys.executable, "-c", GIVE_BACK], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
