"""The service time of torch's TCPStore per request, the figure the simulator's store model takes
(`python -m torch_ddl.sim --store-us`, default 20; docs/sim.md).

The server runs in this process, alone on its thread pool; client processes send requests as
fast as they can, and the server's CPU time per request is the service time (a single server
answers one request at a time: this is what bounds creation at scale, not the round trip).

    python benchmarks/store_service.py [--clients 2] [--requests 20000]
"""

import argparse
import multiprocessing as mp
import os
import resource
import time
from datetime import timedelta


def client(port, kind, requests, keys, start):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    names = [f"k{i}" for i in range(keys)]
    start.wait()
    for _ in range(requests):
        if kind == "get":
            store.get("k0")
        elif kind == "set":
            store.set("k0", b"x" * 64)
        else:
            store.multi_get(names)


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--requests", type=int, default=20000, help="per client")
    args = p.parse_args()
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))
    for i in range(128):
        server.set(f"k{i}", b"y" * 64)
    ctx = mp.get_context("spawn")
    print(f"TCPStore server (libuv: {getattr(server, 'libuvBackend', '?')}), "
          f"{args.clients} clients, {os.cpu_count()} cores")
    for kind, keys in (("get", 1), ("set", 1), ("multi_get", 16), ("multi_get", 128)):
        start = ctx.Event()
        procs = [ctx.Process(target=client, args=(server.port, kind, args.requests, keys, start))
                 for _ in range(args.clients)]
        for q in procs:
            q.start()
        time.sleep(3)  # the clients connected and waiting
        before, t0 = cpu_seconds(), time.perf_counter()
        start.set()
        for q in procs:
            q.join(timeout=300)
            if q.exitcode != 0:
                raise SystemExit(f"a client failed ({q.exitcode})")
        wall = time.perf_counter() - t0
        n = args.requests * args.clients
        per = (cpu_seconds() - before) / n * 1e6
        name = kind if keys == 1 else f"{kind} of {keys} keys"
        print(f"{name:>22}: server {per:5.1f} us of CPU a request, "
              f"{n / wall:8.0f} requests/s in all")


if __name__ == "__main__":
    main()
