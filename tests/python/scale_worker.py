"""One rank of the 32-rank test (test_cluster.py, make scale): creation timed against gloo's in
the same run, every collective over ddl against gloo, and the endpoints this process opened.

Prints "REPORT {json}" on rank 0 and exits 0 when every comparison held.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_worker import collectives  # noqa: E402
from ddl_testing import assert_same  # noqa: E402

import torch_ddl  # noqa: E402,F401
from torch_ddl import _C  # noqa: E402


def timed(make):
    start = time.monotonic()
    group = make()
    return group, time.monotonic() - start


def main():
    torch.set_num_threads(1)
    dist.init_process_group("ddl")
    rank, world = dist.get_rank(), dist.get_world_size()
    # New groups of each backend, alternately, twice: the slowest rank's time counts.
    times = {"ddl": [], "gloo": []}
    groups = {}
    for _ in range(2):
        for backend in ("gloo", "ddl"):
            groups[backend], seconds = timed(lambda b=backend: dist.new_group(backend=b))
            times[backend].append(seconds)
    gloo, ddl = groups["gloo"], groups["ddl"]
    slowest = torch.tensor([min(times["ddl"]), min(times["gloo"])], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
    # An allreduce: endpoints to the group-creation tree and the plan's rings only.
    t = torch.full((1 << 18,), float(rank))
    dist.all_reduce(t, group=ddl)
    assert_same(t, torch.full((1 << 18,), float(world * (world - 1) // 2)), "all_reduce")
    after_allreduce = torch.tensor([float(_C.endpoints_opened())])
    collectives(rank, world, ddl, gloo, quick=True)
    after_all = torch.tensor([float(_C.endpoints_opened())])
    most = torch.cat([after_allreduce, after_all])
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=gloo)
    backend = ddl._get_backend(torch.device("cpu"))
    if rank == 0:
        print("REPORT " + json.dumps({
            "world": world, "topology": backend.topology(),
            "create_ddl_s": slowest[0].item(), "create_gloo_s": slowest[1].item(),
            "endpoints_after_allreduce": int(most[0].item()),
            "endpoints_after_all": int(most[1].item())}), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
