"""python -m torch_ddl.sim: the real engine, group creation, planner and algorithms of up to
thousands of ranks in one process, in virtual time, over a network model (hosts of ranks, racks
of hosts, each level's latency and bandwidth, links that serialise). It creates a group, runs one
collective and prints, last, one line:

    SIM ranks=P algo=A bytes=B sim_us=T model_us=M store_requests=S max_endpoints=E messages=K op_messages=O creation_us=C wall_s=W

    python -m torch_ddl.sim --ranks 1024 --ranks-per-host 4 --hosts-per-rack 8 --bytes 100M
    python -m torch_ddl.sim --ranks 256 --bytes 1M --algo ring          # a forced algorithm
    python -m torch_ddl.sim --ranks 1024 --bytes 100M --kill 517@0.5    # a rank dies mid-op
    python -m torch_ddl.sim --ranks 1024 --bytes 16M --kill 516-519@0.5 --shrink
                                  # a host of 4 dies; the survivors shrink and go on
    python -m torch_ddl.sim --ranks 512 --partition 256-511@0.5 --shrink
                                  # two halves: the one with rank 0 goes on, the other fails
    python -m torch_ddl.sim --ranks 64 --stall 9@0.5:5000   # rank 9 stops turning for 5 s
    python -m torch_ddl.sim --ranks 64 --slow 9:10 --slow-link 3:4  # a slow rank, a slow NIC
    python -m torch_ddl.sim --campaign 10000 --seed 1       # the fault campaign (docs/faults.md)
    python -m torch_ddl.sim --scenario 3bde7e46dc889404     # one scenario of it, alone

A campaign draws whole scenarios from its seed (a machine, a sequence of ops, faults, the
survivors' response), runs each on the real engine and checks every invariant; its last line is

    CAMPAIGN scenarios=N hangs=H wrong=W unnamed=U split=S slow_news=L over_budget=B stale_used=D early_signal=E wall_s=T

Link figures use TORCH_DDL_LINKS's syntax (dimension:latency:bandwidth; 0 within a host, 1
between hosts of a rack, 2 between racks): the planner and the network see the same machine.
With payload (the default up to --payload-limit bytes in all) every rank's result is checked
against the reference, computed here. docs/sim.md describes the model.
"""

import argparse
import os
import re
import sys

from torch_ddl import _C

HUGE_PAGES = "glibc.malloc.hugetlb=1"
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
ALGORITHMS = ["auto", "ring", "multidim", "leaders", "recursive_doubling", "shared"]
COLLECTIVES = ["allreduce", "broadcast", "allgather", "reduce_scatter", "reduce", "gather",
               "scatter", "alltoall", "barrier"]
DEFAULT_LINKS = _C.SIMULATED_LINKS


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


def parse_ranks(text):
    """'5', '3,9,12', '516-519' or a mix ('1,4-6'): the ranks in order, each once."""
    ranks = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise ValueError(part)
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        ranks += [r for r in range(first, last + 1) if r not in ranks]
    return ranks


def parse_kill(text):
    ranks_text, _, fraction = text.strip().partition("@")
    try:
        ranks = parse_ranks(ranks_text)
        at = float(fraction)
    except ValueError:
        ranks, at = [], -1
    if not ranks or not 0 <= at <= 1:
        raise argparse.ArgumentTypeError(
            f"--kill {text}: give RANKS@FRACTION, e.g. 517@0.5, 3,9@0.2 or 516-519@0.5")
    return ranks, at


def parse_stall(text):
    """RANK@FRACTION[:MS]: MS omitted, the rank never turns again."""
    match = re.fullmatch(r"\s*(\d+)\s*@\s*([0-9.]+)\s*(?::\s*(\d+)\s*)?", text)
    if not match or not 0 <= float(match.group(2)) <= 1:
        raise argparse.ArgumentTypeError(
            f"--stall {text}: give RANK@FRACTION[:MS], e.g. 9@0.5:5000 (MS omitted: for good)")
    return int(match.group(1)), float(match.group(2)), (
        float(match.group(3)) if match.group(3) else -1.0)


