"""One rank of the across-hosts fault tests (test_cluster.py): a loop of 4 MiB collectives in
which rank --victim dies (kill -9), exits, or loses its host's link (its eth0 goes down while it
lives on), after --before calls and a pause of --pause-us. Every survivor must raise within --bound seconds of that moment, naming the victim,
and fail a later call at once. The victim writes the moment into --stamp. With --shrink the
survivors then shrink the group and check 20 collectives of it against gloo.

    python cluster_fault_worker.py --victim 2 --how kill --op all_reduce --stamp FILE

env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the cluster launcher). Prints
"NOTICED <seconds> <message>" on each survivor and exits 0 when every check held.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddl_testing import fault_call, shrunk_collectives  # noqa: E402

import torch_ddl  # noqa: E402,F401


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--victim", type=int, required=True)
    parser.add_argument("--how", choices=["kill", "exit", "link"], required=True)
    parser.add_argument("--op", default="all_reduce")
    parser.add_argument("--stamp", required=True)
    parser.add_argument("--bound", type=float, default=3.0)
    parser.add_argument("--before", type=int, default=3, help="calls before the victim goes")
    parser.add_argument("--pause-us", type=int, default=0, help="then a pause, in microseconds")
    parser.add_argument("--shrink", action="store_true",
                        help="then shrink the group and check 20 collectives against gloo")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("ddl", timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    call = fault_call(args.op, size)
    if rank == args.victim:
        for _ in range(args.before):
            call()
        time.sleep(args.pause_us / 1e6)  # the others are somewhere inside their next op
        if args.how == "link":
            subprocess.run(["ip", "link", "set", "eth0", "down"], check=True, timeout=10)
        with open(args.stamp, "w") as f:
            f.write(repr(time.time()))
        if args.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.how == "link":
            time.sleep(2 * args.bound + 5)  # alive, but cut off
        os._exit(0)
    try:  # the victim's third call may be the one a survivor is still in when it goes
        for _ in range(100000):
            call()
        raise SystemExit("the survivors never noticed")
    except RuntimeError as error:
        failed = time.time()
        message = str(error)
    deadline = time.time() + 10
    while not os.path.exists(args.stamp) and time.time() < deadline:
        time.sleep(0.01)
    took = failed - float(open(args.stamp).read())
    print(f"NOTICED {took:.3f} {message.splitlines()[0][:300]}", flush=True)
    assert f"rank {args.victim}" in message, message
    assert took < args.bound, f"noticed after {took:.2f} s: {message}"
    start = time.time()
    try:
        call()
        raise SystemExit("a later call succeeded")
    except RuntimeError as error:
        assert f"rank {args.victim}" in str(error), str(error)
    assert time.time() - start < 0.5
    if args.shrink:
        start = time.monotonic()
        dist.shrink_group([args.victim], shrink_flags=args.before % 2)
        took = time.monotonic() - start
        print(f"SHRUNK {took:.3f}", flush=True)
        assert took < 1.0, f"shrink_group took {took:.2f} s"
        new_rank = dist.get_rank()
        assert new_rank == rank - (rank > args.victim) and dist.get_world_size() == size - 1
        shrunk_collectives(size - 1, new_rank, dist.new_group(backend="gloo"))
        dist.destroy_process_group()
        os._exit(0)
    # Stay until every survivor has noticed: a survivor that exits first is a dead peer too, and
    # one still waiting would rightly name it instead.
    open(f"{args.stamp}.{rank}", "w").close()
    deadline = time.time() + 30
    while time.time() < deadline and not all(
            os.path.exists(f"{args.stamp}.{r}") for r in range(size) if r != args.victim):
        time.sleep(0.01)
    os._exit(0)  # no destroy: the group has a dead member


if __name__ == "__main__":
    main()
