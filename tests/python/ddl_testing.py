"""Helpers for the multi-process tests: launch ranks with a deadline, make inputs, compare."""

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import pickle
import random
import shutil
import socket
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# torch 2.15 attaches its flight recorder to every group of a backend without one of its own,
# ddl's included, and on a failure writes it to disk from an abort hook (about 1.4 s here, which
# abort() then takes: docs/faults.md). The fault tests measure ddl's own times: not that dump.
os.environ.setdefault("TORCH_FR_DUMP_ON_TIMEOUT", "0")

# ddl's own flight-recorder dumps, which every failed op writes (the fault tests fail many), go
# to a folder of this test run, removed when it ends; tests of the dump name their own files.
if "TORCH_DDL_TRACE_FILE" not in os.environ:
    _traces = tempfile.mkdtemp(prefix="ddl_test_traces_")
    atexit.register(shutil.rmtree, _traces, ignore_errors=True)
    os.environ["TORCH_DDL_TRACE_FILE"] = os.path.join(_traces, "trace_rank_")

# World sizes the collective tests run at: 1 - 4, and those DDL_TEST_MORE_RANKS adds
# (comma-separated, e.g. 6,8 on a machine with the cores for them).
WORLD_SIZES = [1, 2, 3, 4] + [int(p) for p in os.environ.get("DDL_TEST_MORE_RANKS", "").split(",")
                              if p.strip()]

FLOAT_TYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_TYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
ALL_TYPES = FLOAT_TYPES + INT_TYPES + [torch.bool]
OPS = {
    "SUM": dist.ReduceOp.SUM,
    "AVG": dist.ReduceOp.AVG,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "BAND": dist.ReduceOp.BAND,
    "BOR": dist.ReduceOp.BOR,
    "BXOR": dist.ReduceOp.BXOR,
}
SIZES = [0, 1, 7, 1021, 70001]


# Ranks are forked from a server that imported torch once: a spawned process spends about 2.5 s
# of CPU importing it, most of a short test's time on 2 cores. A rank is still a fresh process
# for torch_ddl and the test's module (imported there, after it took the caller's environment).
START_METHOD = "forkserver"
multiprocessing.get_context(START_METHOD).set_forkserver_preload(["torch"])


def _adopt(env, call):
    """In a rank: the caller's environment as it was at the call, then (fn, args) unpickled."""
    os.environ.clear()
    os.environ.update(env)
    # What a process reads from its environment as it starts, read again.
    threshold = env.get("MALLOC_MMAP_THRESHOLD_")
    if threshold is not None:
        ctypes.CDLL(None).mallopt(-3, int(threshold))  # M_MMAP_THRESHOLD
    dist.set_debug_level_from_env()
    return pickle.loads(call)


def _entry(rank, env, call, world_size, init_method):
    fn, args = _adopt(env, call)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ddl  # noqa: F401

    try:
        dist.init_process_group("ddl", init_method=init_method, rank=rank,
                                world_size=world_size)
        fn(rank, world_size, *args)
        dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
        raise


def start_ranks(fn, world_size, init_method, args=()):
    """fn(rank, world_size, *args) in world_size processes over a 'ddl' default group, started
    and not joined (torch.multiprocessing's context)."""
    return mp.start_processes(_entry, args=(dict(os.environ), pickle.dumps((fn, args)),
                                            world_size, init_method),
                              nprocs=world_size, join=False, start_method=START_METHOD)


def run_ranks(fn, world_size, *args, timeout=240):
    """Runs fn(rank, world_size, *args) in world_size processes over a 'ddl' default group.

    Fails (with every rank killed) when a rank raises or the deadline passes.
    """
    with tempfile.TemporaryDirectory() as tmp:
        ctx = start_ranks(fn, world_size, f"file://{os.path.join(tmp, 'store')}", args)
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks did not finish within {timeout} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()


def _spawned(rank, env, call):
    fn, args = _adopt(env, call)
    try:
        fn(rank, *args)
    except Exception:
        traceback.print_exc()
        raise


def spawn(fn, size, args):
    """fn(rank, *args) in `size` processes that start no group themselves (the caller
    joins them); an exception is printed before it ends the process."""
    return mp.start_processes(_spawned, args=(dict(os.environ), pickle.dumps((fn, args))),
                              nprocs=size, join=False, start_method=START_METHOD)


