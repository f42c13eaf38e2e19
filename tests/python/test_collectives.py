"""Every collective x op x dtype over 'ddl' against gloo (or, where gloo lacks the op/dtype,
a reference computed from every rank's input), at world sizes 1 to 4."""

import warnings

import pytest
import torch
import torch.distributed as dist

from ddl_testing import (ALL_TYPES, OPS, SIZES, WORLD_SIZES, assert_same, ddl_groups_with,
                         glibc_block, make_input, reference, run_ranks, valid)


def _allreduce_all(rank, size):
    gloo = dist.new_group(backend="gloo")
    checked = 0
    for op_name, op in OPS.items():
        for dtype in ALL_TYPES:
            for n in SIZES:
                x = make_input(dtype, op_name, rank, size, n)
                what = f"all_reduce {op_name} {dtype} n={n} P={size}"
                if not valid(dtype, op_name):
                    with pytest.raises(ValueError, match=op_name):
                        dist.all_reduce(x.clone(), op=op)
                    continue
                got = x.clone()
                dist.all_reduce(got, op=op)
                want = x.clone()
                try:
                    dist.all_reduce(want, op=op, group=gloo)
                except (RuntimeError, ValueError):
                    want = reference(dtype, op_name, size, n)  # gloo lacks this op/dtype
                assert_same(got, want, what)
                assert_same(got, reference(dtype, op_name, size, n), what + " (reference)")
                checked += 1
    assert checked > 300


def _broadcast_and_gather(rank, size):
    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor is deprecated in 2.13
    gloo = dist.new_group(backend="gloo")
    for dtype in ALL_TYPES:
        for n in SIZES:
            for root in range(size):
                x = make_input(dtype, "SUM", rank, size, n)
                got, want = x.clone(), x.clone()
                dist.broadcast(got, src=root)
                try:
                    dist.broadcast(want, src=root, group=gloo)
                except RuntimeError:
                    want = make_input(dtype, "SUM", root, size, n)  # gloo lacks this dtype
                assert_same(got, want, f"broadcast {dtype} n={n} root={root}")
                assert_same(got, make_input(dtype, "SUM", root, size, n), "broadcast (reference)")
            x = make_input(dtype, "SUM", rank, size, n)
            outs = [torch.full_like(x, 3) for _ in range(size)]
            dist.all_gather(outs, x)
            want = [make_input(dtype, "SUM", r, size, n) for r in range(size)]
            for r in range(size):
                assert_same(outs[r], want[r], f"all_gather {dtype} n={n} block {r}")
            flat = torch.empty(size * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, x)
            assert_same(flat, torch.cat(want), f"all_gather_into_tensor {dtype} n={n}")
            stacked = torch.empty(size, n, dtype=dtype)
            gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
            gather_single(stacked, x)
            assert_same(stacked, torch.stack(want), f"all_gather_into_tensor 2-D {dtype} n={n}")
    dist.barrier()


