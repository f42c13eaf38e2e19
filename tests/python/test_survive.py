"""examples/train_digits.py --survive as a job of 3 nodes (one torchrun each, one process per
node, static rendezvous): the process of node 2 is killed in epoch 3, the other two shrink the
group, go back to the start of the epoch and finish; the test accuracy ends within 1 point of
the same job without a kill."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from ddl_testing import free_port

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _job(tmp_path, name, extra):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    logs = [tmp_path / f"{name}_{i}.log" for i in range(3)]
    nodes = []
    try:
        for i in range(3):
            nodes.append(subprocess.Popen(
                [str(TORCHRUN), "--nnodes", "3", "--nproc_per_node", "1", "--node_rank", str(i),
                 "--master_addr", "127.0.0.1", "--master_port", str(port),
                 str(ROOT / "examples" / "train_digits.py"), "--survive", *extra],
                stdout=open(logs[i], "w"), stderr=subprocess.STDOUT, env=env,
                start_new_session=True))
        # Rank 0 prints the last epoch once every rank left did its part; torchrun's agents may
        # then wait for the lost node's agent at their exit barrier (300 s): not waited for.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if "epoch 8/8" in logs[0].read_text() or nodes[0].poll() is not None:
                break
            time.sleep(0.5)
        text = logs[0].read_text()
    finally:
        for node in nodes:
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait()
    accuracy = re.findall(r"epoch 8/8 .*test accuracy ([\d.]+)", text)
    assert accuracy, f"{name}: no last epoch:\n{text[-3000:]}"
    return float(accuracy[0]), text


def test_training_goes_on_without_a_killed_node(tmp_path):
    base, _ = _job(tmp_path, "plain", [])
    survived, text = _job(tmp_path, "killed", ["--kill-in-epoch", "3"])
    assert "rank(s) 2 gone in epoch 3: 2 processes go on" in text, text[-3000:]
    print(f"test accuracy {survived:.3f} with the kill, {base:.3f} without")
    assert abs(survived - base) <= 0.01, f"accuracy {survived:.3f} with the kill, {base:.3f} without"
