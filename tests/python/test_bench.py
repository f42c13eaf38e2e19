"""The allreduce benchmark runs end to end, and the reference allreduces it compares against
compute the right sum (each checks its first result and exits non-zero otherwise)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ddl_testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "allreduce_bench.py")
REFERENCE = os.path.join(ROOT, "benchmarks", "reference")


def bench_module():
    sys.path.insert(0, os.path.dirname(BENCH))
    try:
        import allreduce_bench
    finally:
        sys.path.pop(0)
    return allreduce_bench


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    built = {}
    for name in ("shm_ring", "shm_direct"):
        exe = out / name
        subprocess.run([os.environ.get("CXX", "c++"), "-std=c++17", "-O2", "-o", str(exe),
                        os.path.join(REFERENCE, f"{name}.cc")], check=True)
        built[name] = str(exe)
    return built


@pytest.mark.parametrize("name", ["shm_ring", "shm_direct"])
@pytest.mark.parametrize("nbytes", [0, 4, 1000, 3 * (256 << 10) + 8, 4 << 20])
def test_reference_allreduce_is_correct(references, name, nbytes):
    done = subprocess.run([references[name], str(nbytes), "2", "1"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip()) >= 0


@pytest.fixture(scope="module")
def core_bench():
    # ddl's core alone (benchmarks/core_bench.cc), linked from the objects core_tests is built of.
    # UCX is found by the Python that runs the tests: the make target build/bench/core_bench would
    # first make the virtual environment of `make test`, which a machine without network cannot.
    ucx = {flag: subprocess.run([sys.executable, os.path.join(ROOT, "tools", "find_ucx.py"), flag],
                                capture_output=True, text=True, check=True).stdout.strip()
           for flag in ("--include", "--lib")}
    subprocess.run(["make", "-s", f"-j{os.cpu_count() or 1}", "link-core-bench",
                    f"UCX_INC={ucx['--include']}", f"UCX_LIB={ucx['--lib']}"], cwd=ROOT,
                   check=True, timeout=1800)
    return os.path.join(ROOT, "build", "bench", "core_bench")


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("nbytes", [0, 4, 1000, 3 * (256 << 10) + 8, 4 << 20])
def test_core_bench_allreduce_is_correct(core_bench, ranks, nbytes):
    done = subprocess.run([core_bench, str(nbytes), "2", "1", str(ranks)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip()) > 0


def test_core_bench_pins_and_rejects_missing_arguments(core_bench):
    done = subprocess.run([core_bench, "4096", "10", "1", "2", "pin"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and float(done.stdout.strip()) > 0, done.stderr
    done = subprocess.run([core_bench], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr


def test_core_bench_killed_takes_its_ranks_with_it(core_bench):
    def ranks_running(marker):
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if args[:2] == [core_bench.encode(), marker]:
                found.append(int(pid))
        return found

    marker = b"4099"  # a size no other test uses: these processes are this test's
    bench = subprocess.Popen([core_bench, marker.decode(), "100000000", "1", "2"])
    try:
        deadline = time.monotonic() + 30
        while len(ranks_running(marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(ranks_running(marker)) == 3  # the parent and its two ranks
    finally:
        bench.kill()
        bench.wait()
    deadline = time.monotonic() + 10
    while ranks_running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = ranks_running(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


def test_copy_speed_reads_the_other_process(tmp_path):
    exe = tmp_path / "copy_speed"
    subprocess.run([os.environ.get("CXX", "c++"), "-std=c++17", "-O2", "-o", str(exe),
                    os.path.join(REFERENCE, "copy_speed.cc")], check=True)
    done = subprocess.run([str(exe), str(1 << 20), "1"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    speeds = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())
    assert float(speeds["cma GB/s"]) > 0 and float(speeds["memcpy GB/s"]) > 0


def test_reference_rejects_missing_arguments(references):
    done = subprocess.run([references["shm_ring"]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr


def test_bench_prints_every_size_with_references():
    done = subprocess.run(
        [sys.executable, BENCH, "--world-size", "2", "--min-bytes", "1K", "--max-bytes", "64K",
         "--rounds", "1", "--budget", "0.02", "--port", str(free_port()), "--reference"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if "|" in line and "KiB" in line]
    assert [row.split("|")[0].strip() for row in rows] == ["1 KiB", "4 KiB", "16 KiB", "64 KiB"]
    references = 3 if shutil.which("mpicxx") and shutil.which("mpirun") else 2
    peers = len(bench_module().peer_names())  # ddl's core, oneCCL, Intel MPI: where built
    for row in rows:
        cells = row.split("|")
        assert len(cells) == 5 + references + peers, row
        shared = cells[4].split()  # ddl on an empty_shared tensor: us, busbw x gloo, time ratio
        assert len(shared) == 3 and float(shared[0]) > 0 and shared[1].endswith("x"), row
        assert all(cell.strip().endswith("x") for cell in cells[5:5 + references]), row
        for cell in cells[5 + references:]:  # a peer: its us, ddl's time over its
            us, ratio = cell.split()
            assert float(us) > 0 and float(ratio) >= 0, row  # 0.00: the peer took far longer


def test_bench_reference_beyond_two_ranks_needs_mpi_or_the_peers():
    # The two-process references run at 2 ranks only; at more, MPI_Allreduce and the peers
    # (oneCCL, Intel MPI) are the references, and without either the benchmark says so before
    # it starts.
    env = dict(os.environ, PATH="/usr/bin:/bin")  # no MPI there unless Debian's is installed
    if shutil.which("mpicxx", path=env["PATH"]) and shutil.which("mpirun", path=env["PATH"]):
        pytest.skip("Open MPI is installed in /usr/bin")
    if os.path.exists(os.path.join(ROOT, "build", "peers", "bin", "ccl_allreduce")):
        pytest.skip("the peers are built (make peers)")
    done = subprocess.run([sys.executable, BENCH, "--world-size", "3", "--reference"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0 and "mpicxx and mpirun are not on the PATH" in done.stderr


def test_bench_phases_split_ddls_time_per_op():
    done = subprocess.run(
        [sys.executable, BENCH, "--world-size", "2", "--min-bytes", "4K", "--max-bytes", "64K",
         "--rounds", "1", "--budget", "0.05", "--port", str(free_port()), "--no-shared",
         "--phases"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if "|" in line and "KiB" in line]
    assert len(rows) == 3, done.stdout
    for row in rows:
        cells = row.split("|")
        ddl_us = float(cells[2].split()[0])
        start, running, following = (float(v) for v in cells[4].split())
        assert start >= 0 and running > 0 and following >= 0, row
        # The three phases are each op's time: their sum is about the measured time per op.
        assert running < 5 * ddl_us and start + running + following < 5 * ddl_us, row


def test_bench_refuses_cuda_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    done = subprocess.run([sys.executable, BENCH, "--device", "cuda"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device is visible" in done.stderr


def test_a_peers_result_is_its_last_number_whatever_it_prints_after():
    # oneCCL may print a warning after its figure: that killed a sweep before 0de16db.
    bench = bench_module()
    warned = "0.012\n2026:11:28-01:13:29:28688:[1] |CCL_WARN| workers are disabled\n"
    assert bench.last_number(warned) == 0.012
    # Another rank's warning cut by mpirun's forwarding, its figure glued after it (seen at
    # f96921a: "set CCL_WORKER_OFFLOAD=10.129173"): the marked figure is the one taken.
    glued = "|CCL_WARN| workers are disabled, set CCL_WORKER_OFFLOAD=1\nms_per_op 0.129173\n\n"
    assert bench.last_number(glued) == 0.129173
    glued = "|CCL_WARN| set CCL_WORKER_OFFLOAD=1\nms_per_op 0.5\n|CCL_WARN| after 2\n"
    assert bench.last_number(glued) == 0.5
    with pytest.raises(ValueError, match="no number"):
        bench.last_number("|CCL_WARN| only words\n")


def test_the_bars_budget_says_where_no_backend_can_meet_it_through_torch():
    bench = bench_module()
    us = 1e-6
    rows = [
        (8, {"oneccl": 6.0 * us, "impi": 0.8 * us, "shm_ring": 0.4 * us}),  # 1.5 x 0.8 < 5
        (32 << 10, {"oneccl": 19.0 * us, "impi": 6.0 * us}),  # 1.5 x 6 = 9: 4 left
        (64 << 10, {"oneccl": 9.0 * us, "impi": 11.0 * us}),  # from 64 KiB the limit is 1x
        (1 << 20, {"impi": 200.0 * us}),  # oneCCL did not run: no line
    ]
    # torch's call: 5 us with hot caches, 8 us after 64 KiB went through them.
    lines = bench.budget_lines(rows, {0: 5.0 * us, 8: 5.0 * us, 64 << 10: 8.0 * us})
    assert len(lines) == 3, lines
    assert lines[0].split(":")[0].strip() == "8 B" and lines[0].endswith("no backend can")
    assert "limit      1.2 us" in lines[0] and "copying reference: 0.4 us" in lines[0]
    assert "call   5.0 us, left      4.0 us" in lines[1] and "0.67x" in lines[1]
    assert not lines[1].endswith("no backend can")  # 32 KiB: no floor of its own, the hot one
    assert "limit      9.0 us, torch's call   8.0 us, left      1.0 us" in lines[2]
    assert "0.11x" in lines[2]