def parse_time(text):
    """A virtual time after the op's start: seconds, or with a unit (us, ms, s)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*(us|ms|s)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"--status-at {text}: give a time, e.g. 2.5, 300ms, 50us")
    return float(match.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6, None: 1e6}[match.group(2)]


def print_status(r):
    """Every rank as python -m torch_ddl.status sees a process, at the time --status-at asked."""
    import json

    from . import status

    results = {}
    for text in r["status"]:
        row = json.loads(text)
        record = {"host": row["host"]}
        if row["state"] == "ok":
            results[row["rank"]] = ("ok", row["answer"], record)
        elif row["state"] == "stopped":
            results[row["rank"]] = ("stopped", "stalled: not turned (it would not answer)", record)
        else:
            results[row["rank"]] = ("dead", "killed", record)
    verdict, ranks = status.diagnose(results)
    print(f"STATUS at_us={r['status_taken_us']:.1f}: {verdict}")
    print(status.table(ranks))


def parse_factor(flag):
    def parse(text):
        match = re.fullmatch(r"\s*(\d+)\s*:\s*([0-9.]+)\s*", text)
        if not match or float(match.group(2)) < 1:
            raise argparse.ArgumentTypeError(
                f"{flag} {text}: give WHICH:FACTOR with FACTOR at least 1, e.g. 9:10")
        return int(match.group(1)), float(match.group(2))
    return parse


def describe_ranks(ranks):
    """[516, 517, 518, 519, 7] -> '7,516-519'."""
    ranks, out, i = sorted(ranks), [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


# The collectives whose input or output holds a block of --bytes per rank of the group.
PER_RANK_BLOCKS = ("allgather", "reduce_scatter", "gather", "scatter", "alltoall")


def payload_bytes(collective, ranks, nbytes):
    """The bytes every rank's input (or output, the larger) holds in all, carried as payload. An
    allgather's outputs are ranks x ranks x bytes: counted as ranks x bytes, 1 024 ranks of 64 KiB
    took 24 GB and the run was killed for memory, silently."""
    return ranks * nbytes * (ranks if collective in PER_RANK_BLOCKS else 1)


def parser():
    p = argparse.ArgumentParser(prog="python -m torch_ddl.sim", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--ranks-per-host", type=int, default=4)
    p.add_argument("--hosts", type=host_sizes, default=[],
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
    p.add_argument("--store-us", type=float, default=31.0,
                   help="us the store's one server takes per request it answers (get, add, "
                        "multi_get; TCPStore here: 31, benchmarks/store_service.py); a set takes "
                        "--store-set-us, each key of a multi_get past the first --store-key-us")
    p.add_argument("--store-set-us", type=float, default=2.2)
    p.add_argument("--store-key-us", type=float, default=0.64)
    p.add_argument("--payload", choices=["auto", "on", "off"], default="auto",
                   help="carry and check real data (auto: when the ranks' inputs or outputs "
                        "come to at most --payload-limit bytes: ranks x bytes, or ranks x ranks x "
                        "bytes for the collectives whose input or output is a block per rank)")
    p.add_argument("--payload-limit", type=parse_bytes, default=256 << 20)
    p.add_argument("--seed", type=int, default=1, help="the inputs")
    p.add_argument("--kill", type=parse_kill, default=None, metavar="RANKS@FRACTION",
                   help="the ranks (a rank, a list or a range: 517, 3,9, 516-519) die at once "
                        "when FRACTION of the fault-free op's time has passed")
    p.add_argument("--partition", type=parse_kill, default=None, metavar="RANKS@FRACTION",
                   help="cut these ranks off from the rest (quietly) at FRACTION of the op")
    p.add_argument("--stall", type=parse_stall, default=None, metavar="RANK@FRACTION[:MS]",
                   help="the rank stops turning for MS milliseconds (omitted: for good)")
    p.add_argument("--slow", type=parse_factor("--slow"), default=None, metavar="RANK:FACTOR",
                   help="the rank computes FACTOR times slower")
    p.add_argument("--slow-link", type=parse_factor("--slow-link"), default=None,
                   metavar="HOST:FACTOR", help="the host's NIC is FACTOR times slower")
    p.add_argument("--campaign", type=int, default=0, metavar="N",
                   help="run N scenarios drawn from --seed, checking every invariant")
    p.add_argument("--max-ranks", type=int, default=8192,
                   help="a campaign passes over scenarios drawn larger")
    p.add_argument("--scenario", default=None, metavar="SEED",
                   help="replay one scenario of a campaign by its seed (hex)")
    p.add_argument("--slow-store", action="store_true",
                   help="a campaign (or --scenario) draws a slow store too: a path not yet held "
                        "(docs/faults.md)")
    p.add_argument("--shrink", action="store_true",
                   help="after --kill, the survivors shrink the group (each excluding the ranks "
                        "it knows are gone) and run 20 collectives of mixed kinds on it, each "
                        "with payload while it comes to at most --payload-limit")
    p.add_argument("--timeout-ms", type=int, default=60000, help="the group's timeout")
    p.add_argument("--status-at", type=parse_time, default=None, metavar="T",
                   help="print every rank as python -m torch_ddl.status sees a job, at virtual "
                        "time T after the op's start (seconds, or 300ms, 50us)")
    p.add_argument("--verbose", action="store_true", help="creation and failure details")
    p.add_argument("--progress", action="store_true",
                   help="a line on stderr as each stage of a long run ends (virtual and wall "
                        "time, peak memory)")
    p.add_argument("--no-huge-pages", action="store_true",
                   help="from 4 096 ranks, and for campaigns, the command runs itself again with "
                        "glibc's malloc asking for transparent huge pages (GLIBC_TUNABLES="
                        f"{HUGE_PAGES}) where the kernel lends them on request; this leaves it "
                        "as it is")
    return p


def host_sizes(text):
    """--hosts: each host's number of ranks, comma-separated."""
    try:
        return [int(h) for h in text.split(",") if h.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give each host's number of ranks, comma-separated (as 8,8,4)") from None


def huge_pages_environment(args):
    """The environment to run again in, with malloc's memory in transparent huge pages, or None.

    A large run touches gigabytes of ranks' state at random, and huge pages make each of its
    misses cheaper (fewer of them miss in the address translation too). On the 2-core VM the
    100 MB allreduce of 16 384 ranks took 216 s with them and 349 s without; the events and
    their order do not change (docs/sim.md).
    """
    if args.no_huge_pages or args.scenario is not None:
        return None
    if not args.campaign and (sum(args.hosts) if args.hosts else args.ranks) < 4096:
        return None
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return None  # asked for already, or said otherwise
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return None
    except OSError:
        return None
    return dict(os.environ, GLIBC_TUNABLES=":".join(t for t in (tunables, HUGE_PAGES) if t))


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)

    if args.scenario is not None:
        return run_scenario(args.scenario, args.slow_store)
    if args.campaign:
        return run_campaign(args.campaign, args.seed, args.max_ranks, args.verbose,
                            args.slow_store)
    ranks = sum(args.hosts) if args.hosts else args.ranks
    if ranks < 1:
        p.error("give at least one rank")
    payload = args.payload == "on" or (
        args.payload == "auto" and payload_bytes(args.collective, ranks, args.bytes)
        <= args.payload_limit)
    kill_ranks, kill_fraction = args.kill if args.kill else ([], 0.5)
    if any(r >= ranks for r in kill_ranks):
        p.error(f"--kill {describe_ranks(kill_ranks)}: there are {ranks} ranks")
    if len(kill_ranks) >= ranks:
        p.error(f"--kill {describe_ranks(kill_ranks)}: no rank would survive")
    side, side_fraction = args.partition if args.partition else ([], 0.5)
    if any(r >= ranks for r in side):
        p.error(f"--partition {describe_ranks(side)}: there are {ranks} ranks")
    if side and len(side) >= ranks:
        p.error(f"--partition {describe_ranks(side)}: the other side would be empty")
    if args.shrink and not (kill_ranks or side or args.stall):
        p.error("--shrink needs a fault (--kill, --partition or --stall): its survivors shrink")
    faults = {}
    if side:
        faults.update(partition_ranks=side, partition_fraction=side_fraction)
    if args.stall:
        faults.update(stall_rank=args.stall[0], stall_fraction=args.stall[1],
                      stall_ms=args.stall[2])
    if args.slow:
        faults.update(slow_rank=args.slow[0], slow_factor=args.slow[1])
    if args.slow_link:
        faults.update(slow_host=args.slow_link[0], slow_host_factor=args.slow_link[1])
    if args.status_at is not None:
        faults.update(status_at_us=args.status_at)
    if args.payload == "auto":
        faults.update(payload_limit=args.payload_limit)  # the shrink's collectives, one by one
    progress = (lambda line: print(line, file=sys.stderr, flush=True)) if args.progress else None
    try:
        r = _C.simulate(dict(
            host_sizes=args.hosts, ranks=args.ranks, ranks_per_host=args.ranks_per_host,
            hosts_per_rack=args.hosts_per_rack, links=args.links, reduce_bw=args.reduce_bw,
            copy_bw=args.copy_bw, store_us=args.store_us, store_set_us=args.store_set_us,
            store_key_us=args.store_key_us, payload=payload, timeout_ms=args.timeout_ms,
            collective=args.collective, bytes=args.bytes, seed=args.seed, kill_ranks=kill_ranks,
            kill_fraction=kill_fraction, shrink=args.shrink, algo=args.algo, colors=args.colors, rings=args.rings,
            waves=args.waves, progress=progress, **faults))
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
    failed = False
    if kill_ranks:
        killed = describe_ranks(kill_ranks)
        if args.verbose:
            print(f"killed at {r['killed_at_us']:.1f} us; {r['completed']} survivors had finished "
                  f"(counted by their next call); e.g. {r['first_error']}")
            if r["unnamed_error"]:
                print(f"not knowing every rank of {killed}: {r['unnamed_error']}")
        print(f"KILL ranks={killed} named={r['named']} of {r['survivors']} "
              f"by_us={r['named_by_us']:.1f} failure_messages={r['failure_messages']}")
    if side:
        print(f"PARTITION ranks={describe_ranks(side)} named={r['named']} of {r['survivors']} "
              f"by_us={r['named_by_us']:.1f} failure_messages={r['failure_messages']}")
    if args.stall:
        how = "for good" if args.stall[2] < 0 else f"for {args.stall[2]:.0f} ms"
        print(f"STALL rank={args.stall[0]} {how.replace(' ', '_')} named={r['named']} of "
              f"{r['survivors']} by_us={r['named_by_us']:.1f}")
    if args.shrink:
        if args.verbose:
            print(f"shrink: {r['shrink_attempts']} attempt(s)")
        if r["shrink_error"]:
            print(f"shrink: {r['shrink_error']}")
        print(f"SHRINK groups={r['shrink_groups']} members={r['shrink_members']} "
              f"took_us={r['shrink_us']:.1f} messages={r['shrink_messages']} "
              f"ops_ok={r['shrink_ops_ok']} of {r['shrink_ops']} checked={r['shrink_ops_checked']}")
        failed = r["shrink_groups"] != 1 or r["shrink_ops_ok"] != r["shrink_ops"]
    if args.status_at is not None:
        if r["status"]:
            print_status(r)
        else:
            print(f"STATUS: the op ended before {args.status_at:.1f} us")
    algo = r["algo"].replace(" ", ":")
    print(f"SIM ranks={r['ranks']} algo={algo} bytes={r['bytes']} sim_us={r['sim_us']:.1f} "
          f"model_us={r['model_us']:.1f} store_requests={r['store_requests']} "
          f"max_endpoints={r['max_endpoints']} messages={r['messages']} "
          f"op_messages={r['op_messages']} creation_us={r['creation_us']:.1f} "
          f"wall_s={r['wall_s']:.2f}")
    return 1 if (r["checked"] and r["mismatch"]) or failed else 0


