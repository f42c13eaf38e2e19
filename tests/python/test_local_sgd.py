"""torch_ddl.compress (an allreduce narrowed on the wire, summed in float32) against gloo running
the same exchange and against float32 sums with the bound each wire format promises; its DDP
hook; torch_ddl.optim.DiLoCo against a single-process reference of the rule (P workers in one
process, the same data), with fragments, overlap and mixing, at world sizes 1 to 4; resumed runs,
narrowed exchanges and bad arguments."""

import copy

import pytest
import torch
import torch.distributed as dist

from ddl_testing import run_ranks

WIRES = (torch.bfloat16, torch.float16, torch.int8)
SIZES = (0, 1, 7, 1021, 65537)


def _inputs(rank, n, seed=0):
    g = torch.Generator().manual_seed(7919 * rank + 31 * n + seed)
    return torch.randn(n, generator=g) * (1 + rank)


def _bound(xs, wire, op, world):
    """Per-element bound on |narrowed exchange - float64 sum| for inputs xs (one per rank)."""
    stacked = torch.stack([x.double() for x in xs]) if xs[0].numel() else torch.zeros(world, 0)
    exact = stacked.sum(0)
    absum = stacked.abs().sum(0)
    if wire == torch.int8:
        inputs = sum(float(x.abs().max()) / 254 for x in xs) if xs[0].numel() else 0.0
        out = (float(exact.abs().max()) + inputs) / 254 if xs[0].numel() else 0.0
        bound = torch.full_like(exact, inputs + out)
    else:
        u = 2.0 ** (-8 if wire == torch.bfloat16 else -11)
        bound = u * absum + u * (exact.abs() + u * absum)
    bound += 1e-6 * absum + 1e-30
    if op == "avg":
        exact, bound = exact / world, bound / world
    return exact, bound


