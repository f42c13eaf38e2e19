"""CUDA tensors over 'ddl': every collective x op x dtype against gloo on the same inputs (on
the CPU), stream ordering, futures, CUDA graphs refused, mixed devices refused, DDP against
gloo. Ranks share the visible GPU(s) (gloo allows that; NCCL does not)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from ddl_testing import ALL_TYPES, OPS, assert_same, make_input, run_ranks, valid


def _cuda_reason():
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    import torch_ddl

    if not torch_ddl._C.cuda_built():
        return "torch_ddl was built without CUDA (torch without CUDA, or no nvcc)"
    return ""


pytestmark = pytest.mark.skipif(bool(_cuda_reason()), reason=_cuda_reason() or "-")

SIZES = [0, 1, 7, 1021, 70001, (1 << 20) + 3]


def _device(rank):
    return torch.device("cuda", rank % torch.cuda.device_count())


def _collectives(rank, size):
    dev = _device(rank)
    torch.cuda.set_device(dev)
    gloo = dist.new_group(backend="gloo")
    checked = 0
    for op_name, op in OPS.items():
        for dtype in ALL_TYPES:
            for n in SIZES if dtype in (torch.float32, torch.int64) else SIZES[:5]:
                if not valid(dtype, op_name):
                    continue
                x = make_input(dtype, op_name, rank, size, n)
                got = x.to(dev)
                dist.all_reduce(got, op=op)
                want = x.clone()
                try:
                    dist.all_reduce(want, op=op, group=gloo)
                except (RuntimeError, ValueError):
                    continue  # gloo lacks this op/dtype; test_collectives covers the reference
                assert got.device == dev
                assert_same(got.cpu(), want, f"cuda all_reduce {op_name} {dtype} n={n} P={size}")
                checked += 1
    assert checked > 100, checked
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.uint8):
        for n in (0, 1, 13, 4099, 300007):
            x = make_input(dtype, "SUM", rank, size, n)
            xd = x.to(dev)
            for root in range(size):
                got, want = xd.clone(), x.clone()
                dist.broadcast(got, src=root)
                dist.broadcast(want, src=root, group=gloo)
                assert_same(got.cpu(), want, f"cuda broadcast {dtype} n={n} root={root}")
            outs = [torch.empty_like(xd) for _ in range(size)]
            dist.all_gather(outs, xd)
            blocks = [make_input(dtype, "SUM", r, size, n) for r in range(size)]
            for r in range(size):
                assert_same(outs[r].cpu(), blocks[r], f"cuda all_gather {dtype} n={n}")
            flat = torch.empty(size * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(flat, xd)
            assert_same(flat.cpu(), torch.cat(blocks), f"cuda all_gather_into_tensor {dtype}")
            if dtype == torch.uint8:
                continue
            big = torch.cat([make_input(dtype, "SUM", rank * 7 + r, size, n) for r in range(size)])
            out = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(out, big.to(dev))
            want = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(want, big.clone(), group=gloo)
            assert_same(out.cpu(), want, f"cuda reduce_scatter_tensor {dtype} n={n}")
            for root in range(size):
                got, want = xd.clone(), x.clone()
                dist.reduce(got, dst=root, op=dist.ReduceOp.MAX)
                dist.reduce(want, dst=root, op=dist.ReduceOp.MAX, group=gloo)
                if rank == root:
                    assert_same(got.cpu(), want, f"cuda reduce {dtype} n={n} root={root}")
    # gather, scatter, all_to_all_single, send/recv
    x = torch.arange(10, dtype=torch.float32, device=dev) + 100 * rank
    gathered = [torch.empty_like(x) for _ in range(size)] if rank == 0 else None
    dist.gather(x, gathered, dst=0)
    if rank == 0:
        for r in range(size):
            assert_same(gathered[r].cpu(), torch.arange(10.0) + 100 * r, "cuda gather")
    got = torch.empty(10, device=dev)
    pieces = [torch.full((10,), float(r), device=dev) for r in range(size)] if rank == 0 else None
    dist.scatter(got, pieces, src=0)
    assert_same(got.cpu(), torch.full((10,), float(rank)), "cuda scatter")
    a2a_in = torch.arange(size * 3, dtype=torch.int64, device=dev) + 1000 * rank
    a2a_out = torch.empty_like(a2a_in)
    dist.all_to_all_single(a2a_out, a2a_in)
    want = torch.cat([torch.arange(3) + 3 * rank + 1000 * r for r in range(size)])
    assert_same(a2a_out.cpu(), want, "cuda all_to_all_single")
    if size > 1:
        t = torch.full((5,), float(rank), device=dev)
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            dist.recv(t, src=0)
            assert_same(t.cpu(), torch.zeros(5), "cuda send/recv")
    dist.barrier()


@pytest.mark.parametrize("size", [1, 2, 3])
def test_cuda_collectives_match_gloo(size):
    run_ranks(_collectives, size, timeout=600)


def _streams(rank, size):
    dev = _device(rank)
    torch.cuda.set_device(dev)
    n = 1 << 22
    total = size * (size + 1) / 2
    for trial in range(3):
        # A kernel writes the input just before the call, behind a long one: the op must wait
        # for it. A kernel reads the output right after wait(): it must see the result.
        x = torch.zeros(n, device=dev)
        torch.cuda._sleep(50_000_000)
        x.fill_(float(rank + 1))
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        y = x * 2
        assert_same(y.cpu(), torch.full((n,), 2 * total), f"stream order, trial {trial}")
    # On a side stream: the op follows that stream; after wait() its results are final.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.full((n,), float(rank + 1), device=dev)
        torch.cuda._sleep(20_000_000)
        x.mul_(2)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        z = x + 1
    torch.cuda.current_stream().wait_stream(side)
    assert_same(z.cpu(), torch.full((n,), 2 * total + 1), "side stream")
    # Futures complete with the outputs, and a callback may use them.
    x = torch.full((1000,), float(rank), device=dev)
    fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] * 10)
    assert_same(fut.wait().cpu(), torch.full((1000,), 10.0 * (size - 1) * size / 2), "future")
    # Mixed devices and CUDA graphs are refused before anything moves, on every rank alike.
    with pytest.raises(ValueError, match="one device"):
        dist.all_gather([torch.empty(3, device=dev) for _ in range(size)], torch.ones(3))
    x = torch.ones(16, device=dev)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(Exception, match="CUDA graph"):
        with torch.cuda.graph(graph):
            dist.all_reduce(x)
    t = torch.ones(3, device=dev)
    dist.all_reduce(t)
    assert_same(t.cpu(), torch.full((3,), float(size)), "usable after refusals")


@pytest.mark.parametrize("size", [2, 3])
def test_cuda_stream_semantics(size):
    run_ranks(_streams, size)


STAGE_BYTES = 1 << 20  # TORCH_DDL_DEVICE_STAGE_BYTES in the staged tests


def _staged(rank, size):
    """Allreduces of CUDA tensors up to STAGE_BYTES run through pinned host memory: every op and
    dtype against gloo, at the limit and past it, non-contiguous, PREMUL_SUM, coalesced, and
    ordered on the caller's stream like the device path."""
    dev = _device(rank)
    torch.cuda.set_device(dev)
    gloo = dist.new_group(backend="gloo")
    checked = 0
    for op_name, op in OPS.items():
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8):
            for n in (1, 7, 1021, 70001, STAGE_BYTES // 4, STAGE_BYTES // 4 + 1):
                if not valid(dtype, op_name):
                    continue
                x = make_input(dtype, op_name, rank, size, n)
                got, want = x.to(dev), x.clone()
                dist.all_reduce(got, op=op)
                try:
                    dist.all_reduce(want, op=op, group=gloo)
                except (RuntimeError, ValueError):
                    continue
                assert_same(got.cpu(), want, f"staged all_reduce {op_name} {dtype} n={n} P={size}")
                checked += 1
    assert checked > 50, checked
    base = torch.arange(600, dtype=torch.float32).reshape(20, 30) + rank
    got = base.clone().to(dev).t()  # not contiguous
    dist.all_reduce(got)
    want = base.clone()
    dist.all_reduce(want, group=gloo)
    assert_same(got.cpu(), want.t(), "staged, not contiguous")
    got = torch.full((333,), float(rank + 1), device=dev)
    dist.all_reduce(got, op=dist._make_nccl_premul_sum(0.5))
    assert_same(got.cpu(), torch.full((333,), 0.5 * size * (size + 1) / 2), "staged PREMUL_SUM")
    parts = [torch.full((n,), float(rank), device=dev) for n in (3, 1000, 5)]
    dist.all_reduce_coalesced(parts)
    for t in parts:
        assert_same(t.cpu(), torch.full(t.shape, float(size * (size - 1) / 2)), "coalesced")
    total = size * (size + 1) / 2
    for trial in range(3):  # the input written behind a long kernel; the output read after wait
        x = torch.zeros(4096, device=dev)
        torch.cuda._sleep(50_000_000)
        x.fill_(float(rank + 1))
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        assert_same((x * 2).cpu(), torch.full((4096,), 2 * total), f"staged order {trial}")
    x = torch.full((1000,), float(rank), device=dev)
    fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] * 10)
    assert_same(fut.wait().cpu(), torch.full((1000,), 10.0 * (size - 1) * size / 2), "future")


