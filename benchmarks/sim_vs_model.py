"""The cost model against the simulator: for each shape and size, the plan `auto` picks, its
simulated time (python -m torch_ddl.sim, no payload) and the model's prediction for it.

    python benchmarks/sim_vs_model.py
    python benchmarks/sim_vs_model.py --shapes 1024x4x8 --sizes 1,4,16,64

A shape is RANKSxRANKS_PER_HOSTxHOSTS_PER_RACK (0: no rack level); sizes in MiB per rank.
"""

import argparse
import os

os.environ.setdefault("TORCH_DDL_TRACE_ENTRIES", "0")

LINKS = "0:2us:20GB,1:5us:12.5GB,2:8us:6GB"  # the simulator's default machine (docs/sim.md)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="8x4x0,16x8x0,8x1x0,64x1x8,64x4x8,256x4x8,1024x4x8")
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--links", default=LINKS)
    args = parser.parse_args()
    from torch_ddl import _C

    print(f"links {args.links}, reductions 20 GB/s")
    print(f"{'ranks':>6} {'/host':>5} {'/rack':>5} {'MiB':>5} {'sim us':>10} {'model us':>10}"
          f" {'error':>6}  plan")
    errors = []
    for shape in args.shapes.split(","):
        ranks, per_host, per_rack = (int(v) for v in shape.split("x"))
        for mib in args.sizes.split(","):
            r = _C.simulate(dict(
                host_sizes=[], ranks=ranks, ranks_per_host=per_host, hosts_per_rack=per_rack,
                links=args.links, reduce_bw=20e9, copy_bw=20e9, payload=False,
                timeout_ms=600000, collective="allreduce", bytes=int(float(mib) * (1 << 20)),
                seed=1, kill_rank=-1, kill_fraction=0.5, algo="auto", colors=0, waves=0))
            error = (r["model_us"] - r["sim_us"]) / r["sim_us"]
            errors.append(abs(error))
            print(f"{ranks:6d} {per_host:5d} {per_rack:5d} {mib:>5} {r['sim_us']:10.1f}"
                  f" {r['model_us']:10.1f} {error * 100:5.1f}%  {r['algo']}", flush=True)
    within = sum(e <= 0.10 for e in errors)
    print(f"within 10 %: {within} of {len(errors)}; largest error {max(errors) * 100:.1f} %")


if __name__ == "__main__":
    main()
