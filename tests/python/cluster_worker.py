"""One rank of the cluster tests (test_cluster.py), on an emulated host: every collective over
ddl against gloo on the same inputs, then a report line with the topology and the plans.

    python cluster_worker.py [--quick] [--subgroup RANKS]

env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the cluster launcher).
Prints "REPORT {json}" on rank 0 and exits 0 when every comparison held.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddl_testing import OPS, assert_same, make_input, valid  # noqa: E402

import torch_ddl  # noqa: E402,F401


def compare(name, fn, ddl, gloo):
    """fn(group) -> list of tensors; ddl's must equal gloo's."""
    got, want = fn(ddl), fn(gloo)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"{name} [{i}]")


def collectives(rank, world, ddl, gloo, quick):
    sizes = [0, 1, 13, 1009] + ([] if quick else [(1 << 20) + 3])
    dtypes = [torch.float32, torch.int32] if quick else [torch.float32, torch.float64,
                                                         torch.bfloat16, torch.int32, torch.int64]
    for dtype in dtypes:
        for op in OPS:
            if not valid(dtype, op) or (quick and op not in ("SUM", "MAX", "AVG")):
                continue
            if op == "AVG" and not dtype.is_floating_point:
                continue  # gloo has no integer average
            for n in sizes:
                def allreduce(group, dtype=dtype, op=op, n=n):
                    t = make_input(dtype, op, rank, world, n)
                    dist.all_reduce(t, op=OPS[op], group=group)
                    return [t]
                compare(f"all_reduce {dtype} {op} {n}", allreduce, ddl, gloo)
    for n in sizes:
        x = make_input(torch.float32, "SUM", rank, world, n)

        def broadcast(group, n=n):
            outs = []
            for root in range(world):
                t = make_input(torch.float32, "SUM", rank, world, n)
                dist.broadcast(t, src=root, group=group)
                outs.append(t)
            return outs

        def all_gather(group, x=x):
            outs = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(outs, x, group=group)
            flat = torch.empty(world * x.numel())
            dist.all_gather_into_tensor(flat, x, group=group)
            return outs + [flat]

        def reduce_scatter(group, n=n):
            inp = make_input(torch.float32, "SUM", rank, world, n * world)
            out = torch.empty(n)
            dist.reduce_scatter_tensor(out, inp, group=group)
            return [out]

        def rooted(group, x=x, n=n):
            outs = []
            for root in range(world):
                t = x.clone()
                dist.reduce(t, dst=root, group=group)
                outs.append(t if rank == root else torch.zeros(0))
                gathered = [torch.empty_like(x) for _ in range(world)] if rank == root else None
                dist.gather(x, gathered, dst=root, group=group)
                outs += gathered if rank == root else []
                out = torch.empty(n)
                pieces = [make_input(torch.float32, "SUM", root, world, n) + i
                          for i in range(world)] if rank == root else None
                dist.scatter(out, pieces, src=root, group=group)
                outs.append(out)
            return outs

        def all_to_all(group, n=n):
            inp = make_input(torch.float32, "SUM", rank, world, n * world)
            out = torch.empty(n * world)
            dist.all_to_all_single(out, inp, group=group)
            return [out]

        for name, fn in [("broadcast", broadcast), ("all_gather", all_gather),
                         ("reduce_scatter", reduce_scatter), ("reduce/gather/scatter", rooted),
                         ("all_to_all", all_to_all)]:
            compare(f"{name} {n}", fn, ddl, gloo)
    # Point to point around the ring, and a barrier.
    t = torch.full((5,), float(rank))
    got = torch.empty(5)
    send = dist.isend(t, (rank + 1) % world, group=ddl)
    dist.recv(got, (rank - 1) % world, group=ddl)
    send.wait()
    assert_same(got, torch.full((5,), float((rank - 1) % world)), "send/recv")
    dist.barrier(group=ddl)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--subgroup", help="ranks of a subgroup to report on, e.g. 0,1")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("ddl")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    ddl = dist.group.WORLD
    collectives(rank, world, ddl, gloo, args.quick)
    backend = ddl._get_backend(torch.device("cpu"))
    report = {"topology": backend.topology(), "links": backend.links(),
              "plans": {str(s): backend.plan_rows([s])[0][1][0][0] for s in (8, 4 << 20)}}
    # A large allreduce by the auto plan: its host level moves through shared memory.
    t = torch.full((1 << 20,), float(rank))
    dist.all_reduce(t, group=ddl)
    assert_same(t, torch.full((1 << 20,), float(world * (world - 1) // 2)), "auto all_reduce")
    report["host_rings"] = backend.host_rings()
    if args.subgroup:
        members = [int(r) for r in args.subgroup.split(",")]
        sub = dist.new_group(members, backend="ddl")
        if rank in members:
            sub_backend = sub._get_backend(torch.device("cpu"))
            t = torch.full((1 << 16,), float(rank))
            dist.all_reduce(t, group=sub)
            assert_same(t, torch.full((1 << 16,), float(sum(members))), "subgroup all_reduce")
            if rank == members[0]:
                report["subgroup"] = sub_backend.topology()
                report["subgroup_plan"] = sub_backend.plan_rows([4 << 20])[0][1][0][0]
    if rank == 0:
        print("REPORT " + json.dumps(report), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
