"""What a running ddl job is doing, asked from outside it.

    python -m torch_ddl.status                  # in a shell with the job's MASTER_ADDR, MASTER_PORT
    python -m torch_ddl.status --store HOST:PORT [--json] [--watch [SECONDS]]

Each process of the job answers on a TCP port of its own (TORCH_DDL_STATUS=1, the default) and
publishes that port's address in the job's store. This asks every process at once, within a
second (--timeout), and prints a verdict on one line, then one line per rank: the op it runs in
each group (its sequence number, bytes, how long it has run), the ranks it still awaits and how
long ago their heartbeats came, its last completed op. A process that does not answer is named:
"stopped" where its port takes the connection but nothing answers (SIGSTOP, a debugger), "dead"
where nothing listens any more. Nothing a
query sends can change the job: the port answers the one request "status", and refuses anything
else. docs/status.md explains every field.

The side that answers, and the metrics, are in _status.py.
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import socket
import sys
import time

from ._status import KEY, REQUEST

def _connect_store(spec, timeout):
    import torch.distributed as dist

    host, _, port = spec.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"torch_ddl.status: --store {spec!r} is not HOST:PORT")
    try:
        return dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=timeout))
    except Exception as e:  # noqa: BLE001 (torch raises several kinds)
        raise SystemExit(f"torch_ddl.status: cannot reach the job's store at {spec}: {e}")


def _records(store):
    if not store.check([KEY + "world_size"]):
        raise SystemExit("torch_ddl.status: no ddl process has published a status port in this "
                         "store (is it the job's store, and the job past init_process_group with "
                         "TORCH_DDL_STATUS=1?)")
    world = int(store.get(KEY + "world_size"))
    records = {}
    for rank in range(world):
        key = KEY + str(rank)
        records[rank] = json.loads(store.get(key)) if store.check([key]) else None
    return world, records


def ask(address, timeout):
    """One process's answer: ("ok", state), or ("stopped" | "dead" | "unreachable", why)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout)
    except ConnectionRefusedError:
        return "dead", "nothing listens at its status port (the process has exited)"
    except (socket.timeout, TimeoutError):
        return "unreachable", (f"no connection within {timeout:g} s (its host is down, or cut "
                               f"off from here)")
    except OSError as e:
        return "unreachable", f"its status port cannot be reached ({e.strerror or e})"
    with conn:
        try:
            conn.sendall(REQUEST)
            data = b""
            while not data.endswith(b"\n"):
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
        except (socket.timeout, TimeoutError):
            return "stopped", f"no answer within {timeout:g} s"
        except OSError as e:
            return "dead", f"its status port closed ({e.strerror or e})"
    try:
        answer = json.loads(data)
    except ValueError:
        return "dead", "its answer was cut off (the process ended while answering)"
    return ("ok", answer) if "error" not in answer else ("dead", answer["error"])


def gather(store, timeout=1.0):
    """{rank: (state, answer or why, record)} for every rank of the job."""
    world, records = _records(store)
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(64, max(1, world))) as pool:
        futures = {rank: pool.submit(ask, rec["address"], timeout)
                   for rank, rec in records.items() if rec is not None}
        for rank in range(world):
            if records[rank] is None:
                results[rank] = ("unknown", "it has not published a status port", None)
            else:
                state, answer = futures[rank].result()
                results[rank] = (state, answer, records[rank])
    return results


def _seconds(s):
    return f"{s:.1f} s" if s is not None else "?"


def _end_of_wait(by, awaited, not_ok):
    """The rank at the end of the waits of one op, and how many of its ranks wait on it, directly
    or through others. `by`: {rank: its op}; `awaited`: {rank: the ranks that await it}. An end
    is an awaited rank that did not answer, is not in the op, or is in it awaiting no one; the
    one the most ranks reach, those that did not answer first. Waits that only go round (every
    rank in the op awaits another) end at the rank awaited by the most."""

    def reached(end):
        seen, queue = {end}, [end]
        for r in queue:
            for w in awaited.get(r, []):
                if w not in seen:
                    seen.add(w)
                    queue.append(w)
        return len(seen) - 1

    ends = [r for r in awaited if r not in by or not by[r]["awaits"] or r in not_ok]
    if not ends:
        target = max(awaited, key=lambda r: (len(awaited[r]), -r))
        return target, len(awaited[target])
    scored = [((r in not_ok), reached(r), -r) for r in ends]
    best = max(scored)
    return -best[2], best[1]


