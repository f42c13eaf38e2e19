"""Synchronous elastic averaging (EASGD: Zhang, Choromanska and LeCun, "Deep learning with Elastic
Averaging SGD", NeurIPS 2015; its synchronous form as You et al. run it at scale).

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    easgd = torch_ddl.optim.ElasticAveraging(opt, alpha=0.9 / world, tau=4)
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); easgd.step()
    with easgd.centre_weights():   # evaluate and save the centre
        evaluate(model)

Each rank steps its own model with its own gradients (no gradient allreduce). Every `tau` steps
one allreduce: each rank computes delta = alpha (x - c) for its parameters x and the centre c
(kept on every rank, identical everywhere), moves x <- x - delta, and the centre moves by the sum
of every rank's delta.

DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models",
arXiv:2311.08105) and Streaming DiLoCo (Douillard et al., "Streaming DiLoCo with overlapping
communication", arXiv:2501.18512):

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diloco = torch_ddl.optim.DiLoCo(opt, H=50, outer_lr=0.7, outer_momentum=0.9)
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); diloco.step()

H inner steps of any optimizer on each rank's own data, then one outer step: the pseudo-gradient
(the parameters at the last outer step minus the parameters now) is averaged over the ranks and
taken by SGD with Nesterov momentum on the global parameters, which every rank then adopts.
fragments > 1 syncs the parameters in fragments whose outer steps are spread over the H steps;
overlap k lets a fragment's exchange run during the k inner steps after it started.
"""

import contextlib
import math

import torch
import torch.distributed as dist

__all__ = ["AsyncElasticAveraging", "DiLoCo", "ElasticAveraging"]


def _parameters(optimizer):
    """The optimizer's parameters, each once, in the order its groups hold them."""
    seen, params = set(), []
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


@contextlib.contextmanager
def _holding(params, values):
    """Within it each of `params` holds its tensor of `values`; their own values come back
    after."""
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)


class _Wraps:
    """What a wrapper passes through to the optimizer it wraps (self.optimizer)."""

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        return self.optimizer.param_groups


