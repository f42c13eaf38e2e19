"""The flight recorder: dumps written when an op fails and on demand, in the layout of torch's
flight recorder, and `python -m torch_ddl.info --trace` naming the first op where ranks diverge."""

import os
import pickle
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torch_ddl
from ddl_testing import run_ranks


def _diverge(rank, size, directory, case):
    group = dist.new_group(backend="ddl", timeout=timedelta(seconds=2))
    for _ in range(3):
        dist.all_reduce(torch.ones(10), group=group)
    if case == "mismatch":
        with pytest.raises(RuntimeError, match="calls differ"):
            if rank == size - 1:
                dist.broadcast(torch.ones(10), src=0, group=group)
            else:
                dist.all_reduce(torch.ones(10), group=group)
    elif rank != size - 1:  # the last rank never calls the fourth allreduce
        with pytest.raises(RuntimeError, match="Timed out"):
            dist.all_reduce(torch.ones(10), group=group)
    else:
        time.sleep(3)
    # Dumps were written on failure; write every rank's now, on demand, into `directory`.
    written = torch_ddl.dump_trace(os.path.join(directory, f"trace_{rank}"))
    assert written.endswith(f"trace_{rank}")
    dist.barrier()


def _check_dumps(directory, size):
    from torch.distributed.flight_recorder.components.loader import read_dump
    for rank in range(size):
        path = os.path.join(directory, f"trace_{rank}")
        loaded = read_dump("trace_", path)  # torch's own loader takes it
        assert loaded["rank"] == rank and loaded["entries"], loaded
        with open(path, "rb") as f:
            dump = pickle.load(f)
        names = [e["profiling_name"] for e in dump["entries"]]
        assert "ddl:all_reduce" in names, names
        last = dump["entries"][-1]
        assert last["ddl_call"] and "state" in last and last["time_created_ns"] > 0, last


def _info_trace(directory):
    out = subprocess.run([sys.executable, "-m", "torch_ddl.info", "--trace", directory],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_trace_names_the_call_that_differs(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_DDL_TRACE_FILE", str(tmp_path / "auto_"))
    run_ranks(_diverge, 3, str(tmp_path), "mismatch")
    assert (tmp_path / "auto_0").exists() and (tmp_path / "auto_2").exists()
    (tmp_path / "auto").mkdir()
    for f in tmp_path.glob("auto_*"):
        f.rename(tmp_path / "auto" / f.name)
    _check_dumps(tmp_path, 3)
    report = _info_trace(str(tmp_path / "trace_*"))
    assert "op #3: the ranks called different things" in report, report
    assert "rank 2: broadcast(10 x float32 from rank 0)" in report, report
    assert "rank 0: all_reduce(SUM, 10 x float32)" in report, report
    # torch's own analyser reads the same dumps and names the rank that diverged.
    out = subprocess.run([sys.executable, "-m", "torch_ddl.info", "--fr-trace",
                          str(tmp_path / "trace_*")], capture_output=True, text=True, timeout=120)
    said = out.stdout + out.stderr  # the analyser logs to standard error
    assert out.returncode == 0, said[-3000:]
    assert "Collective sequence number: 3 has errors" in said, said[-3000:]
    assert "Culprit rank 2; Error type: COLLECTIVE_TYPE_MISMATCH" in said, said[-3000:]


def test_trace_names_the_rank_that_never_called(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_DDL_TRACE_FILE", str(tmp_path / "auto_"))
    run_ranks(_diverge, 3, str(tmp_path), "missing")
    report = _info_trace(str(tmp_path / "trace_*"))
    assert "op #3 (all_reduce(SUM, 10 x float32)): rank(s) 2 never called it" in report, report
    assert "rank 2's last op on this group: #2" in report, report
