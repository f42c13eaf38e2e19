"""A small model trained with DeepSpeed ZeRO (stage STAGE) over BACKEND, launched by torchrun with
2 processes on the CPU; rank 0 saves the final parameters (gathered) to OUT.

    torchrun --nproc-per-node 2 deepspeed_train.py ddl|gloo STAGE OUT

deepspeed.init_distributed(dist_backend=...) is how DeepSpeed takes a backend; without it,
deepspeed.initialize would pick the accelerator's own.
"""

import os
import sys

import torch
import torch.nn as nn

import torch_ddl  # noqa: F401

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402


def main():
    backend, stage, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    deepspeed.init_distributed(dist_backend=backend)
    assert torch.distributed.get_backend() == backend, torch.distributed.get_backend()
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(),
                          nn.Linear(128, 8))
    config = {
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 5000,
                              "allgather_bucket_size": 5000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(10):
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 8, (16,), generator=g)
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
    # ZeRO's own groups are the world's backend too.
    assert torch.distributed.get_backend(engine.optimizer.dp_process_group) == backend
    params = [p.detach().clone().float() for p in engine.module.parameters()]
    if rank == 0:
        torch.save(params, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
