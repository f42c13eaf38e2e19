"""python -m torch_ddl.status asks a running job from outside it, and the metrics endpoint: 4 real
ranks on this host in an allreduce loop; one is stopped (SIGSTOP), resumed, killed."""

import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch.distributed as dist

from ddl_testing import free_port, sim_command
from torch_ddl import status

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "status_worker.py")
WORLD = 4
RUN = ("all_reduce", "broadcast")  # the collectives status_worker.py runs


class Job:
    """WORLD workers of status_worker.py; torn down (killed, resumed first) however a test ends."""

    def __init__(self, tmp_path, env=None, port=None):
        self.port = port or free_port()
        self.stop = str(tmp_path / "stop")
        full = dict(os.environ, TORCH_DDL_HEARTBEAT_TIMEOUT_MS="60000", **(env or {}))
        self.procs = []
        for rank in range(WORLD):
            full_rank = dict(full, LOCAL_RANK=str(rank))
            self.procs.append(subprocess.Popen(
                [sys.executable, WORKER, str(rank), str(WORLD), str(self.port), self.stop],
                env=full_rank, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        try:
            self.store = dist.TCPStore("127.0.0.1", self.port, is_master=False,
                                       wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=60))
        except Exception as e:
            self.close()
            raise AssertionError(f"no store at port {self.port}: {e}\n{self.outputs()}") from e
        deadline = time.monotonic() + 60
        keys = [status.KEY + str(r) for r in range(WORLD)]
        while not self.store.check(keys):
            assert time.monotonic() < deadline, "the ranks did not publish their status ports"
            assert all(p.poll() is None for p in self.procs), self.outputs()
            time.sleep(0.1)

    def outputs(self):
        return "\n".join(p.stdout.read() if p.poll() is not None else "(running)"
                         for p in self.procs)

    def finish(self, timeout=60):
        open(self.stop, "w").close()
        outs = []
        for p in self.procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
        return outs

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait(timeout=30)


@pytest.fixture
def job(tmp_path):
    made = []

    def make(env=None, port=None):
        made.append(Job(tmp_path, env, port))
        return made[-1]

    yield make
    for j in made:
        j.close()


def until(store, predicate=lambda verdict: verdict.startswith("healthy"), seconds=15):
    """Asks until the verdict satisfies `predicate` or `seconds` pass; the last answer."""
    deadline = time.monotonic() + seconds
    while True:
        verdict, ranks = status.diagnose(status.gather(store))
        if predicate(verdict) or time.monotonic() > deadline:
            return verdict, ranks
        time.sleep(0.2)


def finish_healthy(j):
    """The job, healthy again, stops, every rank's every result having been right."""
    verdict, _ = until(j.store)
    assert verdict.startswith("healthy"), verdict
    outs = j.finish()
    assert all("ran" in out for out in outs), outs


def test_a_stopped_rank_is_named_with_its_op_then_healthy_after_it_resumes(job):
    j = job()
    verdict, ranks = until(j.store)
    assert verdict.startswith("healthy"), verdict
    assert all(row["state"] == "ok" for row in ranks.values())

    j.procs[2].send_signal(signal.SIGSTOP)
    time.sleep(0.5)  # the others reach an op that needs rank 2
    asked = time.monotonic()
    verdict, ranks = status.diagnose(status.gather(j.store, timeout=1.0))
    took = time.monotonic() - asked
    assert took < 2.0, took
    assert "rank 2 (stopped" in verdict, verdict
    assert "#" in verdict and "of group" in verdict, verdict
    assert ranks[2]["state"] == "stopped"
    assert {ranks[r]["state"] for r in (0, 1, 3)} <= {"waiting", "ok"}, ranks

    # The command line, as a user runs it, says the same (JSON for tools).
    done = subprocess.run([sys.executable, "-m", "torch_ddl.status", "--store",
                           f"127.0.0.1:{j.port}", "--json"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert "rank 2 (stopped" in answer["verdict"], answer["verdict"]
    assert [row["rank"] for row in answer["ranks"]] == list(range(WORLD))

    j.procs[2].send_signal(signal.SIGCONT)
    finish_healthy(j)


def test_a_killed_rank_is_named_dead(job):
    j = job()
    until(j.store)
    j.procs[3].kill()
    j.procs[3].wait(timeout=30)
    verdict, ranks = status.diagnose(status.gather(j.store))
    assert ranks[3]["state"] == "dead", ranks[3]
    assert "rank 3 (dead" in verdict, verdict


def test_a_failed_call_is_named_not_taken_for_a_hang(job):
    j = job({"ODD_RANK": "1"})
    until(j.store)
    open(j.stop + ".mismatch", "w").close()
    verdict, _ = until(j.store, lambda v: "failed on ranks" in v, 60)
    assert "no op waits; op #" in verdict and "of group 0 failed on ranks" in verdict, verdict
    assert "5 x float32" in verdict or "7 x float32" in verdict, verdict  # the calls, named
    outs = j.finish()
    assert all("raised" in out for out in outs), outs


def test_the_port_refuses_any_other_request_and_changes_nothing(job):
    j = job()
    record = json.loads(j.store.get(status.KEY + "1"))
    host, port = record["address"].rsplit(":", 1)
    for request in (b"shutdown\n", b"status please\n", b"\x00\xff" * 200 + b"\n"):
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(request)
            answer = json.loads(conn.makefile().readline())
        assert "refused request" in answer["error"], answer
        assert "only 'status'" in answer["error"]
    # A client that sends nothing is let go, and the job goes on.
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.settimeout(5)
        assert conn.recv(100) == b""
    finish_healthy(j)


def test_metrics_parse_and_count_the_ops_run(job):
    from prometheus_client.parser import text_string_to_metric_families

    base = free_port(WORLD + 1)  # a metrics port for each rank, then the store's
    j = job({"TORCH_DDL_METRICS_PORT": str(base), "HOLD_FOR_SCRAPE": "1"}, port=base + WORLD)
    until(j.store)
    open(j.stop, "w").close()
    ran = {}
    deadline = time.monotonic() + 60
    for rank, p in enumerate(j.procs):
        line = p.stdout.readline()
        assert time.monotonic() < deadline
        assert f"rank {rank} ran" in line, line
        ran[rank] = int(line.split()[3])
    for rank in range(WORLD):
        text = urllib.request.urlopen(f"http://127.0.0.1:{base + rank}/metrics", timeout=10).read()
        families = {f.name: f for f in text_string_to_metric_families(text.decode())}
        ops = sum(s.value for s in families["ddl_ops"].samples
                  if s.name == "ddl_ops_total" and s.labels["collective"] in RUN)
        assert ops == ran[rank], (rank, ops, ran[rank])
        failed = sum(s.value for s in families["ddl_op_failures"].samples
                     if s.name == "ddl_op_failures_total")
        assert failed == 0
        counts = [s for s in families["ddl_op_seconds"].samples
                  if s.name == "ddl_op_seconds_count" and s.labels["collective"] in RUN]
        assert sum(s.value for s in counts) == ran[rank]
        assert families["ddl_endpoints"].samples[0].value >= 1
    open(j.stop + ".scraped", "w").close()
    for p in j.procs:
        assert p.wait(timeout=60) == 0


def test_a_bad_metrics_port_is_refused_at_import():
    env = dict(os.environ, TORCH_DDL_METRICS_PORT="70000")
    done = subprocess.run([sys.executable, "-c", "import torch_ddl"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "TORCH_DDL_METRICS_PORT=70000" in done.stderr, done.stderr


def emulated(hosts, ranks):
    """A Cluster of emulated hosts (benchmarks/cluster/cluster.py), or a skip saying why not."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "cluster"))
    from cluster import Cluster, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(str(reason))
    return Cluster(hosts, ranks, rate="1gbit")


class EmulatedJob:
    """status_worker.py as every rank of `cluster`, asked from host 0 as a user would ask."""

    def __init__(self, cluster, stop, env):
        self.cluster = cluster
        base = dict(os.environ, OMP_NUM_THREADS="1", **env)
        self.envs = cluster.rank_env(base, port=29650)
        self.procs = [cluster.popen(h, [sys.executable, WORKER, str(r), str(len(self.envs)), "env",
                                        stop], env=e, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
                      for r, (h, e) in enumerate(self.envs)]

    def ask(self):
        # From host 0, in a shell with the job's MASTER_ADDR and MASTER_PORT.
        tool = self.cluster.popen(0, [sys.executable, "-m", "torch_ddl.status", "--json"],
                                  env=self.envs[0][1], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT)
        out, err = tool.communicate(timeout=120)
        if tool.returncode != 0 and "no ddl process has published" in err:
            return {"verdict": "(not published yet)"}  # the job is still starting
        assert tool.returncode == 0, err
        return json.loads(out)

    def until(self, predicate, seconds=90):
        deadline = time.monotonic() + seconds
        while True:
            answer = self.ask()
            if predicate(answer["verdict"]) or time.monotonic() > deadline:
                return answer
            assert all(p.poll() is None for p in self.procs), [p.stdout.read() for p in self.procs]
            time.sleep(0.5)

    def pid(self, rank):
        """The rank's process, as this namespace numbers it (the child nsenter started)."""
        with open(f"/proc/{self.procs[rank].pid}/task/{self.procs[rank].pid}/children") as f:
            return int(f.read().split()[0])


def test_emulated_hosts_a_stopped_rank_and_a_rank_in_another_op_are_named(tmp_path):
    stop = str(tmp_path / "stop")
    with emulated(2, 2) as cluster:
        job = EmulatedJob(cluster, stop, {"TORCH_DDL_HEARTBEAT_TIMEOUT_MS": "60000",
                                          "ODD_RANK": "1"})
        answer = job.until(lambda v: v.startswith("healthy"))
        assert answer["verdict"].startswith("healthy"), answer["verdict"]
        hosts = {row["rank"]: row["host"] for row in answer["ranks"]}
        assert hosts[0] == cluster.host_names[0] and hosts[3] == cluster.host_names[1], hosts

        # Rank 3, on host 1, stopped.
        rank3 = job.pid(3)
        os.kill(rank3, signal.SIGSTOP)
        try:
            answer = job.until(lambda v: "rank 3 (stopped" in v)
            assert "rank 3 (stopped" in answer["verdict"], answer["verdict"]
            assert f"host {cluster.host_names[1]}" in answer["verdict"], answer["verdict"]
        finally:
            os.kill(rank3, signal.SIGCONT)
        answer = job.until(lambda v: v.startswith("healthy"))
        assert answer["verdict"].startswith("healthy"), answer["verdict"]

        # Rank 1 calls another collective (a barrier of a group with rank 2, which rank 2 never
        # joins) while the others are in their allreduce.
        open(stop + ".odd", "w").close()
        answer = job.until(lambda v: "rank 1 (in another op" in v)
        assert "rank 1 (in another op" in answer["verdict"], answer["verdict"]
        assert "barrier #" in answer["verdict"], answer["verdict"]


def test_emulated_hosts_a_host_cut_off_is_named_unreachable(tmp_path):
    with emulated(2, 2) as cluster:
        job = EmulatedJob(cluster, str(tmp_path / "stop"),
                          {"TORCH_DDL_HEARTBEAT_TIMEOUT_MS": "60000"})
        answer = job.until(lambda v: v.startswith("healthy"))
        assert answer["verdict"].startswith("healthy"), answer["verdict"]
        # Host 1's link goes down, its processes live on: from host 0 its ranks cannot be
        # reached, and host 0's ranks wait on them.
        subprocess.run(["ip", "-n", cluster.host_names[1], "link", "set", "eth0", "down"],
                       check=True, timeout=20)
        answer = job.until(lambda v: "(unreachable" in v)
        verdict = answer["verdict"]
        assert re.search(r"waits? on rank [23] \(unreachable", verdict), verdict
        states = {row["rank"]: row["state"] for row in answer["ranks"]}
        assert states[2] == states[3] == "unreachable", states
        assert states[0] in ("waiting", "ok") and states[1] in ("waiting", "ok"), states


def test_the_simulator_names_a_stalled_rank_of_1024_at_a_virtual_time():
    # The store answers at once here: its service time would add creation's (store-bound) time
    # to the ranks' last heartbeat from rank 517 (1.2 s instead of 1.0 at 31 us a request).
    code, lines, err = sim_command("--ranks", "1024", "--ranks-per-host", "8", "--bytes", "1M",
                                   "--stall", "517@0.3", "--status-at", "1s", "--store-us", "0",
                                   "--store-set-us", "0", "--store-key-us", "0", timeout=600,
                                   trace=True)
    assert code == 0, err
    line = next(x for x in lines if x.startswith("STATUS"))
    # Every other rank waits on it, directly or through the ranks it holds up.
    assert "1023 ranks wait on rank 517 (stopped; host host64;" in line, line
    assert "no heartbeat for 1.0 s" in line, line
    rows = [x for x in lines if x.startswith("rank ")]
    assert len(rows) == 1024
    assert "stopped" in rows[517]
