"""What answering python -m torch_ddl.status costs a job: an allreduce sweep timed with a status
query of every rank every 100 ms, and without, in one run, the two interleaved round by round.

    python benchmarks/status_cost.py [--world-size 4] [--sizes 8,64K,1M,16M] [--rounds 30]
                                     [--control]

Prints, per size, the median time per op without queries and with them, and the median of each
round's ratio (with / without: 1.00 is free) with its quartiles (the machine's noise). The
queries come from this script's own process (the job's store is its), as
`python -m torch_ddl.status` would send them.
"""

import argparse
import datetime
import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def human(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}"
    return f"{n} B"


def rank_main(rank, args, port):
    import torch_ddl  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("ddl", store=store, rank=rank, world_size=args.world_size)
    for nbytes in args.sizes:
        tensor = torch.ones(max(1, nbytes // 4))
        for _ in range(5):
            dist.all_reduce(tensor)
        # Ops per timing: about budget seconds at the size's speed.
        dist.barrier()
        start = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(tensor)
        once = (time.perf_counter() - start) / 5
        count = torch.tensor([max(5, min(20000, int(args.budget / max(once, 1e-7))))])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        iters = int(count.item())
        for r in range(args.rounds):
            for mode in ((0, 1) if r % 2 == 0 else (1, 0)):
                if rank == 0:
                    store.set("bench/query", str(mode))
                    time.sleep(0.15)  # the querier sees it before the timing starts
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(tensor)
                took = torch.tensor([(time.perf_counter() - start) / iters])
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                if rank == 0:
                    store.set(f"bench/result/{nbytes}/{r}/{mode}", str(took.item()))
    if rank == 0:
        store.set("bench/query", "0")
        store.set("bench/done", "1")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--sizes", default="8,64K,1M,16M")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--budget", type=float, default=0.1, help="seconds per timing")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between queries")
    parser.add_argument("--control", action="store_true",
                        help="ask nothing in either half: the ratios then show the machine's "
                        "noise alone")
    args = parser.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]

    from torch_ddl import status

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=120))
    store.set("bench/query", "0")
    queries = []
    stop = threading.Event()

    def querier():
        while not stop.is_set():
            if (store.get("bench/query") == b"1" and not args.control
                    and store.check([status.KEY + "world_size"])):
                start = time.perf_counter()
                results = status.gather(store, timeout=1.0)
                queries.append(time.perf_counter() - start)
                assert all(state == "ok" for state, _, _ in results.values()), results
            stop.wait(args.every)

    thread = threading.Thread(target=querier, daemon=True)
    thread.start()
    mp.start_processes(rank_main, args=(args, store.port), nprocs=args.world_size,
                       start_method="spawn")
    stop.set()
    thread.join(timeout=10)
    asked = "(control: no query in either half)" if args.control else (
        f"a status query of every rank every {args.every * 1000:.0f} ms or none")
    print(f"allreduce, float32, {args.world_size} ranks; {asked}, {args.rounds} rounds each, "
          f"interleaved; median us per op (slowest rank)")
    print(f"{'size':>9} | {'no queries':>10} | {'queries':>10} | {'with/without':>12} | "
          f"{'quartiles':>13}")
    for nbytes in args.sizes:
        off = [float(store.get(f"bench/result/{nbytes}/{r}/0")) for r in range(args.rounds)]
        on = [float(store.get(f"bench/result/{nbytes}/{r}/1")) for r in range(args.rounds)]
        # Each round's two timings are next to each other: their ratio leaves out the machine's
        # drift over the run (the median of those ratios; their quartiles show the noise).
        ratios = sorted(b / a for a, b in zip(off, on))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(f"{human(nbytes):>9} | {statistics.median(off) * 1e6:10.1f} | "
              f"{statistics.median(on) * 1e6:10.1f} | {q[1]:12.3f} | {q[0]:6.3f}-{q[2]:6.3f}")
    if queries:
        print(f"({len(queries)} queries, each answered by every rank in "
              f"{statistics.median(queries) * 1e3:.1f} ms median, {max(queries) * 1e3:.1f} max)")


if __name__ == "__main__":
    main()
