"""The cost model against the simulator: for each shape and size, the plan `auto` picks, its
simulated time (python -m torch_ddl.sim, no payload) and the model's prediction for it; with
--candidates, every plan auto weighs across hosts (the flat ring; multidim of 1 .. dims colours,
1 - 2 rings, 1, 2, 4 or 8 waves), and what auto's pick costs beside the fastest simulated.

    python benchmarks/sim_vs_model.py
    python benchmarks/sim_vs_model.py --shapes 1024x4x8 --sizes 1,4,16,64
    python benchmarks/sim_vs_model.py --candidates --max-colors 2

A shape is RANKSxRANKS_PER_HOSTxHOSTS_PER_RACK (0: no rack level); sizes in MiB per rank.
"""

import argparse
import os

os.environ.setdefault("TORCH_DDL_TRACE_ENTRIES", "0")



def dimensions(ranks, per_host, per_rack):
    """Levels with more than one block (the colours a multidim plan can have)."""
    hosts = ranks // per_host
    racks = -(-hosts // per_rack) if per_rack else 1
    return (per_host > 1) + (hosts > 1 and (not per_rack or per_rack > 1)) + (racks > 1)


def main():
    from torch_ddl import _C

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="8x4x0,16x8x0,8x1x0,64x1x8,64x4x8,256x4x8,1024x4x8")
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--links", default=_C.SIMULATED_LINKS,
                        help="the simulator's default machine (docs/sim.md)")
    parser.add_argument("--candidates", action="store_true",
                        help="simulate every candidate plan, not only auto's pick")
    parser.add_argument("--max-colors", type=int, default=3, help="with --candidates")
    args = parser.parse_args()

    def simulate(ranks, per_host, per_rack, mib, algo="auto", colors=0, rings=0, waves=0):
        return _C.simulate(dict(
            host_sizes=[], ranks=ranks, ranks_per_host=per_host, hosts_per_rack=per_rack,
            links=args.links, reduce_bw=20e9, copy_bw=20e9, payload=False, timeout_ms=600000,
            collective="allreduce", bytes=int(float(mib) * (1 << 20)), seed=1, kill_ranks=[],
            kill_fraction=0.5, algo=algo, colors=colors, rings=rings, waves=waves))

    print(f"links {args.links}, reductions 20 GB/s")
    print(f"{'ranks':>6} {'/host':>5} {'/rack':>5} {'MiB':>5} {'sim us':>10} {'model us':>10}"
          f" {'error':>6}  plan")
    errors, picked, regrets = [], [], []
    for shape in args.shapes.split(","):
        ranks, per_host, per_rack = (int(v) for v in shape.split("x"))
        for mib in args.sizes.split(","):
            plans = [dict()]
            if args.candidates:
                plans = [dict(algo="ring")] + [
                    dict(algo="multidim", colors=c, rings=r, waves=w)
                    for c in range(1, min(dimensions(ranks, per_host, per_rack),
                                          args.max_colors) + 1)
                    for r in (1, 2) for w in (1, 2, 4, 8)]
            runs = []
            for plan in plans:
                r = simulate(ranks, per_host, per_rack, mib, **plan)
                error = (r["model_us"] - r["sim_us"]) / r["sim_us"]
                errors.append(abs(error))
                runs.append((r["model_us"], r["sim_us"], error, r["algo"]))
                print(f"{ranks:6d} {per_host:5d} {per_rack:5d} {mib:>5} {r['sim_us']:10.1f}"
                      f" {r['model_us']:10.1f} {error * 100:5.1f}%  {r['algo']}", flush=True)
            if args.candidates:
                pick = min(runs)  # what auto picks among them: the cheapest predicted
                best = min(runs, key=lambda run: run[1])
                picked.append(abs(pick[2]))
                regrets.append(pick[1] / best[1] - 1)
                print(f"{'':>23} auto's pick: {pick[3]}, error {pick[2] * 100:.1f} %, "
                      f"{regrets[-1] * 100:.1f} % slower than the fastest simulated "
                      f"({best[3]})", flush=True)
    within = sum(e <= 0.10 for e in errors)
    print(f"within 10 %: {within} of {len(errors)}; largest error {max(errors) * 100:.1f} %; "
          f"mean {sum(errors) / len(errors) * 100:.1f} %")
    if args.candidates:
        print(f"auto's picks within 10 %: {sum(e <= 0.10 for e in picked)} of {len(picked)}; "
              f"slower than the fastest simulated plan by {max(regrets) * 100:.1f} % at most")


if __name__ == "__main__":
    main()
