"""One rank of the across-hosts partition tests (test_cluster.py): a loop of collectives in which
the hosts of the ranks --cut go dark (their eth0 goes down while their processes live on: a
whole host lost, or the link between two hosts cut), after --before calls. UCX's TCP timers are
left at their defaults, so the survivors learn it from ddl's heartbeats.

Every rank must raise within --bound seconds of the cut. On the side that holds a quorum (more
than half the ranks, or half with rank 0), the error names a rank of the other side; those ranks
shrink the group without the other side and check 20 collectives of it against gloo. On the
other side each rank's shrink_group is refused, the error saying it holds no quorum.

    python cluster_cut_worker.py --cut 2,3 --stamp FILE

env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the cluster launcher); the
store lives in rank 0's process, which must be on the quorum side. Prints "NOTICED <seconds>
<message>" on every rank, then "SHRUNK <seconds>" or "REFUSED <message>", and exits 0 when every
check held.
"""

import argparse
import os
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
    parser.add_argument("--cut", required=True, help="ranks whose hosts go dark, e.g. 2,3")
    parser.add_argument("--op", default="all_reduce")
    parser.add_argument("--stamp", required=True)
    parser.add_argument("--bound", type=float, default=3.0)
    parser.add_argument("--before", type=int, default=3, help="calls before the cut")
    args = parser.parse_args()
    cut = sorted(int(r) for r in args.cut.split(","))
    torch.set_num_threads(1)
    dist.init_process_group("ddl", timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    others = [r for r in range(size) if r not in cut]
    inside = rank in cut
    call = fault_call(args.op, size)
    try:  # a rank may still be in its calls before the cut when it comes
        for i in range(100000):
            if i == args.before and rank == cut[0]:
                # The cut ranks are one host's: the lowest takes its link down.
                subprocess.run(["ip", "link", "set", "eth0", "down"], check=True, timeout=10)
                with open(args.stamp, "w") as f:
                    f.write(repr(time.time()))
            call()
        raise SystemExit("the cut was never noticed")
    except RuntimeError as error:
        failed = time.time()
        message = str(error)
    deadline = time.time() + 10
    while not os.path.exists(args.stamp) and time.time() < deadline:
        time.sleep(0.01)
    took = failed - float(open(args.stamp).read())
    print(f"NOTICED {took:.3f} {message.splitlines()[0][:300]}", flush=True)
    assert took < args.bound, f"noticed after {took:.2f} s: {message}"
    across = others if inside else cut
    assert any(f"rank {r}" in message for r in across), message
    if inside:
        try:
            dist.shrink_group(others)
            raise SystemExit("the side without a quorum shrank")
        except (RuntimeError, ValueError) as error:
            print(f"REFUSED {str(error).splitlines()[0][:300]}", flush=True)
            assert "quorum" in str(error), str(error)
        os._exit(0)  # no destroy: the group has lost half its members
    start = time.monotonic()
    dist.shrink_group(cut)
    took = time.monotonic() - start
    print(f"SHRUNK {took:.3f}", flush=True)
    assert took < 2.0, f"shrink_group took {took:.2f} s"
    new_rank = dist.get_rank()
    assert new_rank == others.index(rank) and dist.get_world_size() == len(others)
    shrunk_collectives(len(others), new_rank, dist.new_group(backend="gloo"))
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
