"""python -m torch_ddl.sim: the real engine, group creation, planner and algorithms of up to
thousands of ranks in one process, in virtual time, over a network model (hosts of ranks, racks
of hosts, each level's latency and bandwidth, links that serialise). It creates a group, runs one
collective and prints, last, one line:

    SIM ranks=P algo=A bytes=B sim_us=T model_us=M store_requests=S max_endpoints=E messages=K wall_s=W

    python -m torch_ddl.sim --ranks 1024 --ranks-per-host 4 --hosts-per-rack 8 --bytes 100M
    python -m torch_ddl.sim --ranks 256 --bytes 1M --algo ring          # a forced algorithm
    python -m torch_ddl.sim --ranks 1024 --bytes 100M --kill 517@0.5    # a rank dies mid-op

Link figures use TORCH_DDL_LINKS's syntax (dimension:latency:bandwidth; 0 within a host, 1
between hosts of a rack, 2 between racks): the planner and the network see the same machine.
With payload (the default up to --payload-limit bytes in all) every rank's result is checked
against the reference, computed here. docs/sim.md describes the model.
"""

import argparse
import re
import sys

from torch_ddl import _C

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
ALGORITHMS = ["auto", "ring", "multidim", "leaders", "recursive_doubling", "shared"]
COLLECTIVES = ["allreduce", "broadcast", "allgather", "reduce_scatter", "reduce", "gather",
               "scatter", "alltoall", "barrier"]
DEFAULT_LINKS = "0:2us:20GB,1:5us:12.5GB,2:8us:6GB"


def parse_bytes(text):
    match = re.fullmatch(r"(\d+)([KMG]?)(i?B)?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 4096, 64K, 100M)")
    return int(match.group(1)) * UNITS[match.group(2)]


def parse_rate(text):
    match = re.fullmatch(r"([\d.]+)\s*([KMG]?)B?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not a rate in bytes/s (e.g. 20GB)")
    return float(match.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[match.group(2)]


def parse_kill(text):
    match = re.fullmatch(r"(\d+)@([\d.]+)", text.strip())
    if not match or not 0 <= float(match.group(2)) <= 1:
        raise argparse.ArgumentTypeError(f"--kill {text}: give RANK@FRACTION, e.g. 517@0.5")
    return int(match.group(1)), float(match.group(2))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m torch_ddl.sim", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--ranks-per-host", type=int, default=4)
    p.add_argument("--hosts", default="",
                   help="ranks of each host, comma-separated (uneven hosts): instead of --ranks")
    p.add_argument("--hosts-per-rack", type=int, default=0, help="0: no rack level")
    p.add_argument("--bytes", type=parse_bytes, default=1 << 20, help="per rank, float32")
    p.add_argument("--collective", choices=COLLECTIVES, default="allreduce")
    p.add_argument("--algo", choices=ALGORITHMS, default="auto", help="allreduce's algorithm")
    p.add_argument("--colors", type=int, default=0, help="multidim colours (0: the planner's)")
    p.add_argument("--rings", type=int, default=0,
                   help="multidim rings per colour (0: the planner's)")
    p.add_argument("--waves", type=int, default=0, help="multidim waves (0: the planner's)")
    p.add_argument("--links", default=DEFAULT_LINKS)
    p.add_argument("--reduce-bw", type=parse_rate, default=20e9,
                   help="bytes/s a rank reduces (0: free)")
    p.add_argument("--copy-bw", type=parse_rate, default=20e9, help="bytes/s a rank copies")
    p.add_argument("--payload", choices=["auto", "on", "off"], default="auto",
                   help="carry and check real data (auto: when ranks x bytes <= --payload-limit)")
    p.add_argument("--payload-limit", type=parse_bytes, default=256 << 20)
    p.add_argument("--seed", type=int, default=1, help="the inputs")
    p.add_argument("--kill", type=parse_kill, default=None, metavar="RANK@FRACTION",
                   help="rank RANK dies when FRACTION of the fault-free op's time has passed")
    p.add_argument("--timeout-ms", type=int, default=60000, help="the group's timeout")
    p.add_argument("--verbose", action="store_true", help="creation and failure details")
    args = p.parse_args(argv)

    host_sizes = [int(h) for h in args.hosts.split(",") if h.strip()] if args.hosts else []
    ranks = sum(host_sizes) if host_sizes else args.ranks
    if ranks < 1:
        p.error("give at least one rank")
    payload = args.payload == "on" or (
        args.payload == "auto" and ranks * args.bytes <= args.payload_limit)
    kill_rank, kill_fraction = args.kill if args.kill else (-1, 0.5)
    if kill_rank >= ranks:
        p.error(f"--kill {kill_rank}: there are {ranks} ranks")
    try:
        r = _C.simulate(dict(
            host_sizes=host_sizes, ranks=args.ranks, ranks_per_host=args.ranks_per_host,
            hosts_per_rack=args.hosts_per_rack, links=args.links, reduce_bw=args.reduce_bw,
            copy_bw=args.copy_bw, payload=payload, timeout_ms=args.timeout_ms,
            collective=args.collective, bytes=args.bytes, seed=args.seed, kill_rank=kill_rank,
            kill_fraction=kill_fraction, algo=args.algo, colors=args.colors, rings=args.rings,
            waves=args.waves))
    except ValueError as error:
        print(f"torch_ddl.sim: {error}", file=sys.stderr)
        return 2
    if args.verbose:
        print(f"creation: {r['creation_us']:.1f} us, {r['creation_messages']} messages, "
              f"{r['store_requests']} store requests; {r['events']} events in all")
        port, nic, uplink = (f"{b * 100:.0f} %" for b in r["busiest"])
        print(f"busiest links during the op: a rank's port {port}, a NIC {nic}, "
              f"an uplink {uplink} of its time")
    if r["checked"]:
        print(f"CHECK payload={'ok' if not r['mismatch'] else 'WRONG ' + r['mismatch']}")
    print(f"TRACE digest={r['digest']:016x} events={r['events']}")
    if kill_rank >= 0:
        if args.verbose:
            print(f"killed at {r['killed_at_us']:.1f} us; {r['completed']} survivors had finished "
                  f"(counted by their next call); e.g. {r['first_error']}")
            if r["unnamed_error"]:
                print(f"not naming rank {kill_rank}: {r['unnamed_error']}")
        print(f"KILL rank={kill_rank} named={r['named']} of {r['survivors']} "
              f"by_us={r['named_by_us']:.1f} failure_messages={r['failure_messages']}")
    algo = r["algo"].replace(" ", ":") if args.collective == "allreduce" else args.collective
    print(f"SIM ranks={r['ranks']} algo={algo} bytes={r['bytes']} sim_us={r['sim_us']:.1f} "
          f"model_us={r['model_us']:.1f} store_requests={r['store_requests']} "
          f"max_endpoints={r['max_endpoints']} messages={r['messages']} wall_s={r['wall_s']:.2f}")
    return 1 if r["checked"] and r["mismatch"] else 0


if __name__ == "__main__":
    sys.exit(main())
