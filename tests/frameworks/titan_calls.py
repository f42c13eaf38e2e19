"""What torchtitan does with a process group it is given, made directly (torchtitan itself
needs GPUs and a model download): the group first, then dist's timeout set on it, a barrier,
and a model sharded with FSDP2 (fully_shard) over a 2-D device mesh (replicated across the
first dimension, sharded across the second: HSDP) whose parameters are DTensors. Launched by
torchrun with 4 processes; rank 0 saves the final parameters (full tensors) to OUT.

    torchrun --nproc-per-node 4 titan_calls.py ddl|gloo OUT
"""

import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

import torch_ddl  # noqa: F401

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch before 2.6
    from torch.distributed._composable.fsdp import fully_shard


def main():
    backend, out = sys.argv[1], sys.argv[2]
    dist.init_process_group(backend=backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    # torchtitan sets the group's timeout after its first steps (a short one for start-up):
    # dist.set_timeout from torch 2.15; before, _set_pg_timeout, which reaches gloo and NCCL only,
    # so the group's own set_timeout (what it calls for them).
    timeout = datetime.timedelta(seconds=100)
    if hasattr(dist, "set_timeout"):
        dist.set_timeout(timeout)
    else:
        dist.group.WORLD.set_timeout(timeout)
    backend_object = dist.group.WORLD._get_backend(torch.device("cpu"))
    if hasattr(backend_object, "timeout"):  # ddl tells its own
        assert backend_object.timeout == timeout, backend_object.timeout
    dist.barrier()
    mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(8):
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 8, (16,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    if rank == 0:
        torch.save(params, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
