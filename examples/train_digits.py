"""Data-parallel training of a small CNN on scikit-learn's bundled handwritten digits.

    torchrun --nproc_per_node=2 examples/train_digits.py --backend ddl

Each process trains on its shard (DistributedSampler); DistributedDataParallel averages the
gradients over the chosen backend. Prints loss, test accuracy and samples/s per epoch.

With --checkpoint FILE, rank 0 saves the model and optimizer after every epoch and a (re)started
job resumes from the last one saved: under `torchrun --max-restarts N` a failed attempt costs at
most one epoch. --fail-in-epoch E makes the last rank exit with code 1 in epoch E of the first
attempt, to try it:

    torchrun --nproc_per_node=2 --max-restarts=1 examples/train_digits.py \
        --checkpoint /tmp/digits.pt --fail-in-epoch 2

With --survive the job goes on without a rank that dies (ddl only): the survivors shrink the
default group (dist.shrink_group, no restart, no store), restore the model and optimizer as they
were at the start of the epoch (kept in memory), rescale the data shards to the ranks left (the
global batch stays the same) and train on. --kill-in-epoch E kills the last rank (SIGKILL) in epoch E, to try it; launched as
nodes of one process each (one torchrun per node, since an agent tears down its own workers when
one of them fails):

    for i in 0 1 2; do torchrun --nnodes 3 --nproc_per_node 1 --node_rank $i \
        --master_addr 127.0.0.1 --master_port 29511 examples/train_digits.py \
        --survive --kill-in-epoch 3 & done; wait
"""

import argparse
import copy
import os
import re
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data(seed):
    digits = load_digits()  # shipped with scikit-learn: nothing is downloaded
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    split = int(0.8 * len(y))
    return TensorDataset(x[:split], y[:split]), TensorDataset(x[split:], y[split:])


def run_epoch(args, epoch, model, optimizer, loader, sampler, test, rank, world, attempt):
    sampler.set_epoch(epoch)
    model.train()
    start = time.perf_counter()
    totals = torch.zeros(2, dtype=torch.float64)  # loss sum, samples
    for step, (x, y) in enumerate(loader):
        if (attempt == 0 and rank == world - 1 and epoch + 1 == args.fail_in_epoch
                and step == 3):
            print(f"rank {rank} fails in epoch {epoch + 1}", flush=True)
            sys.exit(1)
        if rank == world - 1 and epoch + 1 == args.kill_in_epoch and step == 3:
            print(f"rank {rank} is killed in epoch {epoch + 1}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        totals += torch.tensor([loss.item() * len(y), len(y)], dtype=torch.float64)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(totals)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    model.eval()
    with torch.no_grad():
        correct = (model(test.tensors[0]).argmax(1) == test.tensors[1]).sum().item()
    if rank == 0:
        print(f"epoch {epoch + 1}/{args.epochs}  loss {totals[0] / totals[1]:.4f}  "
              f"test accuracy {correct / len(test):.3f}  "
              f"samples/s {totals[1].item() / elapsed.item():.0f}", flush=True)
        if args.checkpoint:  # written whole, then renamed: a crash leaves the last one
            state = {"model": model.module.state_dict(),
                     "optimizer": optimizer.state_dict(), "epochs": epoch + 1}
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
    if args.checkpoint:
        dist.barrier()  # every rank resumes from the same epoch


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="ddl", help="ddl or gloo")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="save after every epoch here, resume from it")
    parser.add_argument("--fail-in-epoch", type=int, default=0,
                        help="the last rank exits with code 1 in this epoch of the first attempt")
    parser.add_argument("--survive", action="store_true",
                        help="go on without ranks that die: shrink the group, redo the epoch")
    parser.add_argument("--kill-in-epoch", type=int, default=0,
                        help="the last rank kills itself (SIGKILL) in this epoch")
    args = parser.parse_args()
    if args.survive and args.backend != "ddl":
        parser.error("--survive needs --backend ddl (dist.shrink_group)")

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.backend == "ddl":
        import torch_ddl  # noqa: F401  registers the 'ddl' backend
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    train, test = load_data(args.seed)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = DDP(DigitsCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    first = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first = saved["epochs"]
    if rank == 0:
        print(f"training DigitsCNN on {len(train)} digits, {world} processes, "
              f"backend {args.backend}" + (f", attempt {attempt}" if attempt else "") +
              (f", resumed after epoch {first}" if first else ""), flush=True)
    global_batch = args.batch_size * world
    epoch = first
    while epoch < args.epochs:
        # What a survivor goes back to when a rank dies during the epoch.
        saved = (copy.deepcopy(model.module.state_dict()), copy.deepcopy(optimizer.state_dict())
                 ) if args.survive else None
        try:
            run_epoch(args, epoch, model, optimizer, loader, sampler, test, rank, world, attempt)
        except RuntimeError as error:
            gone = sorted({int(r) for r in re.findall(r"rank (\d+) is gone", str(error))})
            if not args.survive or not gone:
                raise
            # Ranks of the default group; shrink_group makes the rest the new default group.
            dist.shrink_group(gone)
            args.kill_in_epoch = 0  # one node is lost, not one per attempt
            old_rank, rank, world = rank, dist.get_rank(), dist.get_world_size()
            model.module.load_state_dict(saved[0])
            optimizer.load_state_dict(saved[1])
            model = DDP(model.module)
            # The global batch stays what the learning rate was set for: each survivor takes a
            # larger share of a smaller set of shards.
            sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=args.seed)
            batch = -(-global_batch // world)
            loader = DataLoader(train, batch_size=batch, sampler=sampler)
            if rank == 0:
                print(f"rank(s) {', '.join(map(str, gone))} gone in epoch {epoch + 1}: "
                      f"{world} processes go on (this was rank {old_rank}), "
                      f"{batch} samples per process per step, epoch {epoch + 1} again",
                      flush=True)
            continue
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
