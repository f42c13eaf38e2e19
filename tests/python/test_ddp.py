"""DistributedDataParallel over 'ddl' ends where the same run over gloo ends."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddl_testing import run_ranks


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 5)
        self.unused = nn.Linear(64, 5)  # only reached on odd steps

    def forward(self, x, use_extra=False):
        h = self.body(x)
        return self.head(h) + (self.unused(h) if use_extra else 0)


def _train(group, hook, find_unused, steps, rank):
    torch.manual_seed(0)
    net = Net()
    # Small buckets: several allreduces per step, overlapping backward. PowerSGD's hooks wait
    # inside their callbacks, which needs one bucket (over gloo too: several hang there).
    one_bucket = hook is HOOKS["power_sgd"]
    model = DDP(net, process_group=group, bucket_cap_mb=25 if one_bucket else 0.01,
                find_unused_parameters=find_unused)
    if hook is not None:
        model.register_comm_hook(*hook(group))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        x = torch.randn(16, 20, generator=gen)
        y = torch.randint(0, 5, (16,), generator=gen)
        opt.zero_grad()
        out = model(x, use_extra=(step % 2 == 1) if find_unused else True)
        nn.functional.cross_entropy(out, y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _power_sgd(group):
    # PowerSGD's hook waits, inside a Future callback, on the futures of the allreduces it
    # starts there: the completion of one ddl op must not wait for the callback of another.
    # (torch 2.13's batched_powerSGD_hook fails in _orthogonalize over gloo as over ddl.)
    state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=2,
                                        start_powerSGD_iter=3, random_seed=0)
    return state, powerSGD_hook.powerSGD_hook


HOOKS = {
    "fp16_hook": lambda group: (group, default_hooks.fp16_compress_hook),
    "power_sgd": _power_sgd,
}


def _ddp_parity(rank, size, variant):
    gloo = dist.new_group(backend="gloo")
    ddl = dist.group.WORLD
    hook = HOOKS.get(variant)
    find_unused = variant == "find_unused"
    steps = 12
    got = _train(ddl, hook, find_unused, steps, rank)
    want = _train(gloo, hook, find_unused, steps, rank)
    tol = 1e-3 if hook is not None else 1e-5
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.allclose(g, w, rtol=tol, atol=tol), (
            f"{variant} P={size}: parameter {i} differs by {(g - w).abs().max().item()}")
    # Replicas agree with each other too.
    first = torch.cat([p.flatten() for p in got])
    copy = first.clone()
    dist.broadcast(copy, src=0)
    assert torch.equal(first, copy), "replicas diverged"
    # Training moved the parameters.
    torch.manual_seed(0)
    initial = torch.cat([p.detach().flatten() for p in Net().parameters()])
    assert not torch.allclose(first, initial)


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("variant",
                         ["plain", "fp16_hook", "find_unused", "power_sgd"])
def test_ddp_matches_gloo(size, variant):
    run_ranks(_ddp_parity, size, variant, timeout=120)


def _callback_waits(rank, size):
    # A Future callback that starts a collective and waits for its future, nested twice.
    def inner(fut):
        t = fut.value()[0] + 1
        dist.all_reduce(t, async_op=True).get_future().wait()
        return t

    def outer(fut):
        u = fut.value()[0] * 2
        return dist.all_reduce(u, async_op=True).get_future().then(inner).wait()

    x = torch.full((1000,), float(rank))
    got = dist.all_reduce(x, async_op=True).get_future().then(outer).wait()
    s = size * (size - 1) / 2
    want = (2 * s * size + 1) * size
    assert torch.equal(got, torch.full((1000,), want)), got[:3]


@pytest.mark.parametrize("size", [2, 3])
def test_a_future_callback_may_wait_on_another_collective(size):
    run_ranks(_callback_waits, size, timeout=60)


def _train_wide(group, steps, rank):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 2048), nn.ReLU(), nn.Linear(2048, 1100), nn.ReLU(),
                        nn.Linear(1100, 5))
    model = DDP(net, process_group=group, bucket_cap_mb=25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(16, 20, generator=gen)
        y = torch.randint(0, 5, (16,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _ddp_wide(rank, size):
    import torch_ddl

    gloo = dist.new_group(backend="gloo")
    got = _train_wide(dist.group.WORLD, 8, rank)
    # The bucket of the 2048x1100 weight (9 MiB) was adopted into shared memory.
    assert torch_ddl._C.adopted_buffers() >= 1
    want = _train_wide(gloo, 8, rank)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-5), (
            f"P={size}: parameter {i} differs by {(g - w).abs().max().item()}")


@pytest.mark.parametrize("size", [2, 3])
def test_ddp_with_buckets_in_shared_memory_matches_gloo(size, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))  # see test_collectives.py
    run_ranks(_ddp_wide, size)
