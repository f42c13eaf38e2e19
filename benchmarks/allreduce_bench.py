"""Allreduce sweep, ddl against gloo in the same run, reported as nccl-tests does.

    python benchmarks/allreduce_bench.py --world-size 2

Per message size: time per op (median over rounds, after warm-up), algbw = bytes / time,
busbw = algbw * 2(P-1)/P, and ddl/gloo ratios (busbw ratio > 1 and time ratio < 1 favour ddl).
Both backends run in the same processes on the same tensors, interleaved size by size, so
machine noise hits both alike.
"""

import argparse
import os
import statistics
import sys
import time

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
    """Median seconds per allreduce over `rounds` rounds sized to fit the time budget."""
    # Warm-up (a fixed count: every rank must issue the same collectives), timed to size rounds.
    warm = 20 if tensor.numel() * 4 <= 1 << 20 else 3
    start = time.perf_counter()
    for _ in range(warm):
        dist.all_reduce(tensor, group=group)
    per_op = (time.perf_counter() - start) / warm
    iters = max(1, min(5000, int(budget_s / rounds / per_op)))
    # Everyone must run the same number of iterations: take rank 0's.
    count = torch.tensor([iters], dtype=torch.int64)
    dist.broadcast(count, 0, group=group)
    iters = int(count.item())
    samples = []
    for _ in range(rounds):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor, group=group)
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def worker(rank, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ddl  # noqa: F401  registers 'ddl'

    dist.init_process_group("ddl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=args.world_size)
    groups = {"gloo": dist.new_group(backend="gloo"), "ddl": dist.group.WORLD}
    p = args.world_size
    factor = 2 * (p - 1) / p if p > 1 else 1
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        n = max(1, nbytes // 4)
        tensor = torch.ones(n, dtype=torch.float32)
        result = {}
        for name in args.order:
            t = time_op(groups[name], tensor, args.rounds, args.budget)
            result[name] = t
        rows.append((n * 4, result))
        if rank == 0:
            g, d = result["gloo"], result["ddl"]
            algbw = lambda t: n * 4 / t / 1e9  # noqa: E731
            print(f"{human(n * 4):>9} | {g * 1e6:10.1f} {algbw(g) * factor:8.3f} | "
                  f"{d * 1e6:10.1f} {algbw(d) * factor:8.3f} | {g / d:7.2f}x {d / g:7.3f}",
                  flush=True)
    dist.destroy_process_group()
    return rows


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
    args = parser.parse_args()
    args.order = ["gloo", "ddl"]
    p = args.world_size
    print(f"allreduce, float32, {p} ranks, torch {torch.__version__}; "
          f"busbw = algbw * 2(P-1)/P in GB/s; ratio = ddl/gloo busbw, time ratio = ddl/gloo time")
    print(f"{'size':>9} | {'gloo us':>10} {'busbw':>8} | {'ddl us':>10} {'busbw':>8} | "
          f"{'busbw x':>8} {'time':>7}")
    mp.start_processes(worker, args=(args,), nprocs=p, start_method="spawn")


if __name__ == "__main__":
    sys.exit(main())
