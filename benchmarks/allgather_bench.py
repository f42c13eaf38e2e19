"""all_gather_into_tensor (or reduce_scatter_tensor) on one host: ddl's rings, ddl's Bruck rounds
and gloo, in the same processes, interleaved op by op.

    python benchmarks/allgather_bench.py [--world-size 3] [--sizes 8,1K,16K,64K] [--ops 400]
                                         [--collective reduce_scatter]

Three groups over the same ranks: ddl with TORCH_DDL_ALLGATHER_ALGO=ring, ddl with bruck (a ddl
group keeps the settings in effect when it was created), and gloo. Per block size (bytes each
rank contributes), the median time per op of the slowest rank over --rounds rounds of --ops ops,
and Bruck's time over the ring's and over gloo's (below 1: Bruck is faster). What ddl's auto
chooses for the size is printed beside it.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def rank_main(rank, args, port):
    import torch_ddl

    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("ddl", store=store, rank=rank, world_size=args.world_size)
    groups = {}
    for algo in ("ring", "bruck"):
        os.environ["TORCH_DDL_ALLGATHER_ALGO"] = algo
        torch_ddl._C.check_config()
        groups[algo] = dist.new_group(backend="ddl")
    del os.environ["TORCH_DDL_ALLGATHER_ALGO"]
    torch_ddl._C.check_config()
    groups["gloo"] = dist.new_group(backend="gloo")
    for nbytes in args.sizes:
        n = max(1, nbytes // 4)
        if args.collective == "reduce_scatter":
            x = torch.full((n * args.world_size,), float(rank))
            out = torch.empty(n)
            want = torch.full((n,), float(args.world_size * (args.world_size - 1) // 2))
            call = dist.reduce_scatter_tensor
        else:
            x = torch.full((n,), float(rank))
            out = torch.empty(n * args.world_size)
            want = torch.arange(args.world_size, dtype=torch.float32).repeat_interleave(n)
            call = dist.all_gather_into_tensor
        times = {name: [] for name in groups}
        for name, group in groups.items():
            call(out, x, group=group)
            if not torch.equal(out, want):
                raise SystemExit(f"{name}: wrong {args.collective} of {nbytes} bytes")
        for _ in range(args.rounds):
            for name, group in groups.items():
                dist.barrier(group=groups["gloo"])
                start = time.perf_counter()
                for _ in range(args.ops):
                    call(out, x, group=group)
                took = torch.tensor([(time.perf_counter() - start) / args.ops])
                dist.all_reduce(took, op=dist.ReduceOp.MAX, group=groups["gloo"])
                times[name].append(took.item())
        if rank == 0:
            medians = {name: statistics.median(t) * 1e6 for name, t in times.items()}
            auto = dist.group.WORLD._get_backend(torch.device("cpu")).allgather_schedule(nbytes)
            store.set(f"bench/{nbytes}", " ".join(f"{medians[k]:.1f}" for k in
                                                  ("ring", "bruck", "gloo")) + f" {auto}")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--sizes", default="8,1K,16K,64K")
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--collective", choices=["all_gather", "reduce_scatter"],
                        default="all_gather",
                        help="reduce_scatter: blocks of the given size per rank, summed")
    args = parser.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=120))
    mp.start_processes(rank_main, args=(args, store.port), nprocs=args.world_size,
                       start_method="spawn")
    name = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}
    print(f"{name[args.collective]}, float32, {args.world_size} ranks on one host, "
          f"{args.rounds} rounds of {args.ops} ops, interleaved; median us per op (slowest rank)")
    print(f"{'block':>8} | {'ring us':>8} | {'bruck us':>8} | {'gloo us':>8} | "
          f"{'bruck/ring':>10} | {'bruck/gloo':>10} | auto")
    for nbytes in args.sizes:
        ring, bruck, gloo, *auto = store.get(f"bench/{nbytes}").decode().split()
        ring, bruck, gloo = float(ring), float(bruck), float(gloo)
        print(f"{nbytes:>8} | {ring:8.1f} | {bruck:8.1f} | {gloo:8.1f} | {bruck / ring:10.2f} | "
              f"{bruck / gloo:10.2f} | {' '.join(auto)}")


if __name__ == "__main__":
    main()
