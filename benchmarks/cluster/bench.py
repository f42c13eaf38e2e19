"""Allreduce across emulated hosts: gloo, ddl's flat ring, multi-dimensional, multi-colour and
auto plans, next to each schedule's link-limited ideal and the cost model's prediction.

    sudo python benchmarks/cluster/bench.py --shape 2x2 --rate 1gbit
    sudo python benchmarks/cluster/bench.py --shape 2x4
    sudo python benchmarks/cluster/bench.py --shape 2x2x2 --rack-rate 500mbit   # racks x hosts x ranks
    sudo python benchmarks/cluster/bench.py --shape 2x4 --min-bytes 1M --waves 1,2,4,8

The link's real TCP payload rate is measured first (one connection between two hosts, below the
shaped rate) for the ideals. The cost model gets what a user's job gets: the figures ddl's own
probe measures when each group is created (--given-links hands it the measured rate through
TORCH_DDL_LINKS instead). busbw as nccl-tests: bytes/time x 2(P-1)/P. Ideal busbw of a
schedule: its busiest link's bytes at the measured rate (flat ring in host order: the link rate
itself; 2-level ring: x (P-1)/P / (H-1)/H).
All variants run in the same processes, interleaved size by size. --png writes a plot.

Last, the simulator (torch_ddl.sim) runs auto's plan at each size on the same shape with the
links the group probed, beside what was measured: `--from-results FILE` does that alone for a
table written before.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

VARIANTS = {  # name -> environment of its ddl group
    "ring": {"TORCH_DDL_ALLREDUCE_ALGO": "ring"},
    "multidim": {"TORCH_DDL_ALLREDUCE_ALGO": "multidim", "TORCH_DDL_COLORS": "1",
                 "TORCH_DDL_RINGS": "1", "TORCH_DDL_WAVES": "1"},
    "multicolor": {"TORCH_DDL_ALLREDUCE_ALGO": "multidim", "TORCH_DDL_COLORS": "2",
                   "TORCH_DDL_RINGS": "1", "TORCH_DDL_WAVES": "1"},
    "auto": {},
}


def add_variants(args):
    """--algos leaders,...: these algorithms too (TORCH_DDL_ALLREDUCE_ALGO); --waves 1,2,4,8: the
    multidim plan (1 colour, 1 ring) cut into each number of waves."""
    for a in args.algos.split(",") if args.algos else []:
        VARIANTS[a] = {"TORCH_DDL_ALLREDUCE_ALGO": a}
    for w in [int(v) for v in args.waves.split(",")] if args.waves else []:
        VARIANTS[f"waves={w}"] = {"TORCH_DDL_ALLREDUCE_ALGO": "multidim", "TORCH_DDL_COLORS": "1",
                                  "TORCH_DDL_RINGS": "1", "TORCH_DDL_WAVES": str(w)}


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.upper().rstrip("IB").rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 2


def plan_request(plan):
    """'multidim colors=1 rings=2 waves=4 order=0,1' -> the simulator's plan arguments."""
    words = plan.split()
    fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    algo = words[0]
    return dict(algo=algo, colors=int(fields.get("colors", 0)) if algo == "multidim" else 0,
                rings=int(fields.get("rings", 0)) if algo == "multidim" else 0,
                waves=int(fields.get("waves", 0)) if algo == "multidim" else 0)


