"""DDP's step time across emulated hosts, measured and predicted (root).

    sudo python benchmarks/cluster/ddp_check.py --shape 2x2
    sudo python benchmarks/cluster/ddp_check.py --shape 2x4 --width 1024 --layers 8
    python benchmarks/cluster/ddp_check.py --from-results benchmarks/results/ddp_check.txt

Every rank trains the same MLP (LAYERS linear layers of WIDTH x WIDTH, float32) with
DistributedDataParallel over ddl: steps/s measured, and its forward and backward measured
alone (`no_sync`, every rank computing at once, as in a DDP step), and the optimizer's update.
The prediction is benchmarks/scaling.py's step model fed with those compute times, DDP's
buckets of this model and each bucket's allreduce from the simulator with the links ddl probed
at creation, then the update. `--from-results FILE` predicts again, with the simulator of today,
the runs a table written before measured.
"""

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def worker(args):
    import torch
    import torch.distributed as dist
    from torch import nn

    import torch_ddl  # noqa: F401  registers the backend

    dist.init_process_group("ddl")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(args.batch, args.width)

    def step(sync):
        optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        if sync:
            loss = model(x).square().mean()
            middle = time.perf_counter()
            loss.backward()
        else:
            with model.no_sync():
                loss = model(x).square().mean()
                middle = time.perf_counter()
                loss.backward()
        end = time.perf_counter()
        optimizer.step()
        return middle - start, end - middle, time.perf_counter() - start

    results = {}
    for sync in (False, True, False, True):  # interleaved, after a warm-up of each
        for _ in range(2):
            step(sync)
        times = [step(sync) for _ in range(args.steps)]
        results.setdefault(sync, []).extend(times)
    medians = {}
    for sync, times in results.items():
        t = torch.tensor([statistics.median(c) for c in zip(*times)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank is done
        medians[sync] = t.tolist()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    if rank == 0:
        print("RESULT " + json.dumps({
            "forward": medians[False][0], "backward": medians[False][1],
            "compute_step": medians[False][2], "ddp_step": medians[True][2],
            "links": backend.links(),
            "params": [p.numel() for p in model.module.parameters()]}), flush=True)
    dist.destroy_process_group()


def predict(shape, got):
    """Prints the prediction for one measured run (`got`: the worker's RESULT)."""
    from bench import shape_of

    import scaling

    hosts, ranks, racks = shape_of(shape)
    # Each linear layer: its weight, then its bias; backward work in proportion to the weight.
    layers = [(n, n if i % 2 == 0 else 0) for i, n in enumerate(got["params"])]
    buckets = scaling.buckets(layers)
    machine = dict(links=got["links"].split(" (")[0], reduce_bw=0.0, gpus_per_host=ranks,
                   hosts_per_rack=hosts // len(racks) if racks else 0)
    allreduce = scaling.Allreduce()
    world = hosts * ranks
    split = (got["forward"], got["backward"])
    update = max(0.0, got["compute_step"] - sum(split))  # the optimizer's step, after the last
    predicted = update + scaling.step_seconds(
        sum(split), buckets, lambda b: allreduce(machine, world, b, "auto"), split=split)
    model = update + scaling.step_seconds(
        sum(split), buckets, lambda b: allreduce(machine, world, b, "auto"), model=True,
        split=split)
    print(f"# {shape}: MLP {got['layers']} x {got['width']}^2 ({sum(got['params'])} parameters),"
          f" batch {got['batch']}; links {got['links']}")
    print("buckets (MiB, backward done when ready): "
          + ", ".join(f"{b / (1 << 20):.1f} @ {d:.2f}" for b, d in buckets))
    print(f"compute alone: forward {got['forward'] * 1e3:.1f} ms, backward "
          f"{got['backward'] * 1e3:.1f} ms, update {update * 1e3:.1f} ms; "
          "bucket allreduces (simulated): "
          + ", ".join(f"{allreduce(machine, world, b, 'auto')[0] * 1e3:.1f} ms"
                      for b, _ in buckets))
    measured = got["ddp_step"]
    print(f"DDP steps/s: measured {1 / measured:.2f}, predicted {1 / predicted:.2f} "
          f"(simulator; error {(measured / predicted - 1) * 100:+.0f} %), "
          f"{1 / model:.2f} (cost model; {(measured / model - 1) * 100:+.0f} %)")


def runs_from_results(path):
    """(shape, RESULT) of each run a table printed: the figures its lines keep."""
    runs = []
    for line in Path(path).read_text().splitlines():
        if line.startswith("# "):
            head = re.match(r"# (\S+): MLP (\d+) x (\d+)\^2 \(\d+ parameters\), batch (\d+); "
                            r"links (.+)$", line)
            layers, width = int(head[2]), int(head[3])
            runs.append((head[1], dict(layers=layers, width=width, batch=int(head[4]),
                                       links=head[5],
                                       params=[width * width, width] * layers)))
        elif line.startswith("compute alone:"):
            f, b, u = (float(v) * 1e-3 for v in re.findall(r"([\d.]+) ms", line)[:3])
            runs[-1][1].update(forward=f, backward=b, compute_step=f + b + u)
        elif line.startswith("DDP steps/s:"):
            runs[-1][1]["ddp_step"] = 1 / float(re.search(r"measured ([\d.]+)", line)[1])
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="2x2", help="HOSTSxRANKS or RACKSxHOSTSxRANKS")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--rack-rate", default="500mbit")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--from-results", metavar="FILE",
                        help="predict again the runs of a table written before, and stop")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.from_results:
        for shape, got in runs_from_results(args.from_results):
            predict(shape, got)
        return
    from bench import shape_of
    from cluster import Cluster

    hosts, ranks, racks = shape_of(args.shape)
    with Cluster(hosts, ranks, args.rate, racks, args.rack_rate if racks else None) as cluster:
        got = cluster.result([sys.executable, str(Path(__file__).resolve()), "--worker",
                              "--width", str(args.width), "--layers", str(args.layers),
                              "--batch", str(args.batch), "--steps", str(args.steps)])
    got.update(layers=args.layers, width=args.width, batch=args.batch)
    predict(args.shape, got)


if __name__ == "__main__":
    main()
