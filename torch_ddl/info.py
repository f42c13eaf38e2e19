"""python -m torch_ddl.info: versions, UCX transports and settings; with --plan, the topology and
the allreduce plans the cost model weighs per message size.

    python -m torch_ddl.info                             # versions, transports, settings
    torchrun --nproc_per_node 4 -m torch_ddl.info --plan # the job's topology and plans (rank 0)
    python -m torch_ddl.info --plan --hosts 2x4 --links 1:50us:117MB
    python -m torch_ddl.info --plan --hosts a,a,a,b --topology "r0: a; r1: b"
    python -m torch_ddl.info --trace /tmp/torch_ddl_trace_rank_*   # where the ranks diverged
    python -m torch_ddl.info --fr-trace /tmp/torch_ddl_trace_rank_*  # torch's analyser on them
"""

import argparse
import os
import socket

import torch

import torch_ddl
from torch_ddl import _C


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


DEFAULT_SIZES = [8, 4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _hosts(spec):
    """'2x4' (hosts x ranks each), '2x2x4' (racks x hosts x ranks; the racks go with it) or one
    host name per rank, comma-separated. Returns the host of each rank and the racks."""
    if "x" in spec and "," not in spec:
        dims = [int(v) for v in spec.split("x")]
        if len(dims) == 2:
            return [f"host{h}" for h in range(dims[0]) for _ in range(dims[1])], ""
        if len(dims) == 3:
            racks, hosts, ranks = dims
            names = [[f"r{r}h{h}" for h in range(hosts)] for r in range(racks)]
            topology = "; ".join(f"r{r}: " + " ".join(names[r]) for r in range(racks))
            return [n for rack in names for n in rack for _ in range(ranks)], topology
        raise SystemExit(f"--hosts {spec}: give HOSTSxRANKS or RACKSxHOSTSxRANKS")
    return [h.strip() for h in spec.split(",") if h.strip()], ""


def print_plans(topology, links, rows):
    print(f"topology   {topology}")
    print(f"links      {links}  (dimension:latency:bandwidth:overhead of a message;"
          " 0 within a host, 1 across hosts)")
    for size, candidates in rows:
        print(f"\n{_size(size)}:")
        best = candidates[0][1]
        for i, (plan, seconds) in enumerate(candidates):
            mark = "  <- chosen" if i == 0 else ""
            ratio = f"{seconds / best:5.2f}x" if best > 0 else "     "
            print(f"  {plan:<40} {seconds * 1e3:10.3f} ms  {ratio}{mark}")


def plan_main(args):
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    if args.hosts:
        hosts, racks = _hosts(args.hosts)
        if args.topology is not None:
            racks = args.topology
        topology, links, rows = _C.plan_offline(
            hosts, racks, args.links if args.links is not None else
            os.environ.get("TORCH_DDL_LINKS", ""), sizes)
        print_plans(topology, links, rows)
        return
    if "WORLD_SIZE" not in os.environ:
        raise SystemExit("--plan needs a job (run it under torchrun) or --hosts, e.g. --hosts 2x4")
    import torch.distributed as dist

    dist.init_process_group("ddl")
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    rows = backend.plan_rows(sizes)
    if dist.get_rank() == 0:
        print_plans(backend.topology(), backend.links(), rows)
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(prog="python -m torch_ddl.info", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", action="store_true", help="print the topology and the plans")
    parser.add_argument("--hosts", help="offline: '2x4' or one host name per rank, a,a,b,b")
    parser.add_argument("--topology", help="offline: racks, as TORCH_DDL_TOPOLOGY")
    parser.add_argument("--links", help="offline: link costs, as TORCH_DDL_LINKS")
    parser.add_argument("--sizes", help="message sizes in bytes, comma-separated")
    parser.add_argument("--trace", nargs="+", metavar="DUMP",
                        help="flight recorder dumps (files, a directory or a glob): name the "
                             "first operation where the ranks diverge")
    parser.add_argument("--fr-trace", nargs="+", metavar="DUMP",
                        help="the same dumps through torch's own flight-recorder analyser "
                             "(torch.distributed.flight_recorder.fr_trace)")
    args = parser.parse_args()
    if args.fr_trace:
        from torch_ddl import trace
        raise SystemExit(trace.torch_analyser(args.fr_trace))
    if args.trace:
        from torch_ddl import trace
        raise SystemExit(trace.main(args.trace))
    if args.plan:
        plan_main(args)
        return
    print(f"torch_ddl  {torch_ddl.__version__}")
    print(f"torch      {torch.__version__}")
    print(f"UCX        {_C.ucx_version()}")
    print(f"host       {socket.gethostname()}")
    print("\nUCX transports available (transport/device):")
    for device in _C.transport_devices():
        print(f"  {device}")
    rows = _C.config_table()
    agreed = set(_C.agreed_settings())
    print("\nSettings (environment variable, value, default; 'alike': the same on every rank of a "
          "group, which is refused at creation otherwise):")
    width = max(len(r[0]) for r in rows)
    for name, value, default, description in rows:
        mark = ("   (set)" if value != default else "") + ("   alike" if name in agreed else "")
        print(f"  {name:<{width}}  {value:<10} default {default:<8}{mark}")
        print(f"  {'':<{width}}  {description}")
    print("\nAllreduce plans: python -m torch_ddl.info --plan (inside a job, or --hosts 2x4 offline)")
    print("\nUCX itself is configured with UCX_* variables (e.g. UCX_TLS, UCX_NET_DEVICES).")


if __name__ == "__main__":
    main()