def replay_command(seed, slow_store=False):
    return f"python -m torch_ddl.sim --scenario {seed:016x}" + (" --slow-store" * slow_store)


def describe_result(r, slow_store=False):
    return (f"scenario {r['seed']:016x}: {r['why'] or 'every invariant holds'}\n"
            f"  {r['description']}\n  replay: {replay_command(r['seed'], slow_store)}")


def run_scenario(text, slow_store=False):
    try:
        seed = int(text, 16)
    except ValueError:
        print(f"torch_ddl.sim: --scenario {text}: give the scenario's seed in hex", file=sys.stderr)
        return 2
    r = _C.scenario(seed, slow_store)
    print(describe_result(r, slow_store))
    news = f" news_us={r['news_us']:.1f}" if r["news_us"] else ""
    print(f"SCENARIO seed={seed:016x} ranks={r['ranks']} failed={int(r['failed'])} "
          f"groups={r['groups']} members={r['shrink_ranks']}{news} "
          f"failure_messages={r['failure_messages']} max_endpoints={r['max_endpoints']} "
          f"digest={r['digest']:016x}")
    return 1 if r["failed"] else 0


def run_campaign(count, seed, max_ranks, verbose, slow_store=False):
    def progress(i, r):
        if verbose or r["failed"]:
            print(f"{i}: {describe_result(r, slow_store)}" if r["failed"] else
                  f"{i}: scenario {r['seed']:016x} ok ({r['ranks']} ranks)", flush=True)
    report = _C.campaign(seed, count, max_ranks, progress, slow_store)
    print(f"{'fault':<14} {'scenarios':>9} {'failed':>6}")
    for kind, scenarios, failed in report["kinds"]:
        print(f"{kind:<14} {scenarios:>9} {failed:>6}")
    print(f"quick path: {report['quick_ops']} allreduces on the caller's thread, "
          f"{report['handed_ops']} handed to an op")
    print(f"TRACE digest={report['digest']:016x}")
    print(f"CAMPAIGN scenarios={report['scenarios']} hangs={report['hangs']} "
          f"wrong={report['wrong']} unnamed={report['unnamed']} split={report['split']} "
          f"slow_news={report['slow_news']} over_budget={report['over_budget']} "
          f"stale_used={report['stale_used']} early_signal={report['early_signal']} "
          f"wall_s={report['wall_s']:.1f}")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    environment = huge_pages_environment(parser().parse_args())
    if environment is not None:
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "torch_ddl.sim", *sys.argv[1:]],
                  environment)
    sys.exit(main())