class ElasticAveraging(_Wraps):
    """Wraps `optimizer`; call `step()` where you called `optimizer.step()`.

    alpha: the elastic pull, 0 < alpha and alpha x world size <= 1 (beyond it the centre
    overshoots the mean of the ranks). tau: local steps between two averagings. overlap: the
    allreduce of one averaging runs while the next local step computes; the centre takes its sum
    at the next `step()` (before any later averaging reads it), so the parameters are the same as
    without overlap, bit for bit. The parameters of each dtype are averaged as one flat buffer (in
    shared memory where the group's backend is ddl, so that a host's ranks reduce it in place).
    At construction every rank takes rank 0's parameters, and the centre starts there.
    """

    def __init__(self, optimizer, alpha, tau, group=None, overlap=False):
        if not dist.is_initialized():
            raise RuntimeError("ElasticAveraging: torch.distributed is not initialised")
        world = dist.get_world_size(group)
        if not isinstance(tau, int) or isinstance(tau, bool) or tau < 1:
            raise ValueError(f"ElasticAveraging: tau must be an integer >= 1, got {tau!r}")
        if not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(f"ElasticAveraging: alpha must be a positive number, got {alpha!r}")
        if alpha * world > 1 + 1e-12:
            raise ValueError(f"ElasticAveraging: alpha x world size = {alpha} x {world} = "
                             f"{alpha * world:g} > 1: the centre would overshoot the ranks' "
                             f"mean; take alpha <= {1 / world:g}")
        self.optimizer = optimizer
        self.alpha, self.tau, self.group, self.overlap = float(alpha), tau, group, overlap
        self.steps = 0
        self.bytes_communicated = 0  # by this rank's allreduces (their payload)
        self._pending = None
        params = _parameters(optimizer)
        for p in params:
            if not p.is_floating_point():
                raise TypeError(f"ElasticAveraging: a parameter of dtype {p.dtype} cannot be "
                                "averaged")
        self._buckets = []  # per (device, dtype): params, flat centre, flat delta
        for key in dict.fromkeys((p.device, p.dtype) for p in params):
            members = [p for p in params if (p.device, p.dtype) == key]
            count = sum(p.numel() for p in members)
            delta = self._buffer(count, key[1], key[0])
            self._flatten(members, delta)
            dist.broadcast(delta, src=dist.get_global_rank(group, 0) if group else 0,
                           group=group)
            self._unflatten(delta, members, lambda p, v: p.copy_(v))
            self._buckets.append((members, delta.clone(), delta))

    def _buffer(self, count, dtype, device):
        if device.type == "cpu" and dist.get_backend(self.group) == "ddl":
            import torch_ddl

            return torch_ddl.empty_shared(count, dtype=dtype)
        return torch.empty(count, dtype=dtype, device=device)

    @staticmethod
    def _flatten(params, flat):
        at = 0
        for p in params:
            flat[at:at + p.numel()].copy_(p.detach().reshape(-1))
            at += p.numel()

    @staticmethod
    def _unflatten(flat, params, apply):
        at = 0
        with torch.no_grad():
            for p in params:
                apply(p, flat[at:at + p.numel()].view_as(p))
                at += p.numel()

    def step(self, closure=None):
        """The wrapped optimizer's step, then (every tau-th step) the averaging."""
        loss = self.optimizer.step(closure)
        self.steps += 1
        self.synchronize()
        if self.steps % self.tau == 0:
            self._average()
        return loss

    def _average(self):
        works = []
        for params, centre, delta in self._buckets:
            self._flatten(params, delta)  # x
            delta.sub_(centre).mul_(self.alpha)  # delta = alpha (x - c)
            self._unflatten(delta, params, lambda p, d: p.sub_(d))  # x <- x - delta
            works.append(dist.all_reduce(delta, group=self.group, async_op=True))
            self.bytes_communicated += delta.numel() * delta.element_size()
        self._pending = works
        if not self.overlap:
            self.synchronize()

    def synchronize(self):
        """Waits for an averaging in flight and moves the centre by its sum."""
        if self._pending is None:
            return
        works, self._pending = self._pending, None
        for work, (_, centre, delta) in zip(works, self._buckets):
            work.wait()
            centre.add_(delta)

    def rebind(self, group):
        """Goes on over `group` after a fault (the group dist.shrink_group returned; None: the
        default group, which shrink_group of the default group replaces). An averaging in flight
        is dropped: its ranks' parameters keep the pull they took, and the centre is taken from
        the group's first rank, so that every survivor holds the same one. Collective over
        `group`; alpha stays."""
        pending, self._pending = self._pending, None
        for work in pending or []:
            try:
                work.wait()
            except RuntimeError:
                pass  # the old group's failure, already seen by the caller
        self.group = group
        src = dist.get_global_rank(group, 0) if group is not None else 0
        for _, centre, _ in self._buckets:
            dist.broadcast(centre, src=src, group=group)

    def centre(self):
        """The centre's values, one tensor per parameter (views of the flat centre)."""
        self.synchronize()
        out = []
        for params, centre, _ in self._buckets:
            at = 0
            for p in params:
                out.append(centre[at:at + p.numel()].view_as(p))
                at += p.numel()
        return out

    def centre_weights(self):
        """A context within which the parameters hold the centre (to evaluate or save it); they
        are restored after."""
        return _holding([p for params, _, _ in self._buckets for p in params], self.centre())

    def state_dict(self):
        self.synchronize()
        return {"optimizer": self.optimizer.state_dict(),
                "centre": [centre.clone() for _, centre, _ in self._buckets],
                "steps": self.steps, "alpha": self.alpha, "tau": self.tau}

    def load_state_dict(self, state):
        self.synchronize()
        centres = state["centre"]
        if len(centres) != len(self._buckets) or any(
                c.shape != centre.shape or c.dtype != centre.dtype
                for c, (_, centre, _) in zip(centres, self._buckets)):
            raise ValueError("ElasticAveraging.load_state_dict: the saved centre is not of these "
                             "parameters (" + ", ".join(f"{tuple(c.shape)} {c.dtype}"
                                                        for c in centres) + " saved)")
        self.optimizer.load_state_dict(state["optimizer"])
        for c, (_, centre, _) in zip(centres, self._buckets):
            centre.copy_(c)
        self.steps = int(state["steps"])


def _positive_int(name, value, least):
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"DiLoCo: {name} must be an integer >= {least}, got {value!r}")


def _cut(params, fragments):
    """Whole parameters, in order, in `fragments` runs of about equal element counts."""
    total = sum(p.numel() for p in params)
    runs, current, done = [], [], 0
    for i, p in enumerate(params):
        current.append(p)
        done += p.numel()
        left_params, left_runs = len(params) - i - 1, fragments - len(runs) - 1
        if left_runs > 0 and (done * fragments >= (len(runs) + 1) * total
                              or left_params == left_runs):
            runs.append(current)
            current = []
    runs.append(current)
    return runs


