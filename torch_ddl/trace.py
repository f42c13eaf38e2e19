"""The flight recorder's dumps: reading them, and naming the first operation where ranks diverge.

Each process keeps its last TORCH_DDL_TRACE_ENTRIES operations (all its ddl groups) and writes
them when an op fails, to TORCH_DDL_TRACE_FILE + rank (default /tmp/torch_ddl_trace_rank_<rank>),
or when asked (torch_ddl.dump_trace). A dump is a pickle laid out like torch's flight recorder's
(version, pg_config, entries with process_group, collective_seq_id, profiling_name, input_sizes,
state, time_created_ns, ...), plus ddl's own fields: ddl_call (the call as the call check saw
it), ddl_failed, ddl_error and ddl_awaited (the peers a failed op still waited for).

    python -m torch_ddl.info --trace /tmp/torch_ddl_trace_rank_*
"""

import glob
import os
import pickle
import re


def read(path):
    with open(path, "rb") as f:
        dump = pickle.load(f)
    if not isinstance(dump, dict) or "entries" not in dump:
        raise ValueError(f"{path} is not a flight recorder dump")
    return dump


def expand(paths):
    """Dump files named by `paths`: files, directories (every file in them) or globs."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(f for f in glob.glob(os.path.join(p, "*")) if os.path.isfile(f))
        elif any(c in p for c in "*?["):
            files += sorted(glob.glob(p))
        else:
            files.append(p)
    return files


def _rank_of(path, dump):
    match = re.search(r"(\d+)$", os.path.basename(path))
    return int(match.group(1)) if match else dump.get("rank", 0)


def _state(entry):
    if entry.get("ddl_failed"):
        return "failed"
    return entry["state"]


def analyze(dumps):
    """dumps: {rank: dump}. Returns lines naming, per group, the first op where the ranks differ
    (what they called, whether they called it, how it ended), or that they agree."""
    lines = []
    groups = {}
    for rank, dump in dumps.items():
        for e in dump["entries"]:
            if e.get("is_p2p"):
                continue
            key = e["process_group"][1] or e["process_group"][0]
            groups.setdefault(key, {}).setdefault(rank, {})[e["collective_seq_id"]] = e
    if not groups:
        return ["no collective operations recorded"]
    for name in sorted(groups):
        per_rank = groups[name]
        ranks = sorted(dumps)
        seen = {r: per_rank.get(r, {}) for r in ranks}
        first = max(min(s) if s else 0 for s in seen.values())  # every rank still holds these
        last = max(max(s) for s in seen.values() if s)
        found = None
        for seq in range(first, last + 1):
            calls = {r: seen[r].get(seq) for r in ranks}
            present = {r: e for r, e in calls.items() if e is not None}
            missing = [r for r, e in calls.items() if e is None]
            described = {r: e.get("ddl_call", e["profiling_name"]) for r, e in present.items()}
            states = {r: _state(e) for r, e in present.items()}
            if len(set(described.values())) > 1:
                found = [f"{name}, op #{seq}: the ranks called different things:"]
                found += [f"  rank {r}: {d} ({states[r]})" for r, d in described.items()]
            elif missing:
                call = next(iter(described.values()))
                found = [f"{name}, op #{seq} ({call}): rank(s) {_ranks(missing)} never called it;"
                         f" rank(s) {_ranks(present)} did"]
                for r in missing:
                    before = [s for s in seen[r] if s < seq]
                    found.append(f"  rank {r}'s last op on this group: "
                                 + (f"#{max(before)}" if before else "none recorded"))
            elif len(set(states.values())) > 1 or "failed" in states.values():
                call = next(iter(described.values()))
                found = [f"{name}, op #{seq} ({call}) ended differently:"]
                for r, e in present.items():
                    why = e.get("ddl_error") or ""
                    waited = e.get("ddl_awaited") or ""
                    found.append(f"  rank {r}: {states[r]}" + (f": {why}" if why else "")
                                 + (f" [still waiting: {waited}]" if waited else ""))
            if found:
                break
        if found:
            lines += found
        else:
            lines.append(f"{name}: the ranks agree on ops #{first} to #{last}")
    return lines


def _ranks(ranks):
    return ", ".join(str(r) for r in sorted(ranks))


def main(paths):
    files = expand(paths)
    if not files:
        print("no dump files found")
        return 1
    dumps = {}
    for f in files:
        dump = read(f)
        dumps[_rank_of(f, dump)] = dump
    print(f"{len(dumps)} dump(s): ranks {_ranks(dumps)}")
    for line in analyze(dumps):
        print(line)
    return 0


# The backend names torch's analyser accepts in an entry's profiling name ("nccl:all_reduce"):
# a fixed list that has no "ddl". ddl numbers collectives per group from 0 in program order, as
# NCCL's flight recorder does, so its entries are handed over under "nccl:".
_ANALYSER_BACKEND = "nccl"


def torch_analyser(paths, extra=()):
    """Runs torch's flight-recorder analyser (torch.distributed.flight_recorder.fr_trace) over
    ddl dumps: copies of them, named as the analyser expects (PREFIX then the rank) in a
    temporary directory, with the profiling names' backend prefix it knows. `extra`: more of
    fr_trace's arguments. Returns its exit status."""
    import pickle
    import tempfile

    from torch.distributed.flight_recorder import fr_trace

    files = expand(paths)
    if not files:
        print("no flight recorder dumps found in " + " ".join(paths))
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            dump = read(path)
            for entry in dump.get("entries", []):
                name = entry.get("profiling_name", "")
                if name.startswith("ddl:"):
                    entry["profiling_name"] = _ANALYSER_BACKEND + name[len("ddl"):]
            rank = _rank_of(path, dump)
            with open(os.path.join(tmp, f"ddl_trace_{rank}"), "wb") as f:
                pickle.dump(dump, f)
        print(f"torch's flight-recorder analyser over {len(files)} ddl dump(s) "
              f"(entries named {_ANALYSER_BACKEND}:<op> for it):", flush=True)
        try:
            fr_trace.main([tmp, "-p", "ddl_trace_", *extra])
        except SystemExit as e:
            return int(e.code or 0)
    return 0
