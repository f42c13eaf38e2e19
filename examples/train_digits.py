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

With --in-memory the digits are written to files (one per sample) and read back through
torch_ddl.data.InMemoryDataset.from_files: one copy per host in shared memory. With --easgd
(ddl or gloo) no gradient is allreduced: each process steps its own model and every --tau steps
torch_ddl.optim.ElasticAveraging pulls the models and their centre together (--alpha, default
0.9 / processes); the centre is what is evaluated and saved. Each epoch's line then ends with
the bytes each process allreduced in it (for DDP: its gradients, every step).
"""

import argparse
import contextlib
import copy
import os
import tempfile
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


def write_digit_files(dataset, seed):
    """The samples of `dataset` as files of 64 bytes (pixel values 0 - 16), written once per
    machine (every process writes the same bytes; a file appears whole)."""
    directory = os.path.join(tempfile.gettempdir(), f"torch_ddl_digits_{seed}")
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, (x, _) in enumerate(dataset):
        path = os.path.join(directory, f"{i:05d}.raw")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write((x * 16).round().to(torch.uint8).numpy().tobytes())
            os.replace(tmp, path)
        paths.append(path)
    return paths


def decode_digit(raw):
    return raw.to(torch.float32).view(1, 8, 8) / 16.0


def run_epoch(args, epoch, model, optimizer, loader, sampler, test, rank, world, attempt,
              easgd=None):
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
        (easgd or optimizer).step()
        totals += torch.tensor([loss.item() * len(y), len(y)], dtype=torch.float64)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(totals)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    model.eval()
    with torch.no_grad(), (easgd.centre_weights() if easgd else contextlib.nullcontext()):
        correct = (model(test.tensors[0]).argmax(1) == test.tensors[1]).sum().item()
        weights = {k: v.clone() for k, v in unwrap(model).state_dict().items()}
    if easgd:
        sent = easgd.bytes_communicated - args.sent
        args.sent = easgd.bytes_communicated
    else:  # DDP allreduces every gradient every step
        sent = (step + 1) * sum(p.numel() * p.element_size() for p in model.parameters())
    if rank == 0:
        print(f"epoch {epoch + 1}/{args.epochs}  loss {totals[0] / totals[1]:.4f}  "
              f"test accuracy {correct / len(test):.3f}  "
              f"samples/s {totals[1].item() / elapsed.item():.0f}  "
              f"allreduced {sent / 1e6:.2f} MB", flush=True)
        if args.checkpoint:  # written whole, then renamed: a crash leaves the last one
            state = {"model": weights, "epochs": epoch + 1,
                     "optimizer": (easgd or optimizer).state_dict()}
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
    if args.checkpoint:
        dist.barrier()  # every rank resumes from the same epoch


def unwrap(model):
    return model.module if isinstance(model, DDP) else model


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
    parser.add_argument("--in-memory", action="store_true",
                        help="train from files held once per host (torch_ddl.data)")
    parser.add_argument("--easgd", action="store_true",
                        help="elastic averaging every --tau steps instead of DDP")
    parser.add_argument("--tau", type=int, default=4)
    parser.add_argument("--alpha", type=float, help="default: 0.9 / processes")
    args = parser.parse_args()
    args.sent = 0
    if args.survive and args.backend != "ddl":
        parser.error("--survive needs --backend ddl (dist.shrink_group)")
    if args.survive and args.easgd:
        parser.error("--survive goes with DDP, not --easgd")

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.backend == "ddl":
        import torch_ddl  # noqa: F401  registers the 'ddl' backend
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    train, test = load_data(args.seed)
    if args.in_memory:
        from torch_ddl.data import InMemoryDataset

        paths = write_digit_files(train, args.seed)
        train = InMemoryDataset.from_files(paths, train.tensors[1].tolist(),
                                           transform=decode_digit)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = DigitsCNN() if args.easgd else DDP(DigitsCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    easgd = None
    if args.easgd:
        from torch_ddl.optim import ElasticAveraging

        easgd = ElasticAveraging(optimizer, args.alpha or 0.9 / world, args.tau)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    first = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        unwrap(model).load_state_dict(saved["model"])  # the centre, with --easgd
        (easgd or optimizer).load_state_dict(saved["optimizer"])
        first = saved["epochs"]
    if rank == 0:
        print(f"training DigitsCNN on {len(train)} digits, {world} processes, "
              f"backend {args.backend}" +
              (f", EASGD tau {args.tau} alpha {easgd.alpha:g}" if easgd else ", DDP") +
              (", data in memory once per host" if args.in_memory else "") +
              (f", attempt {attempt}" if attempt else "") +
              (f", resumed after epoch {first}" if first else ""), flush=True)
    global_batch = args.batch_size * world
    epoch = first
    while epoch < args.epochs:
        # What a survivor goes back to when a rank dies during the epoch.
        saved = (copy.deepcopy(model.module.state_dict()), copy.deepcopy(optimizer.state_dict())
                 ) if args.survive else None
        try:
            run_epoch(args, epoch, model, optimizer, loader, sampler, test, rank, world, attempt,
                      easgd)
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
