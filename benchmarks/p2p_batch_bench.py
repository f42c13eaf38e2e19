"""batch_isend_irecv over ddl: through the backend's coalescing (one Work per batch) against
torch's generic path (one isend / irecv Work per op, what it does for a backend that does not
coalesce), and gloo's, in the same processes. Each rank sends --ops tensors of --bytes to the
next rank and receives as many from the previous one; prints the median time per batch.

    python benchmarks/p2p_batch_bench.py --world-size 2 --ops 8 --bytes 4096
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _batch(ops):
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def _generic(ops):
    works = [op.op(op.tensor, op.peer, op.group, op.tag) for op in ops]
    for w in works:
        w.wait()


def _rank(rank, size, store, args, out):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ddl  # noqa: F401

    dist.init_process_group("ddl", init_method=f"file://{store}", rank=rank, world_size=size)
    gloo = dist.new_group(backend="gloo")
    n = max(args.bytes // 4, 1)
    sends = [torch.ones(n) for _ in range(args.ops)]
    recvs = [torch.zeros(n) for _ in range(args.ops)]
    rows = []
    for name, group, run in (("ddl, coalesced", None, _batch), ("ddl, generic path", None, _generic),
                             ("gloo, generic path", gloo, _batch)):
        ops = [dist.P2POp(dist.isend, t, (rank + 1) % size, group=group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, (rank - 1) % size, group=group) for t in recvs]
        for _ in range(20):
            run(ops)
        times = []
        for _ in range(args.rounds):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                run(ops)
            times.append((time.perf_counter() - start) / args.iters)
        rows.append((name, statistics.median(times)))
    if rank == 0:
        out.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--ops", type=int, default=8, help="sends (and as many receives) per batch")
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, args.world_size, os.path.join(tmp, "s"), args,
                                                 out)) for r in range(args.world_size)]
        for proc in procs:
            proc.start()
        rows = out.get(timeout=600)
        for proc in procs:
            proc.join(60)
    base = dict(rows)["ddl, generic path"]
    print(f"{args.world_size} ranks, batches of {args.ops} sends + {args.ops} receives of "
          f"{args.bytes} B; median of {args.rounds} rounds of {args.iters} batches")
    for name, t in rows:
        print(f"  {name:<20} {t * 1e6:9.1f} us per batch   {base / t:5.2f}x ddl's generic path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