class DiLoCo(_Wraps):
    """Wraps `optimizer` (the inner one); call `step()` where you called `optimizer.step()`.

    H: inner steps between two outer steps of a fragment. outer_lr, outer_momentum, nesterov: the
    outer optimizer, SGD as torch.optim.SGD steps it (the paper's 0.7, 0.9 and Nesterov).

    fragments: the parameters cut, in order and whole, into this many runs of about equal size.
    Fragment f takes its outer steps at inner steps t = s_f, s_f + H, ... with s_f =
    round((f + 1) H / fragments), so the exchanges spread over the H steps (Streaming DiLoCo);
    with one fragment, every H steps.

    overlap: the exchange a fragment starts at step t is taken k = overlap inner steps later (0 <=
    k < H): its allreduce runs while those steps compute. The pseudo-gradient is the one of step
    t; once the outer step is taken, each rank's fragment becomes mixing x its own parameters +
    (1 - mixing) x the new global ones (Streaming DiLoCo's merge; with overlap 0 every rank takes
    the global ones, whatever mixing is).

    wire_dtype: None sends the pseudo-gradients as float32; torch.bfloat16, torch.float16 or
    torch.int8 sends them narrowed and sums them in float32 (torch_ddl.compress: an exchange that
    blocks, so overlap then only delays the step that takes it).

    What it guarantees: the global parameters and the outer momentum are the same bits on every
    rank after every outer step (each is computed from the same averaged pseudo-gradient); with
    overlap 0, so are the parameters right after it. At construction every rank takes rank 0's
    parameters. The outer state is float32 whatever the parameters' dtype.
    """

    def __init__(self, optimizer, H, outer_lr=0.7, outer_momentum=0.9, nesterov=True,
                 fragments=1, overlap=0, mixing=0.5, wire_dtype=None, group=None):
        from . import compress

        if not dist.is_initialized():
            raise RuntimeError("DiLoCo: torch.distributed is not initialised")
        _positive_int("H", H, 1)
        _positive_int("fragments", fragments, 1)
        _positive_int("overlap", overlap, 0)
        if fragments > H:
            raise ValueError(f"DiLoCo: fragments ({fragments}) must be at most H ({H}): each "
                             "fragment takes its outer step at its own inner step")
        if overlap >= H:
            raise ValueError(f"DiLoCo: overlap ({overlap}) must be below H ({H}): a fragment's "
                             "exchange ends before its next one starts")
        if not isinstance(outer_lr, (int, float)) or not math.isfinite(outer_lr) or outer_lr <= 0:
            raise ValueError(f"DiLoCo: outer_lr must be a positive number, got {outer_lr!r}")
        if not isinstance(outer_momentum, (int, float)) or not 0 <= outer_momentum < 1:
            raise ValueError(f"DiLoCo: outer_momentum must be in [0, 1), got {outer_momentum!r}")
        if nesterov and outer_momentum == 0:
            raise ValueError("DiLoCo: nesterov needs outer_momentum > 0")
        if not isinstance(mixing, (int, float)) or not 0 <= mixing <= 1:
            raise ValueError(f"DiLoCo: mixing must be in [0, 1], got {mixing!r}")
        if wire_dtype is not None and wire_dtype not in compress.WIRE_DTYPES:
            raise ValueError(f"DiLoCo: wire_dtype {wire_dtype} is not None or one of "
                             f"{', '.join(str(d) for d in compress.WIRE_DTYPES)}")
        params = _parameters(optimizer)
        if not params:
            raise ValueError("DiLoCo: the optimizer has no parameters")
        for p in params:
            if not p.is_floating_point():
                raise TypeError(f"DiLoCo: a parameter of dtype {p.dtype} cannot be averaged")
        if len({p.device for p in params}) > 1:
            raise ValueError("DiLoCo: the parameters are on several devices ("
                             + ", ".join(sorted({str(p.device) for p in params})) + ")")
        if fragments > len(params):
            raise ValueError(f"DiLoCo: fragments ({fragments}) must be at most the number of "
                             f"parameters ({len(params)}): a fragment holds whole parameters")
        self.optimizer, self.group = optimizer, group
        self.H, self.outer_lr, self.outer_momentum = H, float(outer_lr), float(outer_momentum)
        self.nesterov, self.overlap, self.mixing = bool(nesterov), overlap, float(mixing)
        self.wire_dtype, self.world = wire_dtype, dist.get_world_size(group)
        self.steps = 0
        self.outer_steps = 0  # fragments' outer steps taken, all fragments together
        self.bytes_communicated = 0  # payload this rank handed to its exchanges, in wire format
        device = params[0].device
        shared = (device.type == "cpu" and wire_dtype is None
                  and dist.get_backend(group) == "ddl")
        self._fragments = []
        for f, members in enumerate(_cut(params, fragments)):
            count = sum(p.numel() for p in members)
            if shared:
                import torch_ddl

                delta = torch_ddl.empty_shared(count, dtype=torch.float32)
            else:
                delta = torch.empty(count, dtype=torch.float32, device=device)
            ElasticAveraging._flatten(members, delta)
            dist.broadcast(delta, src=dist.get_global_rank(group, 0) if group else 0, group=group)
            ElasticAveraging._unflatten(delta, members, lambda p, v: p.copy_(v))
            self._fragments.append({
                "params": members, "delta": delta, "global": delta.clone(),
                "momentum": torch.zeros_like(delta), "first": round((f + 1) * H / fragments),
                "pending": None})

    def step(self, closure=None):
        """The inner optimizer's step, then the exchanges due at this step."""
        loss = self.optimizer.step(closure)
        self.steps += 1
        for frag in self._fragments:
            pending = frag["pending"]
            if pending is not None and pending[1] <= self.steps:
                self._finish(frag)
        for frag in self._fragments:
            t = self.steps - frag["first"]
            if t >= 0 and t % self.H == 0:
                self._start(frag)
                if self.overlap == 0:
                    self._finish(frag)
        return loss

    def _start(self, frag):
        from . import compress

        delta = frag["delta"]
        ElasticAveraging._flatten(frag["params"], delta)  # x
        torch.sub(frag["global"], delta, out=delta)  # pseudo-gradient: global - x
        if self.wire_dtype is None:
            work = dist.all_reduce(delta, group=self.group, async_op=True)
            self.bytes_communicated += delta.numel() * 4
        else:
            compress.all_reduce(delta, self.wire_dtype, "sum", self.group)
            work = None
            self.bytes_communicated += compress.payload_bytes(delta.numel(), self.wire_dtype,
                                                              self.world)
        frag["pending"] = (work, self.steps + self.overlap)

    def _finish(self, frag):
        work, _ = frag["pending"]
        frag["pending"] = None
        if work is not None:
            work.wait()
        delta, glob, momentum = frag["delta"], frag["global"], frag["momentum"]
        delta.div_(self.world)  # the averaged pseudo-gradient
        # torch.optim.SGD's step (dampening 0) on the global parameters.
        if self.outer_momentum > 0:
            momentum.mul_(self.outer_momentum).add_(delta)
            update = delta.add_(momentum, alpha=self.outer_momentum) if self.nesterov else momentum
        else:
            update = delta
        glob.sub_(update, alpha=self.outer_lr)
        keep = self.mixing if self.overlap > 0 else 0.0
        if keep == 0.0:
            ElasticAveraging._unflatten(glob, frag["params"], lambda p, g: p.copy_(g))
        else:
            ElasticAveraging._unflatten(
                glob, frag["params"], lambda p, g: p.mul_(keep).add_(g.to(p.dtype), alpha=1 - keep))
        self.outer_steps += 1

    def synchronize(self):
        """Waits for the exchanges in flight (they are still taken at their own step)."""
        for frag in self._fragments:
            pending = frag["pending"]
            if pending is not None and pending[0] is not None:
                pending[0].wait()
                frag["pending"] = (None, pending[1])

    def rebind(self, group):
        """Goes on over `group` after a fault (the group dist.shrink_group returned; None: the
        default group, which shrink_group of the default group replaces). Exchanges in flight are
        dropped (each rank's fragment stays as it is until its next outer step), and the outer
        state (global parameters, momentum, outer steps) is taken from the group's first rank, so
        that survivors that did and did not take the last outer step agree. Collective over
        `group`; the average is then over its ranks."""
        for frag in self._fragments:
            pending, frag["pending"] = frag["pending"], None
            if pending is not None and pending[0] is not None:
                try:
                    pending[0].wait()
                except RuntimeError:
                    pass  # the old group's failure, already seen by the caller
        self.group, self.world = group, dist.get_world_size(group)
        src = dist.get_global_rank(group, 0) if group is not None else 0
        count = torch.tensor([self.outer_steps], dtype=torch.int64,
                             device=self._fragments[0]["global"].device)
        dist.broadcast(count, src=src, group=group)
        self.outer_steps = int(count.item())
        for frag in self._fragments:
            dist.broadcast(frag["global"], src=src, group=group)
            dist.broadcast(frag["momentum"], src=src, group=group)

    def global_parameters(self):
        """The global parameters, one float32 tensor per parameter (views of the flat state)."""
        out = []
        for frag in self._fragments:
            at = 0
            for p in frag["params"]:
                out.append(frag["global"][at:at + p.numel()].view_as(p))
                at += p.numel()
        return out

    def global_weights(self):
        """A context within which the parameters hold the global ones (to evaluate or save
        them); they are restored after."""
        return _holding([p for frag in self._fragments for p in frag["params"]],
                        self.global_parameters())

    def state_dict(self):
        """The inner optimizer's state, the outer state, and any exchange in flight (its summed
        pseudo-gradient and the step that takes it), so that a run resumed from it takes the
        same steps."""
        self.synchronize()
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps,
                "outer_steps": self.outer_steps,
                "fragments": [{"global": f["global"].clone(), "momentum": f["momentum"].clone(),
                               "pending": None if f["pending"] is None else
                               (f["delta"].clone(), f["pending"][1])}
                              for f in self._fragments]}

    def load_state_dict(self, state):
        saved = state["fragments"]
        if len(saved) != len(self._fragments) or any(
                s["global"].shape != f["global"].shape for s, f in zip(saved, self._fragments)):
            raise ValueError("DiLoCo.load_state_dict: the saved state is not of these parameters "
                             "and fragments (" + ", ".join(str(tuple(s["global"].shape))
                                                           for s in saved) + " saved)")
        self.synchronize()
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps, self.outer_steps = int(state["steps"]), int(state["outer_steps"])
        for s, f in zip(saved, self._fragments):
            f["global"].copy_(s["global"])
            f["momentum"].copy_(s["momentum"])
            f["pending"] = None
            if s["pending"] is not None:
                f["delta"].copy_(s["pending"][0])
                f["pending"] = (None, int(s["pending"][1]))