def _non_contiguous_and_async(rank, size):
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10) + rank
    want = sum(torch.arange(60, dtype=torch.float32).reshape(6, 10) + r for r in range(size))
    t = base.t()  # non-contiguous view
    assert not t.is_contiguous()
    dist.all_reduce(t)
    assert_same(t, want.t(), "all_reduce of a transposed view")
    strided = (torch.arange(40, dtype=torch.int64) * (rank + 1))[::3]
    dist.all_reduce(strided, op=dist.ReduceOp.MAX)
    assert_same(strided, (torch.arange(40, dtype=torch.int64) * size)[::3], "strided MAX")
    b = torch.full((5, 4), float(rank)).t()
    dist.broadcast(b, src=size - 1)
    assert_same(b, torch.full((4, 5), float(size - 1)), "broadcast into a view")
    outs = [torch.zeros(3, 2).t() for _ in range(size)]
    dist.all_gather(outs, torch.full((2, 3), float(rank)))
    for r in range(size):
        assert_same(outs[r], torch.full((2, 3), float(r)), "all_gather into views")

    # async_op: returns at once, overlaps with compute, completes with the output tensors.
    x = torch.ones(1 << 18) * (rank + 1)
    work = dist.all_reduce(x, async_op=True)
    busy = torch.randn(256, 256) @ torch.randn(256, 256)  # compute while it runs
    fut = work.get_future()
    work.wait()
    assert work.is_completed() and work.is_success()
    assert busy.shape == (256, 256)
    value = fut.wait()
    assert isinstance(value, list) and value[0] is x or torch.equal(value[0], x)
    assert_same(x, torch.full((1 << 18,), float(size * (size + 1) // 2)), "async all_reduce")
    chained = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    assert_same(chained.wait(), torch.full((4,), 2.0 * size), "future.then")
    works = [dist.all_reduce(torch.full((1000,), float(i)), async_op=True) for i in range(8)]
    for i, w in enumerate(works):
        w.wait()
        assert_same(w.result()[0], torch.full((1000,), float(i * size)), f"in-flight #{i}")
    assert dist.barrier(async_op=True).wait()


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_all_reduce_matches_gloo(size):
    run_ranks(_allreduce_all, size)


def _sweep_against_gloo(rank, size, dtypes, op_names, allocate, label):
    """all_reduce of `allocate(dtype, n)` filled with this rank's input, against gloo."""
    gloo = dist.new_group(backend="gloo")
    for dtype in dtypes:
        for op_name in op_names:
            if not valid(dtype, op_name):
                continue
            for n in (1, 7, 70001, (1 << 20) + 3):
                x = make_input(dtype, op_name, rank, size, n)
                got, want = allocate(dtype, n).copy_(x), x.clone()
                dist.all_reduce(got, op=OPS[op_name])
                try:
                    dist.all_reduce(want, op=OPS[op_name], group=gloo)
                except (RuntimeError, ValueError):
                    want = reference(dtype, op_name, size, n)
                assert_same(got, want, f"{label} {op_name} {dtype} n={n} P={size}")


def _allreduce_algorithm(rank, size):
    _sweep_against_gloo(rank, size, (torch.float32, torch.bfloat16, torch.int64, torch.uint8),
                        ("SUM", "AVG", "MAX"), lambda dtype, n: torch.empty(n, dtype=dtype),
                        "all_reduce")
    # In flight at once: the shared-memory ring serves them one after another.
    works = [dist.all_reduce(torch.full((300007 + i,), float(i)), async_op=True) for i in range(6)]
    for i, w in enumerate(works):
        w.wait()
        assert_same(w.result()[0], torch.full((300007 + i,), float(i * size)), f"in flight #{i}")


def _same_bits_everywhere(rank, size):
    gloo = dist.new_group(backend="gloo")
    # MAX of NaN and 1 is NaN one way round and 1 the other; of -0.0 and +0.0, the first.
    kinds = torch.tensor([float("nan"), 1.0, -0.0, 0.0])
    for n in (1, 7, 1031, 300007):
        for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN):
            x = kinds[(torch.arange(n) + rank) % 4]
            dist.all_reduce(x, op=op)
            everyone = [torch.empty(n, dtype=torch.int32) for _ in range(size)]
            dist.all_gather(everyone, x.view(torch.int32), group=gloo)
            for r, theirs in enumerate(everyone):
                assert torch.equal(theirs, everyone[0]), f"{op} of {n}: rank {r} differs from 0"


@pytest.mark.parametrize("size", [2, 3, 4])
def test_every_rank_ends_with_the_same_bits_where_the_order_of_operands_matters(size):
    run_ranks(_same_bits_everywhere, size)


@pytest.mark.parametrize("algo", ["shm_ring", "staged", "ring"])
@pytest.mark.parametrize("size", [2, 3])
def test_all_reduce_algorithm_matches_gloo(size, algo, monkeypatch):
    # shm_ring and staged fail rather than fall back: passing proves the shared-memory path ran
    # (staged: 2^20 + 3 float32 in three pieces of at most TORCH_DDL_STAGED_BYTES).
    monkeypatch.setenv("TORCH_DDL_ALLREDUCE_ALGO", algo)
    monkeypatch.setenv("TORCH_DDL_SEGMENT_BYTES", "65536")  # many segments per chunk
    run_ranks(_allreduce_algorithm, size)


def _allreduce_shared(rank, size):
    import torch_ddl

    def allocate(dtype, n):
        # A view five elements into a shared buffer, as well as whole buffers.
        if n == 7:
            return torch_ddl.empty_shared(n + 5, dtype=dtype)[5:]
        return torch_ddl.empty_shared(n, dtype=dtype)

    _sweep_against_gloo(rank, size,
                        (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool),
                        ("SUM", "AVG", "MAX", "PRODUCT", "BAND"), allocate, "shared all_reduce")
    # A 2-D tensor, ops in flight on several, and twice on one before any wait.
    grid = torch_ddl.empty_shared(301, 997)
    grid.fill_(rank + 1.0)
    works = [dist.all_reduce(grid, async_op=True)]
    flat = [torch_ddl.empty_shared(300007 + i).fill_(float(i + 1)) for i in range(4)]
    works += [dist.all_reduce(t, async_op=True) for t in flat]
    works.append(dist.all_reduce(flat[0], async_op=True))
    for w in works:
        w.wait()
    total = size * (size + 1) / 2
    assert_same(grid, torch.full((301, 997), total), "2-D shared tensor")
    assert_same(flat[0], torch.full((300007,), float(size * size)), "twice on one tensor")
    for i, t in enumerate(flat[1:], start=1):
        assert_same(t, torch.full((300007 + i,), float((i + 1) * size)), f"in flight #{i}")


@pytest.mark.parametrize("size", [1, 2, 3])
def test_all_reduce_on_shared_tensors_matches_gloo(size, monkeypatch):
    # direct fails rather than fall back: passing proves the direct path ran.
    monkeypatch.setenv("TORCH_DDL_ALLREDUCE_ALGO", "direct")
    run_ranks(_allreduce_shared, size)


def _small_shared_in_one_step(rank, size):
    import json

    import torch_ddl

    gloo = dist.new_group(backend="gloo")
    group = dist.new_group(backend="ddl")  # one that only ever reduces shared tensors
    gen = torch.Generator().manual_seed(rank)
    counts = lambda: json.loads(torch_ddl._C.stats_json())  # noqa: E731
    before = counts()
    calls = 0
    for n in [1, 7, 1000, 8191]:  # 8191 float32 at 3 ranks: 64 KiB read per rank
        t = torch_ddl.empty_shared(n)
        for _ in range(10):
            t.copy_(torch.randn(n, generator=gen))
            want = t.clone()
            dist.all_reduce(t, group=group)
            dist.all_reduce(want, group=gloo)
            assert_same(t, want, f"shared all_reduce of {n} in one step")
            calls += 1
    after = counts()
    one_step = (after["quick_ops"] - before["quick_ops"]) + (after["handed_ops"] -
                                                               before["handed_ops"])
    # The group's first allreduce sets up its staging buffers; from then on they run in one step,
    # most on the caller's thread or handed from there to an op where a peer is late (the rest
    # in an op from the start, where the group had something in flight: not counted).
    assert one_step >= calls // 2, (one_step, calls)


@pytest.mark.parametrize("size", [2, 3])
def test_small_shared_tensors_are_reduced_in_one_step(size):
    # Before 2026-12-08 a group whose tensors were all shared took the direct path at every
    # size, with its two rounds of messages, and never set up the buffers of the one step.
    run_ranks(_small_shared_in_one_step, size)


def _one_step_as_staged(rank, size):
    gloo = dist.new_group(backend="gloo")
    gen = torch.Generator().manual_seed(20 + rank)
    for n in [1000, 4099]:
        # Values whose sums depend on the order they are added in.
        x = torch.randn(n, generator=gen) * 10.0 ** torch.randint(-6, 7, (n,), generator=gen)
        group = dist.new_group(backend="ddl")  # fresh: its first allreduce sets up and stages
        staged, once = x.clone(), x.clone()
        dist.all_reduce(staged, group=group)
        dist.all_reduce(once, group=group)  # in one step, the buffers being set up
        assert torch.equal(staged, once), f"{n}: the one step and the staged differ"
        want = x.double()
        dist.all_reduce(want, group=gloo)
        torch.testing.assert_close(staged.double(), want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("size", [3, 4])
def test_the_one_step_and_the_staged_allreduce_give_the_same_bits(size):
    # Before 2026-12-08 the one step added every element in rank order and the staged allreduce
    # chunk c from rank c's first: a tensor reduced twice in one process could differ in bits.
    run_ranks(_one_step_as_staged, size)


def _allreduce_reused(rank, size, share):
    import os

    import torch_ddl

    gloo = dist.new_group(backend="gloo")
    n = (1 << 18) + 5  # float32: just above TORCH_DDL_DIRECT_MIN_BYTES (1 MiB)
    # Whole tensors are adopted; a view into a larger storage never is (the rest of the
    # storage is not the op's, and a write to it while the block moved would be lost).
    tensors = [glibc_block(n), glibc_block(n, torch.int64), glibc_block(n + 64)[64:],
               glibc_block(n + 64)[:n]]
    for t in tensors:
        for op_name in ("SUM", "MAX", "SUM"):
            x = make_input(t.dtype, op_name, rank, size, n)
            t.copy_(x)
            want = x.clone()
            dist.all_reduce(t, op=OPS[op_name])
            dist.all_reduce(want, op=OPS[op_name], group=gloo)
            assert_same(t, want, f"reused {op_name} {t.dtype} P={size}")
    adopted = torch_ddl._C.adopted_buffers()
    assert adopted == (2 if share and size > 1 else 0), adopted
    if not adopted:
        return
    # A forked child gets its own copy of an adopted tensor, as of any private memory.
    t = tensors[0]
    before = t.clone()
    child = os.fork()
    if child == 0:
        t.fill_(-1.0)
        os._exit(0 if bool((t == -1.0).all()) else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert_same(t, before, "parent's tensor after the child wrote its copy")
    del tensors, t
    dist.barrier()
    dist.all_reduce(torch.ones(n))  # notices the freed blocks
    assert torch_ddl._C.adopted_buffers() == 0


@pytest.mark.parametrize("share", ["1", "0"])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_all_reduce_of_reused_ordinary_tensors_matches_gloo(size, share, monkeypatch):
    # Large tensors allreduced again are adopted into shared memory (TORCH_DDL_SHARE_TENSORS).
    monkeypatch.setenv("TORCH_DDL_SHARE_TENSORS", share)
    # Every block from 1 MiB up mmapped, whatever the ranks freed before (README: glibc raises
    # its threshold up to 32 MiB as programs free large blocks).
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    run_ranks(_allreduce_reused, size, share == "1")


def test_empty_shared_checks_its_arguments_and_frees_with_the_tensor():
    import torch_ddl

    t = torch_ddl.empty_shared(3, 4, dtype=torch.float64)
    assert t.shape == (3, 4) and t.dtype == torch.float64 and t.is_contiguous()
    t.fill_(2.5)
    assert float(t.sum()) == 30.0
    assert torch_ddl.empty_shared((2, 0)).shape == (2, 0)
    assert torch_ddl.empty_shared(5, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="non-negative"):
        torch_ddl.empty_shared(-1)
    with pytest.raises(TypeError, match="dtype"):
        torch_ddl.empty_shared(4, dtype="float32")
    before = torch_ddl._C.shared_buffers_live()
    views = [torch_ddl.empty_shared(1 << 20)[10:] for _ in range(5)]
    assert torch_ddl._C.shared_buffers_live() == before + 5
    del views
    assert torch_ddl._C.shared_buffers_live() == before


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_broadcast_and_all_gather_match_gloo(size):
    run_ranks(_broadcast_and_gather, size)


def _all_gather_schedules(rank, size):
    groups = ddl_groups_with("TORCH_DDL_ALLGATHER_ALGO", ("ring", "bruck", "auto"))
    gloo = dist.new_group(backend="gloo")
    schedule = {a: g._get_backend(torch.device("cpu")).allgather_schedule for a, g in groups.items()}
    # auto: Bruck's rounds for blocks up to 64 KiB from 4 ranks on one host (at 3 its 2 rounds
    # cost what the ring's 2 steps do), else the ring.
    assert schedule["auto"](4096) == ("bruck" if size >= 4 else "ring"), schedule["auto"](4096)
    assert schedule["auto"](65537) == "ring"
    assert schedule["ring"](4096) == "ring" and schedule["bruck"](1 << 20) == "bruck"
    for dtype in (torch.float32, torch.int64, torch.uint8):
        for n in (0, 1, 7, 1031, 16411):
            x = (torch.arange(n) * (rank + 3) % 251).to(dtype)
            want = torch.empty(n * size, dtype=dtype)
            dist.all_gather_into_tensor(want, x, group=gloo)
            for algo, group in groups.items():
                got = torch.full((n * size,), 7, dtype=dtype)
                dist.all_gather_into_tensor(got, x, group=group)
                assert_same(got, want, f"all_gather {algo} {dtype} n={n}")
    # reduce_scatter takes Bruck's rounds (run backwards) where the allgather of its block size
    # would: the same groups, against gloo.
    for dtype in (torch.float32, torch.int64):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            for n in (0, 1, 7, 1031, 16411):
                x = ((torch.arange(n * size) * (rank + 3) + rank) % 251).to(dtype)
                want = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(want, x.clone(), op=op, group=gloo)
                for algo, group in groups.items():
                    got = torch.full((n,), 7, dtype=dtype)
                    dist.reduce_scatter_tensor(got, x.clone(), op=op, group=group)
                    assert_same(got, want, f"reduce_scatter {algo} {op} {dtype} n={n}")


@pytest.mark.parametrize("size", [2, 3, 4])
def test_all_gather_and_reduce_scatter_rings_and_bruck_match_gloo(size):
    run_ranks(_all_gather_schedules, size)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_non_contiguous_and_async(size):
    run_ranks(_non_contiguous_and_async, size)


def _over_2gib(rank, size):
    n = (1 << 31) + 17  # int8: more bytes than a 32-bit count can hold
    x = torch.full((n,), rank + 1, dtype=torch.int8)
    dist.all_reduce(x)
    want = size * (size + 1) // 2
    assert x[-1].item() == want and x[(1 << 31) + 3].item() == want and x[0].item() == want
    assert bool((x == want).all())
    y = torch.full((n,), rank, dtype=torch.int8)
    dist.broadcast(y, src=1)
    assert bool((y == 1).all())


def test_messages_over_2_gib_are_not_truncated():
    run_ranks(_over_2gib, 2, timeout=300)