def run_spawned(fn, size, args, want, timeout=120):
    """spawn(), then the exit codes checked against `want` (a rank killed with SIGKILL: -9);
    every process left after the deadline is killed."""
    ctx = spawn(fn, size, args)
    deadline = time.monotonic() + timeout
    try:
        for p in ctx.processes:
            p.join(max(0.1, deadline - time.monotonic()))
        codes = [p.exitcode for p in ctx.processes]
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    assert codes == want, f"exit codes {codes}, want {want}"


def fault_call(op, size):
    """A 4 MiB collective of the default group by name (all_reduce, broadcast, all_gather,
    reduce_scatter; all_reduce_256kib: of 256 KiB), as the fault tests call it again and again."""
    x = torch.ones(1 << 20)
    outs = [torch.empty_like(x) for _ in range(size)]
    calls = {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_reduce_256kib": lambda: dist.all_reduce(x[: 1 << 16]),  # one host: staged
        "broadcast": lambda: dist.broadcast(x, src=0),
        "all_gather": lambda: dist.all_gather(outs, x),
        "reduce_scatter": lambda: dist.reduce_scatter(x[: 1 << 18], [t[: 1 << 18] for t in outs]),
    }
    return calls[op]


def random_fault(trial, shapes):
    """A randomised fault trial's choices, seeded by DDL_FAULT_SEED (default: the current hour)
    and the trial so that a failure can be replayed: the seed, a shape from `shapes` (a world
    size, or ranks per host), its world size, the collective, kill or exit, the victim, the calls
    before it goes and the pause after them (microseconds)."""
    import random
    seed = int(os.environ.get("DDL_FAULT_SEED", str(int(time.time()) // 3600))) * 1000 + trial
    rng = random.Random(seed)
    shape = rng.choice(shapes)
    size = sum(shape) if isinstance(shape, list) else shape
    op = rng.choice(["all_reduce", "broadcast", "all_gather", "reduce_scatter"])
    how = rng.choice(["kill", "exit"])
    victim = rng.randrange(size)
    before, pause_us = rng.randrange(1, 30), rng.randrange(0, 3000)
    return seed, shape, size, op, how, victim, before, pause_us


def ddl_groups_with(setting, values):
    """One ddl group per value of `setting`, each made while the environment holds that value (a
    group reads its settings as it is made); the setting is unset afterwards."""
    import torch_ddl

    groups = {}
    for value in values:
        os.environ[setting] = value
        torch_ddl._C.check_config()
        groups[value] = dist.new_group(backend="ddl")
    del os.environ[setting]
    torch_ddl._C.check_config()
    return groups


def make_input(dtype, op, rank, size, n):
    """Small integers, exact in every dtype, whose reductions over 4 ranks cannot overflow."""
    g = torch.Generator().manual_seed(1000 * rank + 17 * size + n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if op == "PRODUCT":
        return torch.randint(1, 3, (n,), generator=g).to(dtype)
    low = 0 if dtype == torch.uint8 else -20
    return torch.randint(low, 21, (n,), generator=g).to(dtype)


def valid(dtype, op):
    if op in ("BAND", "BOR", "BXOR") and dtype.is_floating_point:
        return False
    return not (op == "AVG" and dtype == torch.bool)


def reference(dtype, op, size, n):
    """The expected allreduce result, computed locally from every rank's input."""
    xs = torch.stack([make_input(dtype, op, r, size, n) for r in range(size)])
    if dtype == torch.bool:
        xs = xs.to(torch.int64)
        out = {"SUM": xs.amax(0), "MAX": xs.amax(0), "BOR": xs.amax(0),
               "PRODUCT": xs.amin(0), "MIN": xs.amin(0), "BAND": xs.amin(0),
               "BXOR": xs.sum(0) % 2}[op]
        return out.bool()
    wide = xs.double() if dtype.is_floating_point else xs.long()
    if op == "SUM":
        out = wide.sum(0)
    elif op == "AVG":
        out = wide.sum(0) / size if dtype.is_floating_point else torch.div(
            wide.sum(0), size, rounding_mode="trunc")
    elif op == "PRODUCT":
        out = wide.prod(0)
    elif op == "MIN":
        out = wide.amin(0)
    elif op == "MAX":
        out = wide.amax(0)
    else:
        out = wide[0].clone()
        for x in wide[1:]:
            out = {"BAND": out & x, "BOR": out | x, "BXOR": out ^ x}[op]
    return out.to(dtype)


def assert_same(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: got {got.dtype}{tuple(got.shape)}, "
                             f"want {want.dtype}{tuple(want.shape)}")
    if got.dtype.is_floating_point:
        tol = {torch.float16: 1e-3, torch.bfloat16: 1e-2}.get(got.dtype, 1e-6)
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if not ok:
        bad = (got.double() - want.double()).abs().argmax().item() if got.numel() else 0
        raise AssertionError(f"{what}: mismatch, e.g. element {bad}: got {got.flatten()[bad]}, "
                             f"want {want.flatten()[bad]}")


# Under a sanitizer (make test-asan-python, test-tsan-python) the allocator is the sanitizer's:
# glibc maps no block of its own for a tensor, which adoption needs (docs/testing.md).
SANITIZED = any(lib in os.environ.get("LD_PRELOAD", "") for lib in ("libasan", "libtsan"))
NO_GLIBC_BLOCKS = "the sanitizer's allocator maps no glibc blocks (adoption)"


def glibc_block(numel, dtype=torch.float32):
    """An empty tensor whose storage glibc mmapped for it (what is adopted). Above the mmap
    threshold glibc still serves a request from a free chunk or the heap's top when one is large
    enough: those are held until glibc has to map a block of its own."""
    import torch_ddl

    if torch_ddl._C.shared_allocator()["installed"]:
        # Its blocks lie in shared segments: no glibc header before them to read (nor memory,
        # at a segment's start). Adoption is for torch's own allocator.
        raise AssertionError("TORCH_DDL_SHARED_ALLOCATOR=1 serves torch's tensors from shared "
                             "memory: there is no glibc block to adopt; run without it")
    held = []
    for _ in range(64):
        t = torch.empty(numel, dtype=dtype)
        header = ctypes.c_size_t.from_address(t.untyped_storage().data_ptr() - 8).value
        if header & 7 == 2:  # the chunk's size field: IS_MMAPPED
            return t
        held.append(t)
    raise AssertionError("glibc mapped no block of its own")


class MemoryCgroup:
    """A memory cgroup (v1 or v2) below this process's own, with a limit. A process joins it by
    writing its PID to `procs` (charges from then on count); peak() is the most it held.
    create() raises OSError where none can be made; remove() once its members have exited."""

    def __init__(self, limit_bytes):
        self.limit = limit_bytes
        self.path = None
        self.version = None

    @staticmethod
    def _parent():
        lines = open("/proc/self/cgroup").read().splitlines()
        for line in lines:  # v1: "N:memory:/path"
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(",") and os.path.isdir("/sys/fs/cgroup/memory"):
                return "v1", "/sys/fs/cgroup/memory" + path
        for line in lines:  # v2: "0::/path", with the memory controller enabled below it
            if line.startswith("0::"):
                for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                    parent = mount + line[3:]
                    try:
                        if "memory" in open(os.path.join(parent, "cgroup.subtree_control")).read():
                            return "v2", parent
                    except OSError:
                        pass
        raise OSError("no memory cgroup controller")

    def create(self):
        self.version, parent = self._parent()
        path = os.path.join(parent, f"torch_ddl_test_{os.getpid()}")
        os.mkdir(path)
        self.path = path
        limit_file = "memory.limit_in_bytes" if self.version == "v1" else "memory.max"
        with open(os.path.join(path, limit_file), "w") as f:
            f.write(str(self.limit))
        self.procs = os.path.join(path, "cgroup.procs")
        return self

    def peak(self):
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        return int(open(os.path.join(self.path, name)).read())

    def remove(self):
        if self.path is None:
            return
        deadline = time.monotonic() + 10  # members that were killed may take a moment to go
        while True:
            try:
                os.rmdir(self.path)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _inputs(rank, step, n=1021):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(-50, 50, (n,), generator=g).to(torch.float32)


def _expected(kind, size, rank, step):
    """What a collective of shrunk_collectives gives `rank`, from every rank's inputs."""
    xs = [_inputs(r, step) for r in range(size)]
    root = step % size
    if kind == "all_reduce":
        return torch.stack(xs).sum(0)
    if kind == "broadcast":
        return xs[root].clone()
    if kind == "all_gather":
        return torch.cat(xs)
    if kind == "reduce_scatter":
        block = xs[0].numel() // size
        return torch.stack(xs).sum(0)[rank * block:(rank + 1) * block]
    if kind == "all_to_all":
        block = xs[0].numel() // size
        return torch.cat([x[rank * block:(rank + 1) * block] for x in xs])
    return torch.stack(xs).sum(0) if rank == root else torch.zeros(0)


def shrunk_collectives(size, rank, gloo, steps=20, ddl=None):
    """20 collectives of every kind on `ddl` (default: the default group), each against gloo on
    the same inputs, or, with `gloo` None (a store that died with its rank), against the result
    computed here from every rank's inputs; `rank` and `size` are of those groups."""
    kinds = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "reduce"]
    for step in range(steps):
        kind = kinds[step % len(kinds)]
        x = _inputs(rank, step)
        results = []
        for group in (ddl, gloo) if gloo is not None else (ddl,):
            t = x.clone()
            if kind == "all_reduce":
                dist.all_reduce(t, group=group)
                results.append(t)
            elif kind == "broadcast":
                dist.broadcast(t, group_src=step % size, group=group)
                results.append(t)
            elif kind == "all_gather":
                outs = [torch.empty_like(t) for _ in range(size)]
                dist.all_gather(outs, t, group=group)
                results.append(torch.cat(outs))
            elif kind == "reduce_scatter":
                out = torch.empty(t.numel() // size)
                dist.reduce_scatter_tensor(out, t[: out.numel() * size], group=group)
                results.append(out)
            elif kind == "all_to_all":
                n = t.numel() // size * size
                out = torch.empty(n)
                dist.all_to_all_single(out, t[:n], group=group)
                results.append(out)
            else:
                dist.reduce(t, group_dst=step % size, group=group)
                results.append(t if rank == step % size else torch.zeros(0))
        if gloo is None:
            results.append(_expected(kind, size, rank, step))
        assert torch.equal(results[0], results[1]), f"{kind} (step {step}) differs from " + (
            "gloo" if gloo is not None else "the expected result")


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(count=1):
    """The first of `count` consecutive ports that nothing on 127.0.0.1 holds now, drawn below
    the kernel's ephemeral range. A port that a process other than the test binds later (a
    store's, a metrics server's) must come from there: an ephemeral one can be handed, before
    that process binds it, to any socket's bind(0) or connect(), a connect to it even to itself
    (TCP's simultaneous open), and the job then waits for a store that never starts."""
    low, draw = 10000, random.SystemRandom()
    high = _ephemeral_low() - count
    for _ in range(200):
        base = draw.randrange(low, high)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + count):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports between {low} and {high + count}")


def _sim_here(rank, args, where):
    """python -m torch_ddl.sim's main in this process, its output and exit code into files."""
    from torch_ddl import sim as command

    with open(where + ".out", "w") as out, open(where + ".err", "w") as err, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = command.main(list(args))
        except SystemExit as exit:
            code = exit.code
        if isinstance(code, str):  # sys.exit(message)
            print(code, file=sys.stderr)
            code = 1
    with open(where + ".code", "w") as f:
        f.write(str(code or 0))


def sim_command(*args, timeout=300, trace=False):
    """python -m torch_ddl.sim's exit code, output lines and error output: main run in a process
    forked from the test server that imported torch (a new interpreter imports it again, 2 - 3 s
    of each run), killed after `timeout` seconds. Without `trace` the simulated ranks keep no
    flight recorder (TORCH_DDL_TRACE_ENTRIES=0)."""
    saved = os.environ.get("TORCH_DDL_TRACE_ENTRIES")
    if not trace:
        os.environ["TORCH_DDL_TRACE_ENTRIES"] = "0"  # the forked process takes this environment
    try:
        return _sim_in_a_process(args, timeout)
    finally:
        if saved is None:
            os.environ.pop("TORCH_DDL_TRACE_ENTRIES", None)
        else:
            os.environ["TORCH_DDL_TRACE_ENTRIES"] = saved


def _sim_in_a_process(args, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        where = os.path.join(tmp, "sim")
        run_spawned(_sim_here, 1, (args, where), want=[0], timeout=timeout)
        with open(where + ".code") as f:
            code = int(f.read())
        with open(where + ".out") as f:
            lines = f.read().strip().splitlines()
        with open(where + ".err") as f:
            return code, lines, f.read()