class AsyncElasticAveraging(_Wraps):
    """Asynchronous EASGD (Zhang, Choromanska and LeCun, NeurIPS 2015; You, Buluç and Demmel,
    SC'17) over one-sided windows: the centre lives on one rank (`centre_rank`), and a worker
    exchanges with it every `tau` of its own steps without any collective and without waiting
    for the other workers. Wraps `optimizer`; call `step()` where you called `optimizer.step()`,
    and `close()` on every rank at the end.

    A worker's elastic step: e = alpha (x - c), x <- x - e, where c is its copy of the centre;
    e goes to the centre rank, which adds it to the centre (with momentum > 0, as momentum
    SGD's step: u <- momentum u + e, centre <- centre + u: Async MEASGD) and answers with the
    centre as it now is, which becomes the worker's copy. A worker whose previous difference has
    not been answered yet (the centre rank has not stepped since, or the link is slow) skips
    that elastic step and goes on: a worker never waits (`skipped` counts them). The centre rank
    takes the differences that arrived at each of its own steps, and makes its own elastic step
    against the centre itself.

    What it guarantees: every difference reaches the centre exactly once (none is lost, none is
    taken twice), each worker's in its order; the centre rank applies one at a time; a worker's
    copy is the centre just after its own last difference was added, so it lags the centre by
    the differences others sent since. Not deterministic: the order in which the centre takes
    the workers' differences depends on timing. `close()` (collective) sends every worker's last
    difference, waits for the answers, and gives every rank the final centre.

    hogwild=True (Hogwild EASGD): every rank on the centre's host reads the centre straight out of
    the centre rank's memory and adds its difference there itself, with no lock and no answer:
    two workers' additions may interleave element by element, so a difference can be partly lost
    and a read can mix the centre before and after another's addition. Needs every rank on one
    host (the centre's memory mapped into each); refused otherwise.

    Memory: every rank registers a window of (world + 1) rows of (parameters + 2, rounded up to
    even) float32 values: the centre or its copy, and one inbox per worker, used on the centre
    rank.

    Faults: a lost rank fails the survivors' next step naming it (the centre rank's, or a
    worker's exchange with a lost centre; the others through the group's failure); they shrink
    the group and call rebind() (see there for what is kept).
    """

    def __init__(self, optimizer, alpha, tau, momentum=0.0, hogwild=False, centre_rank=0,
                 group=None):
        if not dist.is_initialized():
            raise RuntimeError("AsyncElasticAveraging: torch.distributed is not initialised")
        if dist.get_backend(group) != "ddl":
            raise ValueError("AsyncElasticAveraging: the group's backend is "
                             f"{dist.get_backend(group)}, not ddl (it needs one-sided windows)")
        world = dist.get_world_size(group)
        if not isinstance(tau, int) or isinstance(tau, bool) or tau < 1:
            raise ValueError(f"AsyncElasticAveraging: tau must be an integer >= 1, got {tau!r}")
        if not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
            raise ValueError(f"AsyncElasticAveraging: alpha must be in (0, 1], got {alpha!r}")
        if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"AsyncElasticAveraging: momentum must be in [0, 1), got "
                             f"{momentum!r}")
        if not isinstance(centre_rank, int) or not 0 <= centre_rank < world:
            raise ValueError(f"AsyncElasticAveraging: centre_rank {centre_rank!r} is not a rank "
                             f"of the group (0 .. {world - 1})")
        if hogwild and momentum:
            raise ValueError("AsyncElasticAveraging: hogwild takes no momentum (no rank owns the "
                             "centre's updates)")
        params = _parameters(optimizer)
        for p in params:
            if not p.is_floating_point() or p.device.type != "cpu":
                raise TypeError(f"AsyncElasticAveraging: a parameter of dtype {p.dtype} on "
                                f"{p.device}: it averages float CPU parameters")
        import torch_ddl

        self.optimizer, self.group, self.world = optimizer, group, world
        self.alpha, self.tau, self.momentum = float(alpha), tau, float(momentum)
        self.hogwild, self.centre_rank = bool(hogwild), centre_rank
        self.rank = dist.get_rank(group)
        self.steps = 0
        self.sent = 0  # elastic steps this rank made
        self.skipped = 0  # elastic steps skipped, the last exchange not answered yet
        self.exchanges = 0  # differences it sent to the centre (or, on the centre rank, took)
        self.bytes_communicated = 0  # payload of the puts this rank made
        self._params = params
        n = sum(p.numel() for p in params)
        self._n, self._row = n, 2 + n + n % 2  # [version or kind (int64) | values | pad]
        self._table = torch_ddl.empty_shared((world + 1) * self._row)
        self._rows = self._table.view(world + 1, self._row)
        x = torch.empty(n)
        ElasticAveraging._flatten(params, x)
        src = dist.get_global_rank(group, centre_rank) if group else centre_rank
        dist.broadcast(x, src=src, group=group)  # every rank starts at the centre rank's
        ElasticAveraging._unflatten(x, params, lambda p, v: p.copy_(v))
        self._rows[0, 2:2 + n].copy_(x)
        self._meta(0).fill_(0)
        self._copy = x.clone()  # this rank's copy of the centre (the centre itself: see _centre)
        self._pending = torch.zeros(n)  # differences not sent yet
        self._inflight = torch.zeros(n)  # the last one sent (sent again if a fault lost it)
        self._sends = 0  # differences sent to the centre rank since it became the centre
        self._taken = [0] * world  # on the centre rank: differences taken from each worker
        self.copy_version = 0  # differences in the centre when this rank's copy was made
        self._velocity = torch.zeros(n) if self.rank == centre_rank else None
        self._window = torch_ddl.new_window(self._table, group=group)
        self._closed = False
        self._answer = None  # this worker's wait for the centre's answer
        self._outgoing = []  # this worker's last put and signal
        self._answers = torch.empty(world, self._row) if self.rank == centre_rank else None
        self._answering = {}  # on the centre rank: worker -> its last answer's put and signal
        self._requests = {}  # on the centre rank: worker -> its wait for the next difference
        if hogwild:
            try:
                self._centre_view = self._window.map_remote_tensor(centre_rank).view(
                    world + 1, self._row)
            except Exception as error:
                raise ValueError("AsyncElasticAveraging: hogwild needs the centre rank's memory "
                                 f"mapped here, and it cannot be: {error}") from error
        elif self.rank == centre_rank:
            self._requests = {j: self._window.wait_signal(j, True) for j in range(world)
                              if j != centre_rank}
        dist.barrier(group=group)

    def _meta(self, row, rows=None):
        return (self._rows if rows is None else rows)[row, :2].view(torch.int64)

    def step(self, closure=None):
        """The wrapped optimizer's step; then, on the centre rank, the differences that arrived;
        and every tau-th step this rank's elastic step."""
        if self._closed:
            raise RuntimeError("AsyncElasticAveraging: step() after close()")
        loss = self.optimizer.step(closure)
        self.steps += 1
        if self.rank == self.centre_rank and not self.hogwild:
            self._serve(block=False)
        if self.steps % self.tau == 0:
            self._elastic()
        return loss

    def _elastic(self):
        x = torch.empty(self._n)
        ElasticAveraging._flatten(self._params, x)
        if self.hogwild:
            centre = self._centre_view[0, 2:2 + self._n]
            e = (x - centre).mul_(self.alpha)  # read without a lock
            centre.add_(e)  # added without a lock
            self._meta(0, self._centre_view).add_(1)
            self.bytes_communicated += self._n * 4
        elif self.rank == self.centre_rank:
            e = (x - self._rows[0, 2:2 + self._n]).mul_(self.alpha)
            self._take(e)
            self.exchanges += 1
        else:
            # The pull and the difference kept first: an exchange that fails leaves the
            # difference to be sent after rebind(), and the parameters as they should be.
            self._collect_answer(block=False)
            if self._answer is not None:
                # The last exchange is not answered yet: this one is skipped rather than waited
                # for. (Adding it to the next one instead would pull the centre by the sum of
                # several differences made against the same stale copy: past the worker itself
                # once they add up to more than it, which is what slow links make happen.)
                self.skipped += 1
                return
            e = (x - self._copy).mul_(self.alpha)
            ElasticAveraging._unflatten(e, self._params, lambda p, d: p.sub_(d))
            self._pending.add_(e)
            self.sent += 1
            self._send(last=False)
            return
        ElasticAveraging._unflatten(e, self._params, lambda p, d: p.sub_(d))
        self.sent += 1

    def _send(self, last):
        # The put and its signal run on while this rank steps on: its row is not written again
        # before the answer, which comes after the centre rank took the row.
        self._finish_outgoing()
        row = self._rows[1 + self.rank]
        row[2:2 + self._n].copy_(self._pending)
        self._meta(1 + self.rank).fill_(-1 if last else 1)
        self._outgoing = [
            self._window.put(row, self.centre_rank, (1 + self.rank) * self._row, True),
            self._window.signal(self.centre_rank, True)]
        # Sent (the centre takes it once the signal arrives): from here on it is in flight.
        self._inflight.copy_(self._pending)
        self._pending.zero_()
        self._sends += 1
        self.exchanges += 1
        self.bytes_communicated += self._row * 4
        self._answer = self._window.wait_signal(self.centre_rank, True)

    def _finish_outgoing(self):
        """Waits for this worker's last put and signal (long done once their answer came): a
        failure of theirs is raised here."""
        outgoing, self._outgoing = self._outgoing, []
        for work in outgoing:
            work.wait()

    @staticmethod
    def _arrived(work, block):
        """Whether the signal `work` waits for arrived (block: waits for it). A wait that timed
        out is not an error here (the peer may take longer than the group's timeout between two
        exchanges): the caller waits again, and the signal, when it comes, is taken then."""
        if not (block or work.is_completed()):
            return False
        try:
            work.wait()
        except RuntimeError as error:
            if "Timed out" not in str(error):
                raise
            return False
        return True

    def _collect_answer(self, block):
        while self._answer is not None and (block or self._answer.is_completed()):
            if self._arrived(self._answer, block):
                self._answer = None
                self._copy.copy_(self._rows[0, 2:2 + self._n])  # put there before the answer
                self.copy_version = int(self._meta(0).item())
            else:  # timed out: wait again
                self._answer = self._window.wait_signal(self.centre_rank, True)

    def _take(self, e):
        """On the centre rank: one difference into the centre."""
        centre = self._rows[0, 2:2 + self._n]
        if self.momentum:
            self._velocity.mul_(self.momentum).add_(e)
            centre.add_(self._velocity)
        else:
            centre.add_(e)
        self._meta(0).add_(1)

    def _serve(self, block):
        """On the centre rank: takes the differences that arrived (block: every worker's, until
        each sent its last), answering each with the centre."""
        for j in sorted(self._requests):
            request = self._requests[j]
            while request is not None and (block or request.is_completed()):
                if not self._arrived(request, block):
                    request = self._window.wait_signal(j, True)  # timed out: wait again
                    continue
                self._take(self._rows[1 + j, 2:2 + self._n])
                last = int(self._meta(1 + j).item()) < 0
                self._taken[j] += 1
                # The answer from a copy of the centre that stays as it is until worker j's
                # next difference, which it sends only once the answer landed.
                for work in self._answering.pop(j, ()):
                    work.wait()  # the last answer to j (landed: j sent again after it)
                self._answers[j].copy_(self._rows[0])
                self._answering[j] = (self._window.put(self._answers[j], j, 0, True),
                                      self._window.signal(j, True))
                self.bytes_communicated += self._row * 4
                request = None if last else self._window.wait_signal(j, True)
                if not block:
                    break
            if request is None:
                del self._requests[j]
            else:
                self._requests[j] = request

    def rebind(self, group):
        """Goes on over `group` after a fault (the group dist.shrink_group returned; None: the
        default group, which shrink_group of the default group replaces). Collective over
        `group`; a new window is made on it (the old one, whose group failed, is left to that
        group's end).

        The centre rank survived: it stays the centre, with its centre, momentum and count, and a
        worker's difference that it had sent and the centre had not taken goes again: none is
        lost. The centre rank was lost: the group's first rank becomes the centre, starting from
        the freshest copy any survivor holds (the highest copy_version); the differences the lost
        centre took after that copy was made, and those in flight to it, are lost, and its
        momentum starts again from zero. hogwild: the centre as the new group's first rank sees
        it, if it was the centre; the freshest copy otherwise."""
        if self._closed:
            raise RuntimeError("AsyncElasticAveraging: rebind() after close()")
        import torch_ddl

        old_rank, old_centre = self.rank, self.centre_rank
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        mine = torch.tensor([old_rank, self.copy_version], dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        old_of = [int(t[0]) for t in every]
        n = self._n
        if old_centre in old_of:
            centre = old_of.index(old_centre)
            if rank == centre:
                live = self._centre_view if self.hogwild else self._rows
                values = live[0, 2:2 + n].clone()
                version = self._meta(0, live).clone()
                velocity = self._velocity if self._velocity is not None else torch.zeros(n)
                taken = torch.tensor(self._taken, dtype=torch.int64)
            else:
                values, version = torch.empty(n), torch.empty(1, dtype=torch.int64)
                velocity, taken = torch.empty(n), torch.empty(len(self._taken), dtype=torch.int64)
            src = dist.get_global_rank(group, centre) if group else centre
            for t in (values, version, velocity, taken):
                dist.broadcast(t, src=src, group=group)
            if rank != centre and self._sends > int(taken[old_rank]):
                self._pending.add_(self._inflight)  # the centre never took it: it goes again
        else:
            # (hogwild: the lost centre's memory is still mapped here, and holds the centre.)
            freshest = 0 if self.hogwild else max(range(world),
                                                  key=lambda r: (int(every[r][1]), -r))
            own = self._centre_view[0, 2:2 + n] if self.hogwild else self._copy
            values = own.clone() if rank == freshest else torch.empty(n)
            src = dist.get_global_rank(group, freshest) if group else freshest
            dist.broadcast(values, src=src, group=group)
            version = torch.tensor([int(every[freshest][1])], dtype=torch.int64)
            velocity, centre = torch.zeros(n), 0
        self.group, self.world, self.rank, self.centre_rank = group, world, rank, centre
        self._table = torch_ddl.empty_shared((world + 1) * self._row)
        self._rows = self._table.view(world + 1, self._row)
        self._rows[0, 2:2 + n].copy_(values)
        self._meta(0).copy_(version)
        self._copy.copy_(values)
        self.copy_version = int(version.item())
        self._velocity = velocity.clone() if rank == centre else None
        self._sends, self._taken = 0, [0] * world
        self._answer, self._requests, self._outgoing = None, {}, []
        self._answers = torch.empty(world, self._row) if rank == centre else None
        self._answering = {}
        self._window = torch_ddl.new_window(self._table, group=group)
        if self.hogwild:
            self._centre_view = self._window.map_remote_tensor(centre).view(world + 1, self._row)
        elif rank == centre:
            self._requests = {j: self._window.wait_signal(j, True) for j in range(world)
                              if j != centre}
        dist.barrier(group=group)

    def close(self):
        """Collective: every worker's last difference is sent and taken, and every rank gets the
        final centre (centre() from then on; step() is refused)."""
        if self._closed:
            return
        if not self.hogwild:
            if self.rank == self.centre_rank:
                self._serve(block=True)
                for works in self._answering.values():
                    for work in works:
                        work.wait()
                self._answering = {}
            else:
                self._collect_answer(block=True)
                self._send(last=True)
                self._collect_answer(block=True)
                self._finish_outgoing()
        dist.barrier(group=self.group)
        final = self._centre_view[0, 2:2 + self._n].clone() if self.hogwild else \
            self._rows[0, 2:2 + self._n].clone()
        src = dist.get_global_rank(self.group, self.centre_rank) if self.group else \
            self.centre_rank
        dist.broadcast(final, src=src, group=self.group)
        self._copy.copy_(final)
        version = self._meta(0, self._centre_view if self.hogwild else None).clone()
        dist.broadcast(version, src=src, group=self.group)
        self.version = int(version.item())
        self._window.tensor_deregister()
        self._closed = True

    def centre(self):
        """The centre (this rank's copy of it on a worker before close(); the final one after),
        one tensor per parameter."""
        if self._closed:
            flat = self._copy
        elif self.hogwild:
            flat = self._centre_view[0, 2:2 + self._n]
        else:
            flat = self._rows[0, 2:2 + self._n] if self.rank == self.centre_rank else self._copy
        out, at = [], 0
        for p in self._params:
            out.append(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
        return out

    def centre_weights(self):
        """A context within which the parameters hold the centre() (to evaluate or save it);
        they are restored after."""
        return _holding(self._params, self.centre())