@pytest.mark.parametrize("size", [1, 2, 3])
def test_cuda_small_allreduces_staged_through_host_memory(size, monkeypatch):
    monkeypatch.setenv("TORCH_DDL_DEVICE_STAGE_BYTES", str(STAGE_BYTES))
    run_ranks(_staged, size, timeout=400)


def _ddp(rank, size, backend):
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _device(rank)
    torch.cuda.set_device(dev)
    group = dist.new_group(backend=backend)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
    ddp = DDP(model, device_ids=[dev.index], process_group=group, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(10):
        x = torch.randn(32, 64, generator=g).to(dev)
        y = torch.randint(0, 10, (32,), generator=g).to(dev)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


def _ddp_against_gloo(rank, size):
    ours = _ddp(rank, size, "ddl")
    theirs = _ddp(rank, size, "gloo")
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()


@pytest.mark.parametrize("size", [2, 3])
def test_cuda_ddp_matches_gloo(size):
    run_ranks(_ddp_against_gloo, size)


def _cuda_window(rank, size):
    import torch_ddl

    dev = _device(rank)
    torch.cuda.set_device(dev)
    n = 70001
    target = torch.full((n * size,), -1.0, device=dev)
    w = torch_ddl.new_window(target)
    mine = torch.arange(n, dtype=torch.float32, device=dev) + rank * 1e6
    target[rank * n:(rank + 1) * n] = mine
    peers = [p for p in range(size) if p != rank]
    for p in peers:
        # Queued on the current stream right before: the put reads it once it has run.
        source = mine * 1
        w.put(source, p, rank * n, True)
        w.signal(p, False)
    for p in peers:
        w.wait_signal(p, False)
    want = torch.cat([torch.arange(n, dtype=torch.float32) + r * 1e6 for r in range(size)])
    assert torch.equal(target.cpu(), want)
    with pytest.raises(ValueError, match="only CPU tensors of peers are mapped"):
        w.map_remote_tensor(peers[0])
    w.tensor_deregister()


@pytest.mark.parametrize("size", [2, 3])
def test_cuda_window_puts_land_before_the_signal(size):
    run_ranks(_cuda_window, size)