def _failed_last(ranks):
    """Words for groups whose last op failed (a failure is not a hang: the ops raised), or ""."""
    by_group = {}
    for rank, row in ranks.items():
        for g in row["groups"]:
            if g.get("last_failed", -1) > g["last_completed"]:
                by_group.setdefault((g["name"], g["last_failed"]), []).append((rank, g))
    if not by_group:
        return ""
    (group, sequence), failed = max(by_group.items(), key=lambda kv: len(kv[1]))
    names = ",".join(str(r) for r, _ in failed)
    plural = "s" if len(failed) > 1 else ""
    return (f"no op waits; op #{sequence} of {group} failed on rank{plural} {names}: "
            f"{failed[0][1]['last_error']}")


def diagnose(results, slow_s=1.0):
    """The verdict on one line, and per rank its words: (verdict, {rank: {...}})."""
    ranks = {}
    ops = {}  # (group name, sequence, op) -> {rank: op entry}
    for rank, (state, answer, record) in results.items():
        row = {"rank": rank, "state": state, "host": record["host"] if record else "?",
               "ops": [], "groups": []}
        if state == "ok":
            row["ops"] = answer.get("ops", [])
            row["groups"] = answer["stats"]["groups"]
            if "ops" not in answer:
                row["note"] = answer["in_flight"]
            for op in row["ops"]:
                ops.setdefault((op["group_name"], op["sequence"], op["op"]), {})[rank] = op
        else:
            row["why"] = answer
        ranks[rank] = row

    def last_of(rank, group):
        for g in ranks[rank]["groups"]:
            if g["name"] == group:
                return g
        return None

    # The op to look into: one that awaits a rank that did not answer, else the one the most
    # ranks are in, then the one waited on longest, once it has run slow_s.
    not_ok = [r for r, row in ranks.items() if row["state"] != "ok"]
    stuck = [(any(p in not_ok for o in by.values() for p in o["awaits"]),
              max(o["running_s"] or 0 for o in by.values()), key, by) for key, by in ops.items()]
    stuck.sort(key=lambda t: (not t[0], t[1] < slow_s, -len(t[3]), -t[1]))
    if not stuck or not (stuck[0][0] or stuck[0][1] >= slow_s):
        failed = _failed_last(ranks)
        if failed:
            return failed, ranks
        if not_ok:
            names = ", ".join(f"rank {r} ({ranks[r]['state']}: {ranks[r]['why']})" for r in not_ok)
            return f"no op waits; but {names}", ranks
        return f"healthy: all {len(ranks)} ranks answered, no op has run {slow_s:g} s", ranks
    _, running, (group, sequence, name), by = stuck[0]
    awaited = {}
    for rank, op in by.items():
        for peer in op["awaits"]:
            awaited.setdefault(peer, []).append(rank)
        ranks[rank]["state"] = "waiting" if op["awaits"] else "slow"
    head = f"{name} #{sequence} of {group}"
    if not awaited:
        slowest = max(by, key=lambda r: by[r]["running_s"] or 0)
        return (f"{head}: rank {slowest} runs it for {_seconds(running)} awaiting no peer "
                f"(slow: a long reduction, or a stalled device)"), ranks
    target, behind = _end_of_wait(by, awaited, not_ok)
    waiters = awaited[target]
    beats = [by[w]["heartbeats_s"].get(str(target)) for w in waiters]
    beats = [b for b in beats if b is not None]
    gone = [by[w]["gone"][str(target)] for w in waiters if str(target) in by[w]["gone"]]
    row = ranks.get(target)
    words = [f"host {row['host']}" if row else "not in the job's records"]
    if row is None:
        cause = "unknown"
    elif row["state"] in ("stopped", "dead", "unknown", "unreachable"):
        cause = row["state"]
        words.append(row["why"])
    elif any(k[0] == group and k[1] == sequence and target in v for k, v in ops.items()):
        own = next(v[target] for k, v in ops.items()
                   if k[0] == group and k[1] == sequence and target in v)
        mutual = [p for p in own["awaits"] if p in by and target in by[p]["awaits"]]
        if mutual:
            # Each has messages outstanding with the other: data between them is under way.
            cause = "slow link"
            words.append(f"it and rank {mutual[0]} await each other ({own['waits']}): the data "
                         f"between them is under way")
        elif own["awaits"]:
            cause = "in the op too"
            words.append(f"it awaits rank{'s' if len(own['awaits']) > 1 else ''} "
                         f"{', '.join(map(str, own['awaits']))}: {own['waits']}")
        else:
            cause = "slow"
            words.append(f"in the op for {_seconds(own['running_s'])}, awaiting no peer (a slow "
                         f"link or a long reduction)")
    else:
        elsewhere = [o for o in row["ops"]]
        if elsewhere:
            cause = "in another op"
            words.append("it runs " + "; ".join(f"{o['op']} #{o['sequence']} of {o['group_name']}"
                                                for o in elsewhere))
        else:
            cause = "not in the op"
            words.append("it runs no ddl op: it has not called this one")
    if row is not None and cause not in ("stopped", "dead", "unknown", "unreachable"):
        row["state"] = cause
    if beats:
        words.append(f"no heartbeat for {_seconds(max(beats))}" if max(beats) > 1.0
                     else f"heartbeat {_seconds(max(beats))} ago")
    if gone:
        words.append(f"counted gone: {gone[0]}")
    last = last_of(target, group) if row else None
    if last is not None and last["last_completed"] >= 0:
        words.append(f"its last op #{last['last_completed']}")
    plural = "s" if behind > 1 else ""
    verdict = (f"{head}: {behind} rank{plural} wait{'' if plural else 's'} on rank {target} "
               f"({cause}; {'; '.join(words)})")
    return verdict, ranks


