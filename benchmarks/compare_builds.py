"""What a change costs: ddl's allreduce time from two builds of torch_ddl, in alternating runs.

    git worktree add /tmp/before <revision>
    (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/compare_builds.py --before /tmp/before --after . --world-size 2

Each run starts --world-size processes that import torch_ddl from one tree (its directory goes
first on PYTHONPATH), time --ops allreduces per round of each size, and report the median round
per op. Runs alternate before/after --pairs times, so that machine noise that drifts over
minutes hits both builds alike; per size the script prints each build's median time and the
after/before ratio of each pair (median, lowest, highest). A ratio of 1.02 is 2 % slower.

--after-env NAME=VALUE (repeatable) sets the environment of the after runs alone: with --before .
--after . it weighs a setting against the default in one build.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import json, os, sys, time
import torch
import torch.distributed as dist
import torch_ddl
rank, size = int(sys.argv[1]), int(sys.argv[2])
if sys.argv[7] == "1":  # one core per rank (its threads included)
    os.sched_setaffinity(0, {rank % os.cpu_count()})
sizes, ops, rounds = json.loads(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(1)
dist.init_process_group("ddl", init_method="file://" + sys.argv[3], rank=rank, world_size=size)
result = {"module": os.path.dirname(torch_ddl.__file__)}
for nbytes in sizes:
    x = torch.ones(max(nbytes // 4, 1))
    for _ in range(ops):
        dist.all_reduce(x)
    per_round = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(ops):
            dist.all_reduce(x)
        per_round.append((time.perf_counter() - start) / ops)
    result[str(nbytes)] = sorted(per_round)[len(per_round) // 2]
if rank == 0:
    print("RESULT " + json.dumps(result), flush=True)
dist.destroy_process_group()
"""


def run(tree, size, sizes, ops, rounds, pin, settings=()):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OMP_NUM_THREADS="1")
    env.update(settings)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(size), store,
                                   json.dumps(sizes), str(ops), str(rounds), "1" if pin else "0"],
                                  env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  cwd=tmp) for r in range(size)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            raise SystemExit(f"{tree}: rank {r} exited {p.returncode}:\n{out[-3000:]}")
    line = [l for l in outs[0].splitlines() if l.startswith("RESULT ")][0]
    result = json.loads(line[len("RESULT "):])
    want = os.path.join(os.path.abspath(tree), "torch_ddl")
    if os.path.realpath(result.pop("module")) != os.path.realpath(want):
        raise SystemExit(f"{tree}: torch_ddl was not imported from it (built in place?)")
    return {int(k): v for k, v in result.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="a source tree built in place")
    parser.add_argument("--after", default=".", help="a source tree built in place")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--sizes", default="8,1024", help="bytes, comma-separated")
    parser.add_argument("--ops", type=int, default=2000, help="allreduces per round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--pin", action="store_true",
                        help="rank r and its threads on core r mod the cores (before import)")
    parser.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the after runs alone (repeatable)")
    args = parser.parse_args()
    settings = {}
    for item in args.after_env:
        name, eq, value = item.partition("=")
        if not eq or not name:
            parser.error(f"--after-env {item!r} is not NAME=VALUE")
        settings[name] = value
    sizes = [int(s) for s in args.sizes.split(",")]
    times = {"before": {s: [] for s in sizes}, "after": {s: [] for s in sizes}}
    for pair in range(args.pairs):
        order = ["before", "after"] if pair % 2 == 0 else ["after", "before"]
        for which in order:
            tree = args.before if which == "before" else args.after
            extra = settings if which == "after" else {}
            for s, t in run(tree, args.world_size, sizes, args.ops, args.rounds, args.pin,
                            extra).items():
                times[which][s].append(t)
        print(f"pair {pair + 1}/{args.pairs}: " + ", ".join(
            f"{s} B {times['before'][s][-1] * 1e6:.1f} / {times['after'][s][-1] * 1e6:.1f} us"
            for s in sizes), flush=True)
    print(f"\n{args.world_size} ranks, {args.pairs} pairs of runs, {args.rounds} rounds of "
          f"{args.ops} allreduces per size and run"
          + (f"; after: {' '.join(args.after_env)}" if settings else ""))
    print(f"{'bytes':>8} {'before us':>10} {'after us':>10} {'after/before':>13} "
          f"{'lowest':>7} {'highest':>7}")
    for s in sizes:
        ratios = [a / b for a, b in zip(times["after"][s], times["before"][s])]
        print(f"{s:>8} {statistics.median(times['before'][s]) * 1e6:>10.2f} "
              f"{statistics.median(times['after'][s]) * 1e6:>10.2f} "
              f"{statistics.median(ratios):>13.3f} {min(ratios):>7.3f} {max(ratios):>7.3f}")


if __name__ == "__main__":
    main()
