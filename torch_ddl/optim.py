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
"""

import contextlib
import math

import torch
import torch.distributed as dist

__all__ = ["ElasticAveraging"]


class ElasticAveraging:
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
        seen, params = set(), []
        for g in optimizer.param_groups:
            for p in g["params"]:
                if id(p) in seen:
                    continue
                seen.add(id(p))
                if not p.is_floating_point():
                    raise TypeError(f"ElasticAveraging: a parameter of dtype {p.dtype} cannot be "
                                    "averaged")
                params.append(p)
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

    @contextlib.contextmanager
    def centre_weights(self):
        """Within it the parameters hold the centre (to evaluate or save it); restored after."""
        self.synchronize()
        saved = [[p.detach().clone() for p in params] for params, _, _ in self._buckets]
        for params, centre, _ in self._buckets:
            self._unflatten(centre, params, lambda p, c: p.copy_(c))
        try:
            yield
        finally:
            with torch.no_grad():
                for (params, _, _), values in zip(self._buckets, saved):
                    for p, v in zip(params, values):
                        p.copy_(v)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

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
