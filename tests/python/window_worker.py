"""One rank of the window test across emulated hosts (test_cluster.py): window_checks' rounds
against send/recv, then a report line with how each kind of memory reached the peers of this
host and of the other.

env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the cluster launcher).
Prints "REPORT {json}" on rank 0 and exits 0 when every round matched.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from window_checks import window_round  # noqa: E402

import torch_ddl  # noqa: E402,F401


def main():
    torch.set_num_threads(1)
    dist.init_process_group("ddl")
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    host_of = {r: h for h, (_, ranks) in enumerate(backend.hosts()) for r in ranks}
    routes = {}
    # Blocks first: once glibc has freed a large mapped block it serves requests of that size
    # from its heap (its mmap threshold rises), and glibc_block finds none.
    for memory in ("block", "shared", "plain"):
        for dtype in (torch.float32, torch.int64):
            for n in (0, 1, 1031, (1 << 18) + 3):
                if memory == "block" and (n < 1 << 18 or dtype != torch.float32):
                    continue
                if memory == "plain" and n >= 1 << 18:
                    continue  # a block of its own (the test fixes the mmap threshold): "block"
                for p, route in window_round(rank, world, dtype, n, memory).items():
                    if n > 0:
                        where = "host" if host_of[p] == host_of[rank] else "across"
                        routes.setdefault(f"{memory} {where}", set()).add(route)
    gathered = [None] * world
    dist.all_gather_object(gathered, {k: sorted(v) for k, v in routes.items()})
    if rank == 0:
        merged = {}
        for r in gathered:
            for k, v in r.items():
                merged[k] = sorted(set(merged.get(k, [])) | set(v))
        print("REPORT " + json.dumps({"routes": merged, "topology": backend.topology()}),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
