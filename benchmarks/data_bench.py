"""An epoch over image files: torch_ddl.data.InMemoryDataset against the files read from disk and
against each rank loading its own copy, on one host.

    python benchmarks/data_bench.py                      # 4 ranks, 256 MiB of JPEG, 2 workers
    python benchmarks/data_bench.py --ranks 4 --mib 256 --workers 2

The benchmark writes JPEG files (PIL) once into --dir. Each mode runs its own job of --ranks
processes over ddl, each rank with a DataLoader of --workers workers that decode the JPEGs,
sampled by DistributedSampler:

  disk    an ordinary Dataset that opens and reads a file per sample; the page cache is dropped
          before the job (as root; otherwise the run says it was warm)
  memory  InMemoryDataset.from_files (its load time counted: the job reads the files, cold, into
          the host's region, then the epoch runs from memory)
  copy    each rank reads every file into its own list of bytes first (what scripts do by hand)

Printed per mode: the load time, the epoch time (the slowest rank), and how much the host's
memory grew as a multiple of the files' size: PSS loaded, the ranks' summed PSS once the data is
loaded (every byte of it read once); PSS grew, that of every rank and worker at the end of the
epoch; beyond
disk: less what the disk mode grew by (the workers themselves), i.e. what holding the data
cost.
"""

import argparse
import io
import json
import os
import sys
import tempfile
import time
import zlib

import torch


def make_files(directory, mib, side, seed=0):
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    done = os.path.join(directory, f"done_{mib}_{side}")
    if not os.path.exists(done):
        g = torch.Generator().manual_seed(seed)
        total, i = 0, 0
        while total < mib << 20:
            # A smooth picture with noise: JPEG sizes as photographs have them.
            base = torch.rand(3, 8, 8, generator=g)
            img = torch.nn.functional.interpolate(base[None], size=(side, side),
                                                  mode="bilinear")[0]
            img = (img + 0.08 * torch.randn(3, side, side, generator=g)).clamp(0, 1)
            array = (img * 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
            path = os.path.join(directory, f"img{i:06d}.jpg")
            Image.fromarray(array).save(path, quality=90)
            total += os.path.getsize(path)
            i += 1
        with open(done, "w") as f:
            f.write(str(i))
    count = int(open(done).read())
    return [os.path.join(directory, f"img{i:06d}.jpg") for i in range(count)]


def decode(raw):
    from PIL import Image

    data = raw if isinstance(raw, (bytes, bytearray)) else raw.numpy().tobytes()
    with Image.open(io.BytesIO(data)) as im:
        array = torch.frombuffer(bytearray(im.convert("RGB").tobytes()), dtype=torch.uint8)
        return array.view(im.height, im.width, 3).permute(2, 0, 1)


class FromDisk(torch.utils.data.Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return decode(f.read()), i % 10


class OwnCopy(torch.utils.data.Dataset):
    def __init__(self, paths):
        self.blobs = []
        for p in paths:
            with open(p, "rb") as f:
                self.blobs.append(f.read())

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        return decode(self.blobs[i]), i % 10


def pss(pid="self"):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children():
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def rank_main(rank, world, init, mode, paths, args, results):
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    import torch_ddl  # noqa: F401
    from torch_ddl.data import InMemoryDataset

    torch.set_num_threads(1)
    dist.init_process_group("ddl", init_method=init, rank=rank, world_size=world)
    dist.barrier()
    before = pss()
    start = time.perf_counter()
    if mode == "disk":
        dataset = FromDisk(paths)
    elif mode == "memory":
        dataset = InMemoryDataset.from_files(paths, [i % 10 for i in range(len(paths))],
                                             transform=decode)
    else:
        dataset = OwnCopy(paths)
    dist.barrier()
    loaded = time.perf_counter() - start
    if mode == "memory":  # its pages are mapped when read: read them all once, as a copy has
        for i in range(len(dataset)):
            zlib.crc32(dataset.raw(i).numpy())
    dist.barrier()
    at_load = pss() - before
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    start = time.perf_counter()
    seen = 0
    for x, _ in loader:
        seen += len(x)
    epoch = time.perf_counter() - start
    dist.barrier()  # every process still holds what it held in the epoch
    grown = pss() - before + sum(pss(c) for c in children())
    stats = [None] * world
    dist.all_gather_object(stats, (loaded, epoch, grown, seen, at_load))
    if rank == 0:
        with open(results, "w") as f:
            json.dump(stats, f)
    dist.barrier()
    del loader
    dist.destroy_process_group()


def run(mode, paths, args):
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "results.json")
        init = f"file://{os.path.join(tmp, 'store')}"
        mp.start_processes(rank_main, args=(args.ranks, init, mode, paths, args, results),
                           nprocs=args.ranks, start_method="spawn")
        with open(results) as f:
            return json.load(f)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "cold"
    except OSError as e:
        return f"warm (the page cache could not be dropped: {e.strerror})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256, help="MiB of JPEG files")
    parser.add_argument("--side", type=int, default=256, help="pixels per image side")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(),
                                                      "torch_ddl_data_bench"))
    parser.add_argument("--modes", default="disk,memory,copy")
    args = parser.parse_args()
    paths = make_files(args.dir, args.mib, args.side)
    size = sum(os.path.getsize(p) for p in paths)
    print(f"# {len(paths)} JPEG files of {args.side}^2, {size / (1 << 20):.0f} MiB; "
          f"{args.ranks} ranks, {args.workers} workers each, batch {args.batch}")
    print(f"{'mode':8} {'load s':>7} {'epoch s':>8} {'total s':>8} {'images/s':>9} "
          f"{'PSS loaded':>11} {'PSS grew':>9} {'beyond disk':>12}  page cache")
    baseline = None  # what the disk mode grew by: the processes themselves, no data held
    for mode in args.modes.split(","):
        cache = drop_caches()
        stats = run(mode, paths, args)
        loaded = max(s[0] for s in stats)
        epoch = max(s[1] for s in stats)
        grown = sum(s[2] for s in stats)
        seen = sum(s[3] for s in stats)
        at_load = sum(s[4] for s in stats)
        if mode == "disk":
            baseline = grown
        beyond = f"{(grown - baseline) / size:11.2f}x" if baseline is not None else f"{'':>12}"
        print(f"{mode:8} {loaded:7.2f} {epoch:8.2f} {loaded + epoch:8.2f} {seen / epoch:9.0f} "
              f"{at_load / size:10.2f}x {grown / size:8.2f}x {beyond}  {cache}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
