"""Sync EASGD against DDP across emulated hosts (root): steps/s and the share of a step spent
communicating.

    sudo python benchmarks/easgd_bench.py                 # 2 hosts x 2 ranks, 1 Gbit/s
    sudo python benchmarks/easgd_bench.py --shape 2x2 --rate 1gbit --steps 8

Every rank trains the same MLP (LAYERS linear layers of WIDTH x WIDTH, float32; by default 10 x
1600^2 = 25.6 M parameters) on its own batches over ddl: DistributedDataParallel, then
torch_ddl.optim.ElasticAveraging at each tau (plain and with overlap=True). Compute alone
(forward, backward and the optimizer's step, no communication) is measured in the same run; the
share communicating is 1 - compute / step. Ratios are steps/s over DDP's in the same run.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "cluster"))


def worker(args):
    import torch
    import torch.distributed as dist
    from torch import nn

    import torch_ddl  # noqa: F401  registers the backend
    from torch_ddl.optim import ElasticAveraging

    dist.init_process_group("ddl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    def mlp():
        layers = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), nn.ReLU()]
        return nn.Sequential(*layers)

    x = torch.randn(args.batch, args.width)

    def timed(step, n):
        for _ in range(2):  # warm-up
            step()
        times = []
        for _ in range(n):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank is done
        return t.item()

    results = {}
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)

    def compute():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    results["compute"] = timed(compute, args.steps)
    ddp = nn.parallel.DistributedDataParallel(model)

    def ddp_step():
        opt.zero_grad(set_to_none=True)
        ddp(x).square().mean().backward()
        opt.step()

    results["ddp"] = timed(ddp_step, args.steps)
    params = sum(p.numel() for p in model.parameters())
    for tau in args.taus:
        for overlap in (False, True):
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=1e-6)
            ea = ElasticAveraging(opt, alpha=0.9 / world, tau=tau, overlap=overlap)

            def ea_step():
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                ea.step()

            # Whole rounds of tau steps, so that every measured window holds one averaging.
            results[f"tau{tau}{'o' if overlap else ''}"] = timed(
                lambda: [ea_step() for _ in range(tau)], max(2, args.steps // tau)) / tau
            ea.synchronize()
    # Compute alone again, last: the lower of the two (the first runs on a cold process).
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    results["compute"] = min(results["compute"], timed(compute, args.steps))
    if rank == 0:
        print("RESULT " + json.dumps(dict(results, params=params)), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="2x2", help="HOSTSxRANKS")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--taus", default="1,4,16")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.taus = [int(t) for t in args.taus.split(",")]
    if args.worker:
        worker(args)
        return
    from cluster import Cluster

    hosts, ranks = (int(v) for v in args.shape.split("x"))
    with Cluster(hosts, ranks, args.rate) as cluster:
        got = cluster.result([sys.executable, str(Path(__file__).resolve()), "--worker",
                              "--width", str(args.width), "--layers", str(args.layers),
                              "--batch", str(args.batch), "--steps", str(args.steps),
                              "--taus", ",".join(map(str, args.taus))])
    compute, ddp = got["compute"], got["ddp"]
    print(f"# {args.shape} at {args.rate}: MLP {args.layers} x {args.width}^2 "
          f"({got['params'] / 1e6:.1f} M parameters), batch {args.batch} per rank; compute "
          f"alone {compute * 1e3:.0f} ms per step")
    print(f"{'':14} {'steps/s':>8} {'x DDP':>6} {'communicating':>14}")
    rows = [("DDP", ddp)] + [
        (f"EASGD tau {t}" + (" ov" if o else ""), got[f"tau{t}{'o' if o else ''}"])
        for t in args.taus for o in (False, True)]
    for name, step in rows:
        print(f"{name:14} {1 / step:8.2f} {ddp / step:5.2f}x {max(0.0, 1 - compute / step):13.0%}")


if __name__ == "__main__":
    main()
