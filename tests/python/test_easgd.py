"""torch_ddl.optim.ElasticAveraging against a single-process reference of the same update rule
(P simulated workers in one process, the same data order), at world sizes 1 to 4 and tau 1, 3, 8;
overlap, determinism, checkpoints and bad arguments."""

import copy

import pytest
import torch
import torch.distributed as dist

from ddl_testing import run_ranks

STEPS = 50
TAUS = (1, 3, 8)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 10, generator=g), torch.randn(8, 3, generator=g)


def local_step(model, optimizer, rank, step):
    x, y = batch(rank, step)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()


def reference(world, alpha, tau, steps=STEPS):
    """Every worker's parameters and the centre after `steps`, the rule applied in one process."""
    models = [make_model() for _ in range(world)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    centre = [p.detach().clone() for p in models[0].parameters()]
    for step in range(steps):
        for r in range(world):
            local_step(models[r], opts[r], r, step)
            opts[r].step()
        if (step + 1) % tau == 0:
            deltas = []
            with torch.no_grad():
                for m in models:
                    d = [alpha * (p - c) for p, c in zip(m.parameters(), centre)]
                    for p, dp in zip(m.parameters(), d):
                        p.sub_(dp)
                    deltas.append(d)
                for k in range(len(centre)):
                    centre[k] += sum(d[k] for d in deltas)
    return [[p.detach() for p in m.parameters()] for m in models], centre


def train(rank, world, tau, overlap, steps=STEPS, state=None):
    from torch_ddl.optim import ElasticAveraging

    model = make_model()
    if rank > 0:  # the wrapper starts every rank from rank 0's parameters
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ea = ElasticAveraging(opt, alpha=0.9 / world, tau=tau, overlap=overlap)
    first = 0
    if state is not None:
        model.load_state_dict(state["model"])
        ea.load_state_dict(state["easgd"])
        first = ea.steps
    saved = None
    for step in range(first, steps):
        local_step(model, opt, rank, step)
        ea.step()
        if step + 1 == 20:
            saved = copy.deepcopy({"model": model.state_dict(), "easgd": ea.state_dict()})
    ea.synchronize()
    return [p.detach().clone() for p in model.parameters()], [c.clone() for c in ea.centre()], \
        saved, ea


def _worker(rank, world):
    alpha = 0.9 / world
    for tau in TAUS:
        want_params, want_centre = reference(world, alpha, tau)
        results = {}
        for overlap in (False, True):
            params, centre, saved, ea = train(rank, world, tau, overlap)
            for got, want in zip(params, want_params[rank]):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            for got, want in zip(centre, want_centre):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            flat = torch.cat([c.reshape(-1) for c in centre])
            every = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(every, flat)
            for r, other in enumerate(every):
                assert torch.equal(other, flat), f"tau {tau}: rank {r}'s centre differs"
            count = sum(c.numel() for c in centre)
            assert ea.bytes_communicated == (STEPS // tau) * count * 4
            results[overlap] = (params, centre, saved)
        # Overlapped or not, and run after run: the same bits.
        again = train(rank, world, tau, False)
        for a, b, c in zip(results[False][0], results[True][0], again[0]):
            assert torch.equal(a, b) and torch.equal(a, c), f"tau {tau}: not deterministic"
        # Resumed from the checkpoint of step 20: the same bits as the run that went on.
        resumed = train(rank, world, tau, False, state=results[False][2])
        for a, b in zip(results[False][0] + results[False][1], resumed[0] + resumed[1]):
            assert torch.equal(a, b), f"tau {tau}: the resumed run differs"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_elastic_averaging_matches_the_single_process_reference(world):
    run_ranks(_worker, world)


def _bad_arguments(rank, world):
    from torch_ddl.optim import ElasticAveraging

    opt = torch.optim.SGD(make_model().parameters(), lr=0.1)
    for kwargs, words in [({"alpha": 0.6, "tau": 2}, "alpha x world size = 0.6 x 2 = 1.2 > 1"),
                          ({"alpha": 0.0, "tau": 2}, "alpha must be a positive number"),
                          ({"alpha": 0.1, "tau": 0}, "tau must be an integer >= 1"),
                          ({"alpha": 0.1, "tau": 1.5}, "tau must be an integer >= 1")]:
        with pytest.raises(ValueError, match=words.replace(".", r"\.")):
            ElasticAveraging(opt, **kwargs)
    ea = ElasticAveraging(opt, alpha=0.1, tau=2)
    other = torch.optim.SGD(torch.nn.Linear(3, 3).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="the saved centre is not of these parameters"):
        ea.load_state_dict(ElasticAveraging(other, alpha=0.1, tau=2).state_dict())


def test_bad_arguments_are_refused_naming_what_is_wrong():
    run_ranks(_bad_arguments, 2)


def _with_ddp_no_sync(rank, world):
    # Under DDP's no_sync (no gradient allreduce) the wrapper does what it does without DDP.
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_ddl.optim import ElasticAveraging

    plain, _, _, _ = train(rank, world, 3, False, steps=12)
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ea = ElasticAveraging(opt, alpha=0.9 / world, tau=3)
    for step in range(12):
        with model.no_sync():
            local_step(model, opt, rank, step)
        ea.step()
    for a, b in zip(plain, model.module.parameters()):
        assert torch.equal(a, b.detach())


def test_elastic_averaging_under_ddp_no_sync():
    run_ranks(_with_ddp_no_sync, 2)