def _compressed(rank, world):
    from torch_ddl import compress

    gloo = dist.new_group(backend="gloo")
    for wire in WIRES:
        for op in ("sum", "avg"):
            for n in SIZES:
                mine = _inputs(rank, n)
                got, want = mine.clone(), mine.clone()
                compress.all_reduce(got, wire, op)
                compress.all_reduce(want, wire, op, group=gloo)
                assert torch.equal(got, want), f"{wire} {op} n={n}: ddl and gloo differ"
                exact, bound = _bound([_inputs(r, n) for r in range(world)], wire, op, world)
                err = (got.double() - exact).abs()
                assert bool((err <= bound).all()), \
                    f"{wire} {op} n={n}: error {float((err - bound).max()):g} over the bound"
                every = [torch.empty_like(got) for _ in range(world)]
                dist.all_gather(every, got)
                assert all(torch.equal(e, got) for e in every), f"{wire} {op} n={n}: ranks differ"
    # A bfloat16 tensor, 2-D: narrowed and summed the same way, written back in its own dtype.
    x = _inputs(rank, 600).view(20, 30).to(torch.bfloat16)
    y = x.clone()
    compress.all_reduce(x, torch.bfloat16, "sum")
    compress.all_reduce(y, torch.bfloat16, "sum", group=gloo)
    assert x.dtype == torch.bfloat16 and torch.equal(x, y)
    # Integers on the wire: exact where the narrowed values are.
    z = torch.full((1000,), float(rank + 1))
    compress.all_reduce(z, torch.bfloat16, "sum")
    assert bool((z == world * (world + 1) / 2).all())
    # Bad input: refused before anything moves.
    with pytest.raises(TypeError, match="only floating-point tensors"):
        compress.all_reduce(torch.ones(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="wire_dtype torch.float64 is not one of"):
        compress.all_reduce(torch.ones(4), torch.float64)
    with pytest.raises(ValueError, match="must be contiguous"):
        compress.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(ValueError, match="op must be 'sum' or 'avg'"):
        compress.all_reduce(torch.ones(4), op="max")
    assert compress.wire_bytes(1000, torch.bfloat16, world) == \
        (0 if world == 1 else 2 * (world - 1) * -(-1000 // world) * 2)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_narrowed_allreduce_matches_gloo_and_stays_within_its_bound(world):
    run_ranks(_compressed, world)


def _ddp_hook(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_ddl import compress

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    plain, hooked = DDP(model()), DDP(model())
    state = compress.HookState(torch.bfloat16)
    hooked.register_comm_hook(state, compress.ddp_hook)
    x, y = _inputs(rank, 80).view(8, 10), _inputs(rank, 24, 1).view(8, 3)
    for m in (plain, hooked):
        torch.nn.functional.mse_loss(m(x), y).backward()
    for a, b in zip(plain.parameters(), hooked.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=2 ** -6, atol=2 ** -8 * float(
            a.grad.abs().max()))
        every = [torch.empty_like(b.grad) for _ in range(world)]
        dist.all_gather(every, b.grad)
        assert all(torch.equal(e, b.grad) for e in every)
    count = sum(p.numel() for p in hooked.parameters())
    assert state.bytes_sent == compress.wire_bytes(count, torch.bfloat16, world)


def test_ddp_hook_averages_gradients_narrowed():
    run_ranks(_ddp_hook, 3)


# DiLoCo ---------------------------------------------------------------------------------------

STEPS = 24
CONFIGS = [  # H, fragments, overlap, mixing, outer momentum, nesterov
    (4, 1, 0, 0.5, 0.9, True),
    (6, 3, 1, 0.5, 0.9, True),
    (5, 2, 2, 0.0, 0.5, False),
    (3, 1, 0, 0.5, 0.0, False),
]


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def local_step(model, rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(8, 10, generator=g), torch.randn(8, 3, generator=g)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()


def reference(world, config, steps=STEPS):
    """Every worker's parameters and the global ones after `steps`, the rule in one process."""
    from torch_ddl.optim import _cut

    H, fragments, overlap, mixing, mu, nesterov = config
    models = [make_model() for _ in range(world)]
    opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in models]
    index = {id(p): i for i, p in enumerate(models[0].parameters())}
    runs = [[index[id(p)] for p in run] for run in _cut(list(models[0].parameters()), fragments)]
    glob = [p.detach().clone() for p in models[0].parameters()]
    mom = [torch.zeros_like(g) for g in glob]
    pending = {}  # fragment -> (averaged pseudo-gradients, due step)
    firsts = [round((f + 1) * H / fragments) for f in range(fragments)]

    def finish(f):
        deltas, _ = pending.pop(f)
        for i, d in zip(runs[f], deltas):
            if mu > 0:
                mom[i].mul_(mu).add_(d)
                u = d + mu * mom[i] if nesterov else mom[i]
            else:
                u = d
            glob[i] -= 0.7 * u
            for m in models:
                p = list(m.parameters())[i]
                keep = mixing if overlap > 0 else 0.0
                with torch.no_grad():
                    p.copy_(keep * p + (1 - keep) * glob[i] if keep else glob[i])

    for step in range(1, steps + 1):
        for r in range(world):
            local_step(models[r], r, step)
            opts[r].step()
        for f in list(pending):
            if pending[f][1] <= step:
                finish(f)
        for f in range(fragments):
            if step >= firsts[f] and (step - firsts[f]) % H == 0:
                deltas = []
                for i in runs[f]:
                    total = sum(glob[i] - list(m.parameters())[i].detach() for m in models)
                    deltas.append(total / world)
                pending[f] = (deltas, step + overlap)
                if overlap == 0:
                    finish(f)
    return [[p.detach() for p in m.parameters()] for m in models], glob


def train(rank, world, config, steps=STEPS, state=None, wire=None, group=None, save_at=None):
    from torch_ddl.optim import DiLoCo

    H, fragments, overlap, mixing, mu, nesterov = config
    model = make_model()
    if rank > 0:  # the wrapper starts every rank from rank 0's parameters
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    diloco = DiLoCo(opt, H, outer_lr=0.7, outer_momentum=mu, nesterov=nesterov,
                    fragments=fragments, overlap=overlap, mixing=mixing, wire_dtype=wire,
                    group=group)
    first, saved = 0, None
    if state is not None:
        model.load_state_dict(state["model"])
        diloco.load_state_dict(state["diloco"])
        first = diloco.steps
    for step in range(first + 1, steps + 1):
        local_step(model, rank, step)
        diloco.step()
        if step == save_at:
            saved = copy.deepcopy({"model": model.state_dict(), "diloco": diloco.state_dict()})
    return [p.detach().clone() for p in model.parameters()], \
        [g.clone() for g in diloco.global_parameters()], saved, diloco


def _diloco(rank, world):
    gloo = dist.new_group(backend="gloo")
    for config in CONFIGS:
        want_params, want_global = reference(world, config)
        params, glob, saved, diloco = train(rank, world, config, save_at=11)
        for got, want in zip(params, want_params[rank]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for got, want in zip(glob, want_global):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        flat = torch.cat([g.reshape(-1) for g in glob])
        every = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        assert all(torch.equal(e, flat) for e in every), f"{config}: the global parameters differ"
        model_params = [p for g in diloco.param_groups for p in g["params"]]
        with diloco.global_weights():  # the parameters hold the global ones, then their own
            assert all(torch.equal(p, g) for p, g in zip(model_params, glob))
        assert all(torch.equal(p, q) for p, q in zip(model_params, params))
        H, fragments = config[0], config[1]
        syncs = sum(len(range(round((f + 1) * H / fragments), STEPS + 1, H))
                    for f in range(fragments))
        assert diloco.bytes_communicated == sum(
            sum(p.numel() for p in frag["params"]) * 4 * len(
                range(frag["first"], STEPS + 1, H)) for frag in diloco._fragments)
        assert diloco.outer_steps == syncs - sum(
            1 for frag in diloco._fragments if frag["pending"] is not None)
        # Resumed from the checkpoint of step 11 (an exchange may be in flight there): the same
        # bits as the run that went on.
        resumed, rglob, _, _ = train(rank, world, config, state=saved)
        for a, b in zip(params + glob, resumed + rglob):
            assert torch.equal(a, b), f"{config}: the resumed run differs"
        # Narrowed on the wire: ddl and gloo take the same steps, bit for bit.
        for wire in (torch.bfloat16, torch.int8):
            a, ag, _, d = train(rank, world, config, wire=wire)
            b, bg, _, _ = train(rank, world, config, wire=wire, group=gloo)
            for x, y in zip(a + ag, b + bg):
                assert torch.equal(x, y), f"{config} {wire}: ddl and gloo differ"
            assert d.bytes_communicated < diloco.bytes_communicated or world == 1


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_diloco_matches_the_single_process_reference(world):
    run_ranks(_diloco, world)


def _bad_arguments(rank, world):
    from torch_ddl.optim import DiLoCo

    opt = torch.optim.SGD(make_model().parameters(), lr=0.1)
    for kwargs, words in [({"H": 0}, "H must be an integer >= 1"),
                          ({"H": 2.5}, "H must be an integer >= 1"),
                          ({"H": 4, "fragments": 5}, "fragments (5) must be at most H (4)"),
                          ({"H": 8, "fragments": 5},
                           "fragments (5) must be at most the number of parameters (4)"),
                          ({"H": 4, "overlap": 4}, "overlap (4) must be below H (4)"),
                          ({"H": 4, "outer_lr": 0}, "outer_lr must be a positive number"),
                          ({"H": 4, "outer_momentum": 1.0}, "outer_momentum must be in [0, 1)"),
                          ({"H": 4, "outer_momentum": 0.0}, "nesterov needs outer_momentum > 0"),
                          ({"H": 4, "mixing": 2}, "mixing must be in [0, 1]"),
                          ({"H": 4, "wire_dtype": torch.float64},
                           "wire_dtype torch.float64 is not None or one of")]:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
            DiLoCo(opt, **kwargs)
    d = DiLoCo(opt, H=4)
    other = torch.optim.SGD(torch.nn.Linear(3, 3).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="the saved state is not of these parameters"):
        d.load_state_dict(DiLoCo(other, H=4).state_dict())


def test_diloco_refuses_bad_arguments_naming_what_is_wrong():
    run_ranks(_bad_arguments, 2)


# A rank lost mid-training ------------------------------------------------------------------

LOST_STEP, LOST_STEPS = 6, 12


def lost_reference(method, world, victim):
    """The survivors' parameters and the method's shared state when `victim` dies at LOST_STEP,
    before that step's exchange: the exchange is dropped and the others go on without it."""
    models = [make_model() for _ in range(world)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    shared = [p.detach().clone() for p in models[0].parameters()]
    mom = [torch.zeros_like(g) for g in shared]
    alive = list(range(world))
    for step in range(1, LOST_STEPS + 1):
        if step == LOST_STEP:
            alive.remove(victim)
        for r in alive:
            local_step(models[r], r, step)
            opts[r].step()
        if step % 2:
            continue
        params = [list(models[r].parameters()) for r in alive]
        with torch.no_grad():
            if method == "diloco":
                if step == LOST_STEP:
                    continue  # the exchange failed everywhere
                for i in range(len(shared)):
                    d = sum(shared[i] - ps[i] for ps in params) / len(alive)
                    mom[i].mul_(0.9).add_(d)
                    shared[i] -= 0.7 * (d + 0.9 * mom[i])
                    for ps in params:
                        ps[i].copy_(shared[i])
            else:  # Sync EASGD: each rank pulls itself first; the centre moves if all arrive
                for i in range(len(shared)):
                    deltas = [0.3 * (ps[i] - shared[i]) for ps in params]
                    for ps, d in zip(params, deltas):
                        ps[i].sub_(d)
                    if step != LOST_STEP:
                        shared[i] += sum(deltas)
    return {r: [p.detach() for p in models[r].parameters()] for r in alive}, shared


def _lose_a_rank(rank, size, victim, method, store):
    import os
    import signal

    import torch_ddl  # noqa: F401
    from torch_ddl.optim import DiLoCo, ElasticAveraging

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if method == "streaming":  # no reference: survivors agree and go on
        wrapper = DiLoCo(opt, H=4, fragments=2, overlap=1)
        failed = False
        for step in range(1, LOST_STEPS + 1):
            if step == LOST_STEP and rank == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            local_step(model, rank, step)
            try:
                wrapper.step()
            except RuntimeError as error:  # where the exchange in flight is waited for
                assert f"rank {victim} is gone" in str(error) and not failed, error
                failed = True
                dist.shrink_group([victim])
                wrapper.rebind(None)
        assert failed
        flat = torch.cat([g.reshape(-1) for g in wrapper.global_parameters()])
        every = [torch.empty_like(flat) for _ in range(size - 1)]
        dist.all_gather(every, flat)
        assert all(torch.equal(e, flat) for e in every) and bool(torch.isfinite(flat).all())
        dist.destroy_process_group()
        return
    wrapper = DiLoCo(opt, H=2) if method == "diloco" else ElasticAveraging(opt, 0.3, tau=2)
    for step in range(1, LOST_STEPS + 1):
        if step == LOST_STEP and rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        local_step(model, rank, step)
        if step != LOST_STEP:
            wrapper.step()
            continue
        with pytest.raises(RuntimeError, match=f"rank {victim} is gone"):
            wrapper.step()
        dist.shrink_group([victim])
        wrapper.rebind(None)
    want, shared = lost_reference(method, size, victim)
    for got, w in zip(model.parameters(), want[rank]):
        torch.testing.assert_close(got.detach(), w, rtol=1e-5, atol=1e-6)
    mine = wrapper.global_parameters() if method == "diloco" else wrapper.centre()
    for got, w in zip(mine, shared):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)
    flat = torch.cat([g.reshape(-1) for g in mine])
    every = [torch.empty_like(flat) for _ in range(size - 1)]
    dist.all_gather(every, flat)
    assert all(torch.equal(e, flat) for e in every), "the survivors' shared state differs"
    dist.destroy_process_group()


@pytest.mark.parametrize("method", ["diloco", "streaming", "easgd"])
def test_a_lost_rank_is_left_behind_and_training_goes_on(method):
    import os
    import signal
    import tempfile

    from ddl_testing import run_spawned

    size, victim = 3, 1
    want = [0] * size
    want[victim] = -signal.SIGKILL
    with tempfile.TemporaryDirectory() as tmp:
        run_spawned(_lose_a_rank, size, (size, victim, method, os.path.join(tmp, "store")), want)


# Asynchronous EASGD over windows -------------------------------------------------------------

class _Recording:
    """An optimizer that records the parameters right after each of its steps (before the
    wrapper's elastic step moves them)."""

    def __init__(self, optimizer):
        self.optimizer, self.param_groups, self.after = optimizer, optimizer.param_groups, None

    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self.after = torch.cat([p.detach().reshape(-1) for g in self.param_groups
                                for p in g["params"]])
        return loss


def _async_easgd(rank, world, momentum, hogwild, marker):
    import os
    import time

    from torch_ddl.optim import AsyncElasticAveraging

    model = make_model()
    opt = _Recording(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    ea = AsyncElasticAveraging(opt, alpha=0.5, tau=2, momentum=momentum, hogwild=hogwild)
    # Every rank starts at the centre's parameters (the centre itself may already have moved:
    # with hogwild a rank that stepped first adds to it at once).
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    total = torch.zeros_like(start)  # every difference this rank made: what its pulls took
    slow = world >= 3 and rank == 1 and not hogwild
    if slow:  # starts only once rank 2 has made all its steps: nobody waits for a worker
        deadline = time.monotonic() + 60
        while not os.path.exists(marker):
            assert time.monotonic() < deadline, "rank 2 never finished: it waited for rank 1"
            time.sleep(0.01)
    for step in range(1, STEPS + 1):
        local_step(model, rank, step)
        ea.step()
        total += opt.after - torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if world >= 3 and rank == 2 and not hogwild:
        with open(marker, "w") as f:
            f.write("done")
    ea.close()
    with pytest.raises(RuntimeError, match="step\\(\\) after close\\(\\)"):
        ea.step()
    own = [p.detach().clone() for p in model.parameters()]
    with ea.centre_weights():  # the parameters hold the centre, then their own
        assert all(torch.equal(p, c) for p, c in zip(model.parameters(), ea.centre()))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), own))
    final = torch.cat([c.reshape(-1) for c in ea.centre()])
    every = [torch.empty_like(final) for _ in range(world)]
    dist.all_gather(every, final)
    assert all(torch.equal(e, final) for e in every), "the ranks' final centres differ"
    return start, total, final, ea


def _async_worker(rank, world, marker):
    gloo = dist.new_group(backend="gloo")
    for momentum in (0.0, 0.5):
        start, total, final, ea = _async_easgd(rank, world, momentum, False, marker + str(momentum))
        counts = torch.tensor([ea.exchanges], dtype=torch.int64)
        dist.all_reduce(counts, group=gloo)
        assert ea.version == int(counts.item()), (ea.version, int(counts.item()))
        if momentum == 0.0:
            # Every difference reached the centre once: it moved by their sum.
            dist.all_reduce(total, group=gloo)
            torch.testing.assert_close(final - start, total, rtol=1e-4, atol=1e-5)
    if world <= 3:  # every rank on this host: the centre is mapped everywhere
        start, total, final, ea = _async_easgd(rank, world, 0.0, True, marker)
        dist.all_reduce(total, group=gloo)
        assert bool(torch.isfinite(final).all())
        moved = (final - start - total).norm() / total.norm()
        assert moved < 0.5, f"hogwild lost {moved:.0%} of the differences"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_async_easgd_takes_every_difference_once_and_nobody_waits(world, tmp_path):
    run_ranks(_async_worker, world, str(tmp_path / "marker"))


def _async_bad_arguments(rank, world):
    from torch_ddl.optim import AsyncElasticAveraging

    opt = torch.optim.SGD(make_model().parameters(), lr=0.1)
    for kwargs, words in [({"alpha": 0.0, "tau": 2}, "alpha must be in (0, 1]"),
                          ({"alpha": 0.5, "tau": 0}, "tau must be an integer >= 1"),
                          ({"alpha": 0.5, "tau": 2, "momentum": 1.0}, "momentum must be in [0, 1)"),
                          ({"alpha": 0.5, "tau": 2, "centre_rank": 5},
                           "centre_rank 5 is not a rank of the group (0 .. 1)"),
                          ({"alpha": 0.5, "tau": 2, "hogwild": True, "momentum": 0.5},
                           "hogwild takes no momentum")]:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
            AsyncElasticAveraging(opt, **kwargs)
    gloo = dist.new_group(backend="gloo")
    with pytest.raises(ValueError, match="the group's backend is gloo, not ddl"):
        AsyncElasticAveraging(opt, 0.5, 2, group=gloo)


def test_async_easgd_refuses_bad_arguments():
    run_ranks(_async_bad_arguments, 2)


def _async_lose(rank, size, victim, store, hogwild, momentum=0.0):
    import os
    import signal
    import time

    import torch_ddl  # noqa: F401
    from torch_ddl.optim import AsyncElasticAveraging

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size)
    model = make_model()
    opt = _Recording(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    ea = AsyncElasticAveraging(opt, alpha=0.5, tau=2, hogwild=hogwild, momentum=momentum)
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    total = torch.zeros_like(start)
    kill_at = 1 if victim != 0 else 9  # a worker before it sent anything; the centre midway
    marker = store + ".sent"
    if victim == 1 and rank == 0:
        # The centre starts once worker 2 has sent a difference: it finds worker 1 lost before
        # it takes that one, which is then in flight through the fault and must go again.
        deadline = time.monotonic() + 60
        while not os.path.exists(marker):
            assert time.monotonic() < deadline, "worker 2 never sent"
            time.sleep(0.01)
    failed_at, step = None, 0
    while step < LOST_STEPS:
        step += 1
        if rank == 2 and ea.exchanges == 1 and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write("sent")
        if step == kill_at and rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        local_step(model, rank, step)
        try:
            ea.step()
        except RuntimeError as error:
            assert f"rank {victim} is gone" in str(error), error
            failed_at = step
            dist.shrink_group([victim])
            versions = torch.tensor([ea.copy_version])
            ea.rebind(None)
            every = [torch.empty_like(versions) for _ in range(size - 1)]
            dist.all_gather(every, versions)
            if victim == 0 and not hogwild:  # the freshest copy became the centre
                assert ea.copy_version == max(int(v) for v in every)
        if opt.after is not None:
            total += opt.after - torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            opt.after = None
        if step == LOST_STEPS and failed_at is None and not hogwild:
            step -= 1  # the failure has not reached this rank yet: step on until it does
            time.sleep(0.01)
            assert ea.steps < LOST_STEPS + 500, "no failure was seen within 5 s"
    try:
        ea.close()
        assert failed_at is not None, "the loss of a rank was never seen"
    except RuntimeError as error:
        # hogwild: the steps touch only the mapped centre, which outlives its rank: the loss is
        # seen by close()'s collectives.
        assert hogwild and failed_at is None and f"rank {victim} is gone" in str(error), error
        dist.shrink_group([victim])
        ea.rebind(None)
        ea.close()
    final = torch.cat([c.reshape(-1) for c in ea.centre()])
    every = [torch.empty_like(final) for _ in range(size - 1)]
    dist.all_gather(every, final)
    assert all(torch.equal(e, final) for e in every), "the survivors' final centres differ"
    if victim != 0 and not hogwild and not momentum:
        # The centre survived and the lost worker sent nothing: every survivor's difference
        # reached it once, also the ones in flight when the fault struck.
        dist.all_reduce(total)
        torch.testing.assert_close(final - start, total, rtol=1e-4, atol=1e-5)
    dist.destroy_process_group()


@pytest.mark.parametrize("victim,hogwild,momentum", [(1, False, 0.0), (0, False, 0.0),
                                                     (0, True, 0.0), (1, False, 0.5)])
def test_async_easgd_goes_on_after_a_lost_worker_or_centre(victim, hogwild, momentum):
    import os
    import signal
    import tempfile

    from ddl_testing import run_spawned

    size = 3
    want = [0] * size
    want[victim] = -signal.SIGKILL
    with tempfile.TemporaryDirectory() as tmp:
        run_spawned(_async_lose, size,
                    (size, victim, os.path.join(tmp, "store"), hogwild, momentum), want)
