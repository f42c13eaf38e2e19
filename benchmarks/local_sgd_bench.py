"""Training across slow links: DDP, Sync EASGD, Async EASGD and MEASGD, and DiLoCo (plain,
streaming, narrowed on the wire) on emulated hosts (root), the same data and seeds for every
method.

    sudo python benchmarks/local_sgd_bench.py          # 2 x 2 ranks, 1 Gbit/s and 100 Mbit/s
    sudo python benchmarks/local_sgd_bench.py --rates 100mbit --tasks digits --steps 192

Two tasks that ship with scikit-learn (no download): `digits` (its bundled 8x8 images, 10
classes, 1 437 train / 360 test) and `synthetic` (make_classification's generated table: 12 000
samples of 40 features, 24 informative, 10 classes in 20 clusters, 9 600 train / 2 400 test;
harder, so that the methods part). The
model is communication-heavy on purpose: an MLP of two hidden layers of --width (512: 0.3 M
parameters, 1.2 MB), whose step computes in about 2 ms. Every rank trains on its own
share of the training set (rank r: samples r, r + P, ...), in batches of --batch, reshuffled each
epoch with the same seed for every method; SGD with momentum 0.9 is the optimizer of every
method (DiLoCo's inner one too). Every --eval steps (a multiple of every method's period), the
weights a method would ship (DDP's model, EASGD's centre, DiLoCo's global parameters; the
asynchronous centre as its rank, rank 0, holds it) are evaluated on the test set by rank 0;
evaluation and the barriers around it are not timed (they also keep the asynchronous methods'
ranks within --eval steps of each other). Hogwild EASGD needs every rank on one host: it runs
with --shape 1xN only (make bench-local-sgd's second run, 1 x 4).

One line per task, method and link:

    LOCALSGD task=T method=M link=L time_to_target_s=T final_acc=A bytes_per_step=B comm_share=C

Each method runs --seeds times (the initial weights and the data order drawn from the seed).
time_to_target_s: the median over the runs of the training time (the slowest rank's) until the
first evaluation at or above --target (the task's default if not given), "never" if none;
final_acc: the mean over the runs of the last four evaluations' mean (the asynchronous methods'
last one after close(), which takes the differences still on their way and whose time counts);
bytes_per_step: the payload one rank hands to its exchanges per step, in the wire's format (a ring
allreduce sends 2 (P - 1) / P of it); comm_share: 1 - compute / step time, compute being the same
steps with no exchange at all, timed in the same run.

Then, with --slow-rank (rank 3, on the second host) made half as fast as the others (it sleeps as
long as each step took), --steps / 2 steps of DDP, the EASGDs and DiLoCo with no evaluation in
between, each rank timing its own:

    SLOW task=T method=M link=L slowed_rank=R steps_per_s=S slowest_rank_steps_per_s=S

steps_per_s is the mean of the ranks' own steps per second. JSON of every run goes to --json for
benchmarks/plot_local_sgd.py. Last, the narrowed exchange's error against a float64 sum (1 M
normal values per rank, rank r's scaled by r + 1), one WIRE line per wire dtype.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "cluster"))

TARGETS = {"digits": 0.97, "synthetic": 0.88}
METHODS = ["ddp", "easgd", "async-easgd", "async-measgd", "hogwild", "diloco", "streaming",
           "diloco-bf16", "diloco-int8"]
SLOW_METHODS = ["ddp", "easgd", "async-easgd", "async-measgd", "hogwild", "diloco"]
ASYNC = ("async-easgd", "async-measgd", "hogwild")


def load(task):
    import numpy as np
    import torch
    from sklearn import datasets

    if task == "digits":
        data = datasets.load_digits()
        x, y = data.data, data.target
    else:
        x, y = datasets.make_classification(
            n_samples=12000, n_features=40, n_informative=24, n_redundant=8, n_classes=10,
            n_clusters_per_class=2, class_sep=1.5, random_state=0)
    x, y = x.astype(np.float32), y.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    cut = int(len(x) * 0.8)
    train, test = order[:cut], order[cut:]
    mean, std = x[train].mean(0), x[train].std(0) + 1e-6
    x = (x - mean) / std
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return t(x[train]), t(y[train]), t(x[test]), t(y[test]), int(y.max()) + 1


def worker(args):
    import torch
    import torch.distributed as dist
    from torch import nn

    import torch_ddl  # noqa: F401  registers the backend
    from torch_ddl.optim import AsyncElasticAveraging, DiLoCo, ElasticAveraging

    torch.set_num_threads(1)
    dist.init_process_group("ddl")
    rank, world = dist.get_rank(), dist.get_world_size()
    xtr, ytr, xte, yte, classes = load(args.task)
    mine = torch.arange(rank, len(xtr), world)

    def model(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(xtr.shape[1], args.width), nn.ReLU(),
                             nn.Linear(args.width, args.width), nn.ReLU(),
                             nn.Linear(args.width, classes))

    def batches(seed):
        epoch = 0
        while True:
            g = torch.Generator().manual_seed(7919 * seed + 1000 * epoch + rank)
            order = mine[torch.randperm(len(mine), generator=g)]
            for i in range(0, len(order) - args.batch + 1, args.batch):
                yield order[i:i + args.batch]
            epoch += 1

    import contextlib

    def accuracy(net):
        with torch.no_grad():
            return (net(xte).argmax(1) == yte).float().mean().item()

    def run(method, seed=0, slow=None):
        """A method's curve (slow None), or (slow: a rank slowed 2x) each rank's own steps per
        second over --steps / 2 steps, with no evaluation and no barrier between them."""
        net = model(seed)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
        wrapper, trained = None, net
        if method == "ddp":
            trained = nn.parallel.DistributedDataParallel(net)
        elif method == "easgd":
            wrapper = ElasticAveraging(opt, alpha=0.9 / world, tau=args.tau)
        elif method in ASYNC:
            wrapper = AsyncElasticAveraging(opt, alpha=0.9 / world, tau=args.tau,
                                            momentum=0.5 if method == "async-measgd" else 0.0,
                                            hogwild=method == "hogwild")
        elif method.startswith("diloco") or method == "streaming":
            wire = {"diloco-bf16": torch.bfloat16, "diloco-int8": torch.int8}.get(method)
            fragments, overlap = (4, 1) if method == "streaming" else (1, 0)
            wrapper = DiLoCo(opt, H=args.H, outer_lr=0.7, outer_momentum=0.9,
                             fragments=fragments, overlap=overlap, wire_dtype=wire)
        stepper = wrapper if wrapper is not None else opt
        data = batches(seed)

        def step():
            idx = next(data)
            started = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(trained(xtr[idx]), ytr[idx]).backward()
            stepper.step()
            if rank == slow:  # as long again: a rank half as fast as the others
                time.sleep(time.perf_counter() - started)

        if slow is not None:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps // 2):
                step()
            own = torch.tensor([args.steps // 2 / (time.perf_counter() - start)])
            if method in ASYNC:
                wrapper.close()
            every = [torch.empty_like(own) for _ in range(world)]
            dist.all_gather(every, own)
            return [float(e) for e in every]

        def shipped():
            if method == "easgd" or method in ASYNC:
                return wrapper.centre_weights()
            if wrapper is not None:
                return wrapper.global_weights()
            return contextlib.nullcontext()

        elapsed, curve = 0.0, []
        for done in range(0, args.steps, args.eval):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.eval):
                step()
            if method == "easgd":
                wrapper.synchronize()
            t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            elapsed += t.item()
            with shipped():
                acc = accuracy(net)
            curve.append((done + args.eval, elapsed, acc))
        if method in ASYNC:  # the differences still on their way, then the centre
            start = time.perf_counter()
            wrapper.close()
            t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            elapsed += t.item()
            with wrapper.centre_weights():
                curve[-1] = (args.steps, elapsed, accuracy(net))
        if method == "ddp":
            sent = sum(p.numel() for p in net.parameters()) * 4 * args.steps
        elif method == "compute":
            sent = 0
        else:  # the mean over the ranks (an asynchronous centre rank sends the answers)
            total = torch.tensor([float(wrapper.bytes_communicated)], dtype=torch.float64)
            dist.all_reduce(total)
            sent = total.item() / world
        return {"curve": curve, "bytes_per_step": sent / args.steps,
                "params": sum(p.numel() for p in net.parameters())}

    results = {"compute": run("compute")}
    for method in args.methods:
        runs = [run(method, seed) for seed in range(args.seeds)]
        results[method] = dict(runs[0], seeds=[r["curve"] for r in runs])
    results["slow"] = {m: run(m, slow=args.slow_rank) for m in SLOW_METHODS
                       if m in args.methods and args.slow_rank >= 0}
    # The narrowed exchange's error against float32, on a pseudo-gradient-like tensor: 1 M
    # normal values per rank, each rank's of its own scale.
    from torch_ddl import compress

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(1 << 20, generator=g) * (1 + rank)
    exact = x.double()
    dist.all_reduce(exact)
    results["wire"] = {}
    for wire in (torch.bfloat16, torch.float16, torch.int8):
        y = x.clone()
        compress.all_reduce(y, wire, "sum")
        err = (y.double() - exact)
        results["wire"][str(wire).split(".")[1]] = {
            "rel_rms": (err.norm() / exact.norm()).item(),
            "max_abs_over_rms": (err.abs().max() / exact.pow(2).mean().sqrt()).item()}
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="2x2", help="HOSTSxRANKS")
    parser.add_argument("--rates", default="1gbit,100mbit")
    parser.add_argument("--tasks", default="digits,synthetic")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=384)
    parser.add_argument("--eval", type=int, default=16)
    parser.add_argument("--tau", type=int, default=4, help="Sync EASGD's period")
    parser.add_argument("--H", type=int, default=16, help="DiLoCo's inner steps")
    parser.add_argument("--target", type=float, default=None)
    parser.add_argument("--seeds", type=int, default=3, help="runs of each method (data order "
                        "and initial weights): time to target is their median, accuracy their mean")
    parser.add_argument("--slow-rank", type=int, default=3,
                        help="the rank slowed 2x in the steps/s runs (-1: none)")
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help="write every run's curves here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    if args.worker:
        worker(args)
        return
    hosts, ranks = (int(v) for v in args.shape.split("x"))
    if hosts > 1 and "hogwild" in args.methods:  # it reads and adds in the centre's memory
        args.methods.remove("hogwild")
        print("# hogwild left out: it needs every rank on the centre's host (--shape 1xN)")
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or args.steps % args.eval or args.eval % args.H or args.eval % args.tau:
        raise SystemExit(f"unknown methods {unknown}" if unknown else
                         "--steps must be a multiple of --eval, and --eval of --H and --tau")
    from cluster import Cluster

    everything = {}
    for rate in args.rates.split(","):
        with Cluster(hosts, ranks, rate) as cluster:
            for task in args.tasks.split(","):
                got = cluster.result([
                    sys.executable, str(Path(__file__).resolve()), "--worker", "--task", task,
                    "--methods", ",".join(args.methods), "--width", str(args.width),
                    "--batch", str(args.batch), "--lr", str(args.lr), "--steps", str(args.steps),
                    "--eval", str(args.eval), "--tau", str(args.tau), "--H", str(args.H),
                    "--seeds", str(args.seeds), "--slow-rank", str(args.slow_rank)])
                everything[f"{task}@{rate}"] = got
                target = args.target if args.target is not None else TARGETS[task]
                compute = got["compute"]["curve"][-1][1] / args.steps
                params = got["compute"]["params"] / 1e6
                print(f"# {task} at {rate}, {args.shape}: MLP of {params:.2f} M parameters, "
                      f"{args.steps} steps of {args.batch} per rank, compute alone "
                      f"{compute * 1e3:.2f} ms per step, target {target:.2f}", flush=True)
                for method in args.methods:
                    run = got[method]
                    reached = [next((t for _, t, a in c if a >= target), None)
                               for c in run["seeds"]]
                    median = sorted(reached, key=lambda t: float("inf") if t is None else t)[
                        len(reached) // 2]
                    final = statistics.mean(statistics.mean(a for _, _, a in c[-4:])
                                            for c in run["seeds"])
                    per_step = statistics.mean(c[-1][1] for c in run["seeds"]) / args.steps
                    print(f"LOCALSGD task={task} method={method} link={rate} time_to_target_s="
                          f"{'never' if median is None else f'{median:.2f}'} final_acc="
                          f"{final:.3f} bytes_per_step={run['bytes_per_step']:.0f}"
                          f" comm_share={max(0.0, 1 - compute / per_step):.2f}", flush=True)
                for method, every in got["slow"].items():
                    print(f"SLOW task={task} method={method} link={rate} slowed_rank="
                          f"{args.slow_rank} steps_per_s={statistics.mean(every):.1f} "
                          f"slowest_rank_steps_per_s={min(every):.1f}", flush=True)
    first = next(iter(everything.values()))
    for wire, e in first["wire"].items():
        print(f"WIRE dtype={wire} rel_rms_error={e['rel_rms']:.2e} "
              f"max_abs_error_over_rms={e['max_abs_over_rms']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
