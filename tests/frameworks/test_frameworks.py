"""Training frameworks over ddl against gloo, in real processes on the CPU, same seed: Lightning's
DDPStrategy (2 processes), DeepSpeed ZeRO stages 1 and 2 (2 processes, torchrun), and the calls
torchtitan makes on a group it is given, with FSDP2 on a 2-D mesh (4 processes, torchrun). Each
ends with the same parameters over ddl as over gloo, to float tolerance. Run by `make
test-frameworks` in an environment with the frameworks installed; a framework that is not
installed is skipped with the reason."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def _have(*names):
    return any(importlib.util.find_spec(n) is not None for n in names)


def _run(args, tmp_path, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, (args, done.stdout[-4000:], done.stderr[-4000:])


def _torchrun(nproc, script, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(HERE / script), *args]


def _same(tmp_path, ours, theirs):
    a, b = torch.load(tmp_path / ours), torch.load(tmp_path / theirs)
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6), (x - y).abs().max()


@pytest.mark.skipif(not _have("lightning", "pytorch_lightning"), reason="Lightning not installed")
def test_lightning_ddp_strategy_matches_gloo(tmp_path):
    for backend in ("ddl", "gloo"):
        _run([sys.executable, str(HERE / "lightning_train.py"), backend,
              str(tmp_path / f"{backend}.pt")], tmp_path)
    _same(tmp_path, "ddl.pt", "gloo.pt")


@pytest.mark.skipif(not _have("deepspeed"), reason="DeepSpeed not installed")
@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_zero_matches_gloo(tmp_path, stage):
    for backend in ("ddl", "gloo"):
        _run(_torchrun(2, "deepspeed_train.py", backend, str(stage),
                       str(tmp_path / f"{backend}.pt")), tmp_path)
    _same(tmp_path, "ddl.pt", "gloo.pt")


def test_torchtitan_calls_and_fsdp2_on_a_2d_mesh_match_gloo(tmp_path):
    for backend in ("ddl", "gloo"):
        _run(_torchrun(4, "titan_calls.py", backend, str(tmp_path / f"{backend}.pt")), tmp_path)
    _same(tmp_path, "ddl.pt", "gloo.pt")
