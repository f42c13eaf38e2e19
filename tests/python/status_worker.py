"""A rank of test_status.py's job: a broadcast of what to do and an allreduce in a loop, each
checked, until the stop file appears (or 120 s pass); prints how many ops it ran. argv: rank,
world size, store port ("env": env://, as on emulated hosts), stop file. Where the file STOP.odd
appears, rank ODD_RANK (env) instead calls a barrier of a group of itself and the next rank,
which the next rank never joins: the others then wait for it in their allreduce while it is in
another op; where STOP.mismatch appears, it calls an allreduce of another size than the others."""

import os
import sys
import time

import torch
import torch.distributed as dist

import torch_ddl  # noqa: F401 (registers 'ddl')


def main():
    rank, world, port, stop = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    init = "env://" if port == "env" else f"tcp://127.0.0.1:{port}"
    dist.init_process_group("ddl", init_method=init, rank=rank, world_size=world)
    odd = int(os.environ.get("ODD_RANK", "-1"))
    pair = dist.new_group([odd, (odd + 1) % world]) if odd >= 0 else None
    tensor = torch.empty(1 << 16)  # 256 KiB
    ran = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        # Every rank stops at the same op: rank 0 looks for the files and tells the others.
        flag = 1.0
        if rank == 0 and os.path.exists(stop):
            flag = 0.0
        elif rank == 0 and os.path.exists(stop + ".odd"):
            flag = 2.0
        elif rank == 0 and os.path.exists(stop + ".mismatch"):
            flag = 3.0
        go = torch.tensor([flag])
        dist.broadcast(go, src=0)
        ran += 1
        if go.item() == 0.0:
            break
        if go.item() == 2.0 and rank == odd:
            dist.barrier(group=pair)  # the next rank is in the allreduce below: never returns
        if go.item() == 3.0:
            # Rank ODD_RANK calls with another size: every rank's call raises, naming it; then
            # each waits (the job still up, for a look) until the stop file appears.
            try:
                dist.all_reduce(torch.empty(7 if rank == odd else 5))
            except RuntimeError as e:
                print(f"rank {rank} raised: {str(e)[:200]}", flush=True)
            while not os.path.exists(stop) and time.monotonic() < deadline:
                time.sleep(0.05)
            return 0
        tensor.fill_(rank + 1.0)
        dist.all_reduce(tensor)
        ran += 1
        expected = world * (world + 1) / 2
        if not torch.all(tensor == expected):
            print(f"rank {rank}: wrong sum {tensor[0].item()} (expected {expected})", flush=True)
            return 1
        time.sleep(0.002)
    print(f"rank {rank} ran {ran} ops (broadcast, all_reduce)", flush=True)
    if os.environ.get("HOLD_FOR_SCRAPE"):  # the metrics test reads them before the group goes
        while not os.path.exists(stop + ".scraped") and time.monotonic() < deadline:
            time.sleep(0.05)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
