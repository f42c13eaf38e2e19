"""One rank of the split-level test (test_cluster.py, make scale-real): on 16 emulated hosts,
the plans auto takes with the host level split in two (rings of 4 hosts, then of every 4th),
and their allreduces against gloo's on the same inputs.

Prints "REPORT {json}" on rank 0 and exits 0 when every comparison held.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_worker import compare  # noqa: E402
from ddl_testing import OPS, make_input  # noqa: E402

import torch_ddl  # noqa: E402,F401

# Floats per rank: a prime count of 4 KiB, 64 KiB and 1 MiB, and 4 MiB.
COUNTS = [1031, 16411, 262147, 1 << 20]


def main():
    torch.set_num_threads(1)
    dist.init_process_group("ddl")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddl, gloo = dist.group.WORLD, dist.new_group(backend="gloo")
    backend = ddl._get_backend(torch.device("cpu"))
    plans = {}
    for n in COUNTS:
        plans[n] = backend.allreduce_plan(4 * n)
        for dtype, op in ((torch.float32, "SUM"), (torch.int32, "SUM"), (torch.float32, "MAX")):
            def allreduce(group, dtype=dtype, op=op, n=n):
                t = make_input(dtype, op, rank, world, n)
                dist.all_reduce(t, op=OPS[op], group=group)
                return [t]
            compare(f"all_reduce {dtype} {op} {n}", allreduce, ddl, gloo)
    if rank == 0:
        print("REPORT " + json.dumps({"world": world, "topology": backend.topology(),
                                      "plans": plans}), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
