"""One-sided puts against send/recv of the same bytes, in one run: a ping-pong between 2 ranks
(rank 0 writes the message to rank 1, which writes it back), half a round trip per message.

- put, mapped:  window puts into the peer's tensor mapped here (torch_ddl.empty_shared, same
                host), then a signal; the peer waits for the signal.
- put, UCX:     the same into a tensor that is not in shared memory (UCX's one-sided puts:
                CMA or shared memory within a host, TCP across hosts), then a signal.
- send/recv:    dist.send / dist.recv of the same tensor over the same ddl group.

Prints the time per message and the bandwidth (bytes / time) of each, and the ratio of
send/recv's time to each put's (above 1: the put is faster).

    python benchmarks/window_bench.py                    # 2 ranks on this host
    python benchmarks/window_bench.py --hosts 2          # 1 rank on each of 2 emulated hosts
    python benchmarks/window_bench.py --png out.png
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20]
KINDS = ["put, mapped", "put, UCX", "send/recv"]


def _iterations(size):
    return max(5, min(1000, (32 << 20) // max(size, 1)))


def worker(args):
    import torch
    import torch.distributed as dist

    import torch_ddl

    torch.set_num_threads(1)
    dist.init_process_group("ddl")
    rank = dist.get_rank()
    peer = 1 - rank
    biggest = max(args.sizes)
    shared = torch_ddl.empty_shared(biggest, dtype=torch.uint8)
    # A view that is not its tensor's whole storage: never moved into shared memory, so puts into
    # it go over UCX on this host too.
    heap = torch.zeros(biggest + 64, dtype=torch.uint8)[64:]
    source = torch.full((biggest,), rank + 1, dtype=torch.uint8)
    windows = {"put, mapped": torch_ddl.new_window(shared), "put, UCX": torch_ddl.new_window(heap)}
    routes = {kind: w.route(peer) for kind, w in windows.items()}
    rows = []
    for size in args.sizes:
        message = source[:size]
        row = {"bytes": size}
        for kind in KINDS:
            if kind == "send/recv":
                inbox = torch.empty(size, dtype=torch.uint8)

                def one(message=message, inbox=inbox):
                    if rank == 0:
                        dist.send(message, peer)
                        dist.recv(inbox, peer)
                    else:
                        dist.recv(inbox, peer)
                        dist.send(message, peer)
            else:
                w = windows[kind]

                def one(w=w, message=message):
                    if rank == 0:
                        w.put(message, peer, 0, False)
                        w.signal(peer, False)
                        w.wait_signal(peer, False)
                    else:
                        w.wait_signal(peer, False)
                        w.put(message, peer, 0, False)
                        w.signal(peer, False)
            iters = _iterations(size)
            for _ in range(max(1, iters // 5)):
                one()
            times = []
            for _ in range(args.rounds):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    one()
                times.append((time.perf_counter() - start) / iters / 2)
            row[kind] = statistics.median(times)
        rows.append(row)
    # The puts landed: each rank's tensors hold what the other wrote last.
    assert int(shared[0]) == peer + 1 and int(heap[0]) == peer + 1
    for w in windows.values():
        w.tensor_deregister()
    if rank == 0:
        print("RESULT " + json.dumps({"rows": rows, "routes": routes,
                                      "topology": dist.group.WORLD._get_backend(
                                          torch.device("cpu")).topology()}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run_local(argv):
    # Below the ephemeral range: a port drawn with bind(0) and freed can be taken by any
    # connect() before rank 0's store binds it (tests/python/ddl_testing.py).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
    from ddl_testing import free_port

    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DDL_TRACE_ENTRIES="0", WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        outs.append((p.returncode, out))
    for r, (code, out) in enumerate(outs):
        if code != 0:
            print(f"rank {r} exited {code}:\n{out[-3000:]}", file=sys.stderr)
            raise SystemExit(1)
    return json.loads(next(line[len("RESULT "):] for line in outs[0][1].splitlines()
                           if line.startswith("RESULT ")))


def run_hosts(argv, rate):
    sys.path.insert(0, str(Path(__file__).resolve().parent / "cluster"))
    from cluster import Cluster, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot emulate hosts here: {reason}")
    with Cluster(2, 1, rate=rate) as cluster:
        return cluster.result(argv)


def _human(size):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def report(result, title):
    print(f"# {title}: {result['topology']}")
    print("# routes: " + ", ".join(f"{k} -> {v}" for k, v in result["routes"].items()))
    print(f"{'size':>8} " + " ".join(f"{k + ' us':>15}" for k in KINDS) +
          f" {'GB/s mapped':>12} {'GB/s UCX':>9} {'GB/s s/r':>9}"
          f" {'s/r / mapped':>13} {'s/r / UCX':>10}")
    if result.get("link_gbs"):
        print(f"# the link: {result['link_gbs']:.3f} GB/s (its rate / 8)")
    for row in result["rows"]:
        size = row["bytes"]
        us = [row[k] * 1e6 for k in KINDS]
        gbs = [size / row[k] / 1e9 for k in KINDS]
        print(f"{_human(size):>8} " + " ".join(f"{u:>15.1f}" for u in us) +
              f" {gbs[0]:>12.2f} {gbs[1]:>9.2f} {gbs[2]:>9.2f}"
              f" {row['send/recv'] / row['put, mapped']:>13.2f}"
              f" {row['send/recv'] / row['put, UCX']:>10.2f}")


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, (title, result) in zip(axes[0], results):
        sizes = [r["bytes"] for r in result["rows"]]
        for kind in KINDS:
            ax.plot(sizes, [r["bytes"] / r[kind] / 1e9 for r in result["rows"]], marker="o",
                    label=kind)
        if result.get("link_gbs"):
            ax.axhline(result["link_gbs"], color="gray", linestyle="--",
                       label="link (rate / 8, no overhead)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message (bytes)")
        ax.set_ylabel("GB/s (bytes / one-way time)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# plot: {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hosts", type=int, choices=[1, 2], default=1,
                   help="1: both ranks on this host; 2: one on each of 2 emulated hosts")
    p.add_argument("--both", action="store_true", help="one host, then two emulated hosts")
    p.add_argument("--rate", default="1gbit", help="the emulated link (tc rate; none: unshaped)")
    p.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--png", help="write a plot of the bandwidths here")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(args)
        return
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--sizes",
            ",".join(str(s) for s in args.sizes), "--rounds", str(args.rounds)]
    results = []
    if args.both or args.hosts == 1:
        results.append(("one host, 2 ranks", run_local(argv)))
    if args.both or args.hosts == 2:
        rate = None if args.rate == "none" else args.rate
        # Up to 16 MiB: a 64 MiB message takes half a second each way at 1 Gbit/s.
        hosts_argv = list(argv)
        hosts_argv[hosts_argv.index("--sizes") + 1] = ",".join(
            str(s) for s in args.sizes if s <= 16 << 20 or rate is None)
        result = run_hosts(hosts_argv, rate)
        if rate is not None and rate.endswith("gbit"):
            result["link_gbs"] = float(rate[:-4]) / 8
        elif rate is not None and rate.endswith("mbit"):
            result["link_gbs"] = float(rate[:-4]) / 8000
        results.append((f"2 emulated hosts, 1 rank each, link {args.rate}", result))
    for title, result in results:
        report(result, title)
    if args.png:
        plot(results, args.png)


if __name__ == "__main__":
    main()