def simulate_rows(hosts, ranks, racks, links, rows, min_bytes=1 << 20):
    """Auto's plan of each row (from min_bytes) in the simulator with the probed links; prints
    simulated against measured. Reductions are free in the simulation as in the planner: the
    probed host figures include them. Returns the largest error."""
    from torch_ddl import _C

    links = links.split(" (")[0]
    print(f"simulated (python -m torch_ddl.sim, {hosts} hosts x {ranks} ranks"
          f"{', ' + str(len(racks)) + ' racks' if racks else ''}, links {links}):")
    print(f"{'size':>9} {'measured':>9} {'simulated':>9} {'error':>6} {'model':>9}  plan")
    worst = 0.0
    for row in rows:
        if row["bytes"] < min_bytes:
            continue
        r = _C.simulate(dict(
            host_sizes=[], ranks=hosts * ranks, ranks_per_host=ranks,
            hosts_per_rack=hosts // len(racks) if racks else 0, links=links, reduce_bw=0.0,
            copy_bw=0.0, payload=False, timeout_ms=600000, collective="allreduce",
            bytes=row["bytes"], seed=1, kill_ranks=[], kill_fraction=0.5,
            **plan_request(row["auto_plan"])))
        error = (r["sim_us"] * 1e-6 - row["auto"]) / row["auto"]
        worst = max(worst, abs(error))
        size = row["bytes"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(f"{label:>9} {row['auto'] * 1e3:8.2f}m {r['sim_us'] * 1e-3:8.2f}m "
              f"{error * 100:5.0f}% {r['model_us'] * 1e-3:8.2f}m  {r['algo']}")
    print(f"(largest error from {min_bytes >> 20} MiB: {worst * 100:.0f}%)")
    return worst


def table_of(path):
    """The variants' names and, per size, each one's time per op and the ideals (MB/s) of a table
    bench.py printed: what plot() draws."""
    text = Path(path).read_text().splitlines()
    header = next(line.split() for line in text if line.split()[:2] == ["size", "gloo"])
    names = header[1:header.index("ideal:ring")]
    rows = []
    for line in text:
        cells = line.split()
        if len(cells) > 14 and cells[1] in ("KiB", "MiB") and cells[0].isdigit():
            size = int(cells[0]) << (20 if cells[1] == "MiB" else 10)
            row = {"bytes": size, "ideal_ring": float(cells[2 + len(names)]),
                   "ideal_dim": float(cells[3 + len(names)])}
            for k, name in enumerate(names):
                row[name] = size / (float(cells[2 + k]) * 1e6)  # plot() takes busbw = bytes / this
            rows.append(row)
    return names, rows


def rows_from_results(path):
    """The shape, links and rows of a table bench.py printed."""
    text = Path(path).read_text().splitlines()
    shape = text[0].split()[1]
    links = next(line.split(": ", 1)[1] for line in text if line.startswith("# cost model"))
    rows = []
    for line in text:
        cells = line.split()
        if len(cells) > 14 and cells[1] in ("KiB", "MiB") and cells[0].isdigit():
            size = int(cells[0]) << (20 if cells[1] == "MiB" else 10)
            measured = float(cells[-7].rstrip("m")) * 1e-3
            rows.append(dict(bytes=size, auto=measured, auto_plan=" ".join(cells[-5:])))
    return shape, links, rows


def worker(args):
    import torch
    import torch.distributed as dist

    import torch_ddl

    add_variants(args)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD}
    backends = {}
    for name, env in VARIANTS.items():
        saved = {k: os.environ.get(k) for k in ("TORCH_DDL_ALLREDUCE_ALGO", "TORCH_DDL_COLORS",
                                                "TORCH_DDL_RINGS", "TORCH_DDL_WAVES")}
        for k in saved:
            os.environ.pop(k, None)
        os.environ.update(env)
        torch_ddl._C.check_config()  # a ddl group keeps the settings in effect at its creation
        groups[name] = dist.new_group(backend="ddl")
        backends[name] = groups[name]._get_backend(torch.device("cpu"))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        torch_ddl._C.check_config()
    if rank == 0:
        print("LINKS " + json.dumps({n: b.links() for n, b in backends.items()}), flush=True)
    rows = []
    for size in sizes(args.min_bytes, args.max_bytes):
        n = size // 4
        tensor = torch.ones(n)
        times = {name: [] for name in groups}
        iters = max(2, min(args.iters, int(args.budget * 119e6 / max(size, 1))))
        for name, group in groups.items():  # warm-up, and a check of every variant
            tensor.fill_(1.0)
            dist.all_reduce(tensor, group=group)
            if not bool((tensor == world).all()):
                raise SystemExit(f"{name}: wrong sum at {size} bytes")
        for _ in range(iters):
            for name, group in groups.items():
                dist.barrier(group=groups["gloo"])
                start = time.perf_counter()
                dist.all_reduce(tensor, group=group)
                times[name].append(time.perf_counter() - start)
        row = {"bytes": size}
        for name in groups:
            # The slowest rank's median: an allreduce ends when its last rank is done.
            t = torch.tensor([statistics.median(times[name])], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
            row[name] = t.item()
        for name, backend in backends.items():
            plan, predicted = backend.plan_rows([size])[0][1][0]
            row[f"{name}_plan"], row[f"{name}_predicted"] = plan, predicted
        rows.append(row)
        if rank == 0:
            print("ROW " + json.dumps(row), flush=True)
    for group in list(groups.values())[1:]:
        dist.destroy_process_group(group)
    dist.destroy_process_group()


def shape_of(text):
    dims = [int(v) for v in text.split("x")]
    if len(dims) == 2:
        return dims[0], dims[1], None
    if len(dims) == 3:
        return dims[0] * dims[1], dims[2], [dims[1]] * dims[0]
    raise SystemExit(f"--shape {text}: HOSTSxRANKS or RACKSxHOSTSxRANKS")


def ideal_seconds(hosts, racks, ranks, size, host_rate, rack_rate, schedule):
    """Link-limited time of a schedule from the offline model with zero latency."""
    import torch_ddl._C as C

    names = [f"h{h}" for h in range(hosts) for _ in range(ranks)]
    spec = ""
    if racks:
        spec, at = [], 0
        for k, n in enumerate(racks):
            spec.append(f"r{k}: " + " ".join(f"h{h}" for h in range(at, at + n)))
            at += n
        spec = "; ".join(spec)
    links = f"0:0us:1000GB,1:0us:{host_rate}B" + (f",2:0us:{rack_rate}B" if racks else "")
    old = os.environ.get("TORCH_DDL_ALLREDUCE_ALGO")
    os.environ["TORCH_DDL_ALLREDUCE_ALGO"] = "ring" if schedule == "ring" else "multidim"
    C.check_config()
    try:
        _, _, rows = C.plan_offline(names, spec, links, [size])
    finally:
        if old is None:
            os.environ.pop("TORCH_DDL_ALLREDUCE_ALGO")
        else:
            os.environ["TORCH_DDL_ALLREDUCE_ALGO"] = old
        C.check_config()
    return rows[0][1][0][1]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="2x2", help="HOSTSxRANKS or RACKSxHOSTSxRANKS")
    parser.add_argument("--rate", default="1gbit", help="host link rate (tc)")
    parser.add_argument("--rack-rate", default="500mbit", help="rack uplink rate (3 levels)")
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("64K"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("64M"))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--budget", type=float, default=3.0,
                        help="seconds of link time per variant and size, at most")
    parser.add_argument("--algos", help="also these TORCH_DDL_ALLREDUCE_ALGO values (leaders,...)")
    parser.add_argument("--waves", help="also multidim cut into these numbers of waves (1,2,4)")
    parser.add_argument("--png", help="write a plot of busbw against size here")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--given-links", action="store_true",
                        help="hand the cost model the measured TCP rate (TORCH_DDL_LINKS) "
                             "instead of letting ddl probe the links")
    parser.add_argument("--from-results", metavar="FILE",
                        help="simulate the auto plans of a table written before, and stop")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.from_results:
        shape, links, rows = rows_from_results(args.from_results)
        hosts, ranks, racks = shape_of(shape)
        if args.png:  # the plot of the table alone
            first = Path(args.from_results).read_text().splitlines()[0]
            args.shape, args.rate = shape, first.split("host link ")[1].split(":")[0]
            names, rows = table_of(args.from_results)
            plot(rows, names, 1.0, args)  # the table's busbw, its factor in already
            return
        simulate_rows(hosts, ranks, racks, links, rows)
        return
    from cluster import Cluster

    hosts, ranks, racks = shape_of(args.shape)
    world = hosts * ranks
    with Cluster(hosts, ranks, args.rate, racks, args.rack_rate if racks else None) as cluster:
        host_rate = cluster.measure_link(src=0, dst=1)
        rack_rate = cluster.measure_link(src=0, dst=hosts - 1) if racks else None
        links = f"1:60us:{host_rate:.0f}B" + (f",2:80us:{rack_rate:.0f}B" if racks else "")
        print(f"# {args.shape} ({hosts} hosts x {ranks} ranks"
              f"{', racks ' + str(racks) if racks else ''}), host link {args.rate}: "
              f"{host_rate / 1e6:.1f} MB/s TCP payload"
              f"{f', rack uplink {args.rack_rate}: {rack_rate / 1e6:.1f} MB/s' if racks else ''}"
              + (f"; TORCH_DDL_LINKS={links}" if args.given_links else ""), flush=True)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("TORCH_DDL_LINKS", None)
        if args.given_links:
            env["TORCH_DDL_LINKS"] = links
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker",
                "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
                "--iters", str(args.iters), "--budget", str(args.budget)]
        for option in ("algos", "waves"):
            if getattr(args, option):
                argv += [f"--{option}", getattr(args, option)]
        results = cluster.launch(argv, env=env, timeout=3600)
    failed = [(r, code, out) for r, (code, out) in enumerate(results) if code != 0]
    if failed:
        for r, code, out in failed:
            print(f"rank {r} exited {code}:\n{out[-3000:]}", file=sys.stderr)
        raise SystemExit(1)
    rows = [json.loads(line[4:]) for line in results[0][1].splitlines() if line.startswith("ROW ")]
    for line in results[0][1].splitlines():
        if line.startswith("LINKS "):
            print(f"# cost model's links (auto group): {json.loads(line[6:])['auto']}")
    import torch_ddl  # noqa: F401  (after the run: the offline model for the ideals)
    factor = 2 * (world - 1) / world
    add_variants(args)
    names = ["gloo", *VARIANTS]
    width = {n: max(10, len(n)) for n in names}
    print(f"{'size':>9} " + " ".join(f"{n:>{width[n]}}" for n in names) +
          f" {'ideal:ring':>10} {'ideal:dim':>10} {'auto/gloo':>9} {'auto/ideal':>10}"
          f" {'predicted':>9} {'measured':>9} {'error':>6}  auto plan")
    for row in rows:
        size = row["bytes"]
        busbw = {n: size / row[n] * factor / 1e6 for n in names}
        ideal_ring = size / ideal_seconds(hosts, racks, ranks, size, host_rate, rack_rate,
                                          "ring") * factor / 1e6
        ideal_dim = size / ideal_seconds(hosts, racks, ranks, size, host_rate, rack_rate,
                                         "multidim") * factor / 1e6
        row["ideal_ring"], row["ideal_dim"] = ideal_ring, ideal_dim
        error = (row["auto_predicted"] - row["auto"]) / row["auto"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(f"{label:>9} " + " ".join(f"{busbw[n]:{width[n]}.1f}" for n in names) +
              f" {ideal_ring:10.1f} {ideal_dim:10.1f} {busbw['auto'] / busbw['gloo']:9.2f}"
              f" {busbw['auto'] / ideal_dim:10.2f} {row['auto_predicted'] * 1e3:8.2f}m"
              f" {row['auto'] * 1e3:8.2f}m {error * 100:5.0f}%  {row['auto_plan']}")
    print("(busbw in MB/s; ideal:ring/dim = link-limited busbw of the flat ring / the best "
          "multidim schedule at the measured rates; predicted/measured: auto's time per op)")
    auto_links = next((json.loads(line[6:])["auto"] for line in results[0][1].splitlines()
                       if line.startswith("LINKS ")), "")
    simulate_rows(hosts, ranks, racks, auto_links, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": args.shape, "rows": rows}, indent=1))
    if args.png:
        plot(rows, names, factor, args)


def plot(rows, names, factor, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes_ = [r["bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for n in names:
        ax.plot(sizes_, [r["bytes"] / r[n] * factor / 1e6 for r in rows], marker="o", label=n)
    ax.plot(sizes_, [r["ideal_ring"] for r in rows], "k--", linewidth=1, label="ideal: flat ring")
    ax.plot(sizes_, [r["ideal_dim"] for r in rows], "k:", linewidth=1.5, label="ideal: multidim")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (MB/s)")
    ax.set_title(f"allreduce across emulated hosts, {args.shape}, {args.rate} links")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
