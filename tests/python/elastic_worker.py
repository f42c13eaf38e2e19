"""Run by test_launch.py under `torchrun --max-restarts 1`: rank 1 exits with code 1 at step 5
of the first attempt; the restarted job must form its group again and finish. It does not
import torch_ddl: torch finds 'ddl' through its entry point."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("ddl")
rank = dist.get_rank()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
for step in range(10):
    x = torch.ones(1000) * (step + 1)
    dist.all_reduce(x)
    assert x[0].item() == dist.get_world_size() * (step + 1)
    if attempt == 0 and rank == 1 and step == 5:
        sys.exit(1)
print(f"rank {rank} attempt {attempt} finished", flush=True)
dist.destroy_process_group()