def table(ranks):
    lines = []
    for rank in sorted(ranks):
        row = ranks[rank]
        text = f"rank {rank:>5} {row['host']:<16} {row['state']:<14}"
        if row.get("why"):
            text += f" {row['why']}"
        for op in row["ops"]:
            text += (f" {op['op']} #{op['sequence']} of {op['group_name']} ({op['bytes']} B, "
                     f"{_seconds(op['running_s'])})")
            if op["awaits"]:
                text += f" awaits {','.join(map(str, op['awaits']))}"
        for g in row["groups"]:
            if g["last_completed"] >= 0:
                text += f" | {g['name']}: last #{g['last_completed']}"
        lines.append(text)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_ddl.status", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", help="the job's store, HOST:PORT (default: MASTER_ADDR and "
                        "MASTER_PORT from the environment, as torchrun sets them)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--watch", nargs="?", type=float, const=1.0, metavar="SECONDS",
                        help="ask again every SECONDS (default 1) until interrupted")
    parser.add_argument("--timeout", type=float, default=1.0,
                        help="seconds a process has to answer (default 1)")
    parser.add_argument("--slow", type=float, default=1.0,
                        help="an op running this many seconds is looked into (default 1)")
    args = parser.parse_args(argv)
    spec = args.store
    if spec is None:
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port:
            parser.error("no --store, and MASTER_ADDR/MASTER_PORT are not set")
        spec = f"{addr}:{port}"
    store = _connect_store(spec, max(args.timeout, 2.0))
    while True:
        results = gather(store, args.timeout)
        verdict, ranks = diagnose(results, args.slow)
        if args.json:
            print(json.dumps({"verdict": verdict, "ranks": [ranks[r] for r in sorted(ranks)]}),
                  flush=True)
        else:
            if args.watch:
                print("\033[2J\033[H", end="")
            print(verdict)
            print(table(ranks), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)


if __name__ == "__main__":
    sys.exit(main())
