"""A cluster of emulated hosts on one machine, for tests and benchmarks across hosts.

Each host is a network namespace (eth0: a veth to a bridge in a switch namespace) with a holder
process under its own UTS (host name), IPC, mount (a private /dev/shm and /proc) and PID
namespaces; its ranks enter the holder's namespaces with nsenter, so that ranks of one host
share memory and ranks of different hosts do not, and UCX and ddl see separate hosts (UCX then
uses TCP between them). Hosts may be grouped into racks: one bridge per rack, joined to a core
bridge by an uplink of its own rate. tc tbf shapes each link in both directions (this kernel has
no netem, so no added delay). Needs root and iproute2; everything made is removed on exit, also
when a step fails.

    sudo python benchmarks/cluster/cluster.py --hosts 2 --ranks 2 --rate 1gbit -- \\
        python -c 'import os; print(os.environ["RANK"])'

Ranks get RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (env://
rendezvous at host 0) and GLOO_SOCKET_IFNAME=eth0. Host h has address 10.99.0.(h+1).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time


class Unavailable(RuntimeError):
    """This machine cannot emulate hosts (not root, no iproute2, namespaces refused)."""


def _run(argv, check=True, timeout=20):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def unavailable_reason():
    """Why hosts cannot be emulated here, or None."""
    if os.geteuid() != 0:
        return "emulating hosts needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"emulating hosts needs {tool} (apt-get install iproute2 util-linux)"
    probe = f"ddlprobe{os.getpid() % 100000}"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "exec", probe, "unshare", "--uts", "--ipc", "--mount", "--pid",
              "--fork", "--mount-proc", "true"])
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        return f"namespaces are refused here: {error}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _collect(procs, timeout):
    """[(returncode, output)] of each process; those still running after `timeout` seconds (all
    together) are killed with their process group (returncode None)."""
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append((p.returncode, out))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            results.append((None, out))
    return results


class Cluster:
    """`hosts` hosts of `ranks` ranks each (or a list: ranks per host), links shaped to `rate`
    (tc syntax, e.g. "1gbit"; None: unshaped). `racks`: hosts per rack (a list summing to the
    hosts), each rack's uplink shaped to `rack_rate`."""

    def __init__(self, hosts, ranks, rate="1gbit", racks=None, rack_rate=None, name=None):
        self.ranks_per_host = list(ranks) if isinstance(ranks, (list, tuple)) else [ranks] * hosts
        if len(self.ranks_per_host) != hosts:
            raise ValueError(f"{hosts} hosts but ranks per host {self.ranks_per_host}")
        self.hosts = hosts
        self.rate = rate
        self.racks = list(racks) if racks else [hosts]
        if sum(self.racks) != hosts:
            raise ValueError(f"racks {self.racks} do not hold {hosts} hosts")
        self.rack_rate = rack_rate
        self.prefix = name or f"d{os.getpid() % 100000}"
        self.host_names = [f"{self.prefix}h{h}" for h in range(hosts)]
        self.switch = f"{self.prefix}sw"
        self.namespaces = []
        self.holders = []  # (unshare pid, pid of the namespace's init)
        self.processes = []

    # -- set up and tear down ----------------------------------------------------------------

    def __enter__(self):
        reason = unavailable_reason()
        if reason:
            raise Unavailable(reason)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def rack_of(self, h):
        total = 0
        for k, n in enumerate(self.racks):
            total += n
            if h < total:
                return k
        raise IndexError(h)

    def topology_spec(self):
        """TORCH_DDL_TOPOLOGY for these racks ('' with one rack)."""
        if len(self.racks) < 2:
            return ""
        racks = {}
        for h, name in enumerate(self.host_names):
            racks.setdefault(self.rack_of(h), []).append(name)
        return "; ".join(f"rack{k}: " + " ".join(names) for k, names in sorted(racks.items()))

    def host_ip(self, h):
        return f"10.99.0.{h + 1}"

    def _shape(self, namespace, device, rate):
        if rate:
            _run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", device, "root",
                  "tbf", "rate", rate, "burst", "128kb", "latency", "100ms"])

    def _netns(self, name):
        _run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _setup(self):
        self._netns(self.switch)
        sw = ["ip", "-n", self.switch]
        for k in range(len(self.racks)):
            _run(sw + ["link", "add", f"br{k}", "type", "bridge"])
            _run(sw + ["link", "set", f"br{k}", "up"])
        if len(self.racks) > 1:
            _run(sw + ["link", "add", "core", "type", "bridge"])
            _run(sw + ["link", "set", "core", "up"])
            for k in range(len(self.racks)):
                _run(sw + ["link", "add", f"up{k}", "type", "veth", "peer", "name", f"dn{k}"])
                _run(sw + ["link", "set", f"up{k}", "master", f"br{k}", "up"])
                _run(sw + ["link", "set", f"dn{k}", "master", "core", "up"])
                self._shape(self.switch, f"up{k}", self.rack_rate)
                self._shape(self.switch, f"dn{k}", self.rack_rate)
        for h, host in enumerate(self.host_names):
            self._netns(host)
            inside, outside = f"{host}i", f"{host}o"
            _run(["ip", "link", "add", inside, "type", "veth", "peer", "name", outside])
            _run(["ip", "link", "set", inside, "netns", host])
            _run(["ip", "link", "set", outside, "netns", self.switch])
            _run(["ip", "-n", host, "link", "set", inside, "name", "eth0"])
            _run(["ip", "-n", host, "addr", "add", f"{self.host_ip(h)}/16", "dev", "eth0"])
            _run(["ip", "-n", host, "link", "set", "eth0", "up"])
            _run(sw + ["link", "set", outside, "master", f"br{self.rack_of(h)}", "up"])
            self._shape(host, "eth0", self.rate)
            self._shape(self.switch, outside, self.rate)
            self._start_holder(h)

    def _start_holder(self, h):
        host = self.host_names[h]
        hosts = "".join(f"{self.host_ip(i)} {n}\\n" for i, n in enumerate(self.host_names))
        script = (f"hostname {host} && mount -t tmpfs -o size=50% tmpfs /dev/shm && "
                  f"mount -t tmpfs tmpfs /mnt && printf '127.0.0.1 localhost\\n{hosts}' "
                  "> /mnt/hosts && mount --bind /mnt/hosts /etc/hosts && umount -l /mnt && "
                  "exec sleep 86400")
        holder = subprocess.Popen(
            ["ip", "netns", "exec", host, "unshare", "--uts", "--ipc", "--mount", "--pid",
             "--fork", "--mount-proc", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        deadline = time.monotonic() + 10
        init = None
        while time.monotonic() < deadline and init is None:
            if holder.poll() is not None:
                raise RuntimeError(f"host {host}: holder exited: {holder.stderr.read().strip()}")
            children = _run(["pgrep", "-P", str(holder.pid)], check=False).stdout.split()
            if children:
                pid = int(children[0])
                # Ready once it is the sleep (the host name and /dev/shm are set).
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        if f.read().strip() == "sleep":
                            init = pid
                except FileNotFoundError:
                    pass
            time.sleep(0.02)
        self.holders.append((holder, init))
        if init is None:
            raise RuntimeError(f"host {host}: holder did not start within 10 s")

    def close(self):
        for p in self.processes:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.processes = []
        for holder, init in self.holders:
            for pid in (init, holder.pid):
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            try:
                holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.holders = []
        for name in reversed(self.namespaces):
            _run(["ip", "netns", "del", name], check=False)
        self.namespaces = []

    # -- running things on hosts -------------------------------------------------------------

    def enter(self, h):
        """The command prefix that runs a program on host h."""
        init = self.holders[h][1]
        return ["nsenter", "-t", str(init), "--uts", "--ipc", "--mount", "--pid", "--net",
                f"--wd={os.getcwd()}", "--"]

    def popen(self, h, argv, env=None, **kwargs):
        p = subprocess.Popen(self.enter(h) + list(argv), env=env, start_new_session=True,
                             **kwargs)
        self.processes.append(p)
        return p

    def rank_env(self, base=None, port=29600):
        """Environment of each rank, by rank (host-major order)."""
        base = dict(os.environ if base is None else base)
        world = sum(self.ranks_per_host)
        envs = []
        for h, n in enumerate(self.ranks_per_host):
            for local in range(n):
                env = dict(base)
                env.update(RANK=str(len(envs)), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                           LOCAL_WORLD_SIZE=str(n), MASTER_ADDR=self.host_ip(0),
                           MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="eth0")
                spec = self.topology_spec()
                if spec and "TORCH_DDL_TOPOLOGY" not in base:
                    env["TORCH_DDL_TOPOLOGY"] = spec
                envs.append((h, env))
        return envs

    def launch(self, argv, env=None, timeout=300, port=29600, order=None):
        """Runs argv as every rank (env:// rendezvous); returns [(returncode, output)] by rank.
        `order` maps rank to host differently (a list of hosts by rank, each host's count
        unchanged). Ranks still running at `timeout` are killed (returncode None)."""
        envs = self.rank_env(env, port)
        if order is not None:
            hosts = [h for h, _ in envs]
            if sorted(order) != sorted(hosts):
                raise ValueError(f"order {order} does not keep ranks per host {hosts}")
            local = {}
            for rank, (h, e) in enumerate(envs):
                e = dict(e)
                e["LOCAL_RANK"] = str(local.get(order[rank], 0))
                local[order[rank]] = local.get(order[rank], 0) + 1
                e["LOCAL_WORLD_SIZE"] = str(self.ranks_per_host[order[rank]])
                envs[rank] = (order[rank], e)
        procs = [self.popen(h, argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True) for h, e in envs]
        return _collect(procs, timeout)

    def result(self, argv, timeout=1800):
        """Runs argv as every rank (OMP_NUM_THREADS=1, no flight recorder) and returns the JSON
        that rank 0 printed on a line "RESULT {...}"; exits naming the first rank that failed."""
        env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DDL_TRACE_ENTRIES="0")
        results = self.launch(argv, env=env, timeout=timeout)
        for r, (code, out) in enumerate(results):
            if code != 0:
                print(f"rank {r} exited {code}:\n{out[-3000:]}", file=sys.stderr)
                raise SystemExit(1)
        return json.loads(next(line[len("RESULT "):] for line in results[0][1].splitlines()
                               if line.startswith("RESULT ")))

    def torchrun(self, script_argv, env=None, timeout=600, port=29600):
        """Runs `torchrun --nnodes H --node_rank h --nproc_per_node L ... script_argv` on every
        host (static rendezvous at host 0); returns [(returncode, output)] by host."""
        env = dict(os.environ if env is None else env, GLOO_SOCKET_IFNAME="eth0")
        spec = self.topology_spec()
        if spec:
            env.setdefault("TORCH_DDL_TOPOLOGY", spec)
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        procs = []
        for h, n in enumerate(self.ranks_per_host):
            argv = [torchrun, f"--nnodes={self.hosts}", f"--node_rank={h}",
                    f"--nproc_per_node={n}", f"--master_addr={self.host_ip(0)}",
                    f"--master_port={port}", *script_argv]
            procs.append(self.popen(h, argv, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True))
        return _collect(procs, timeout)

    def measure_link(self, seconds=1.0, src=0, dst=1):
        """TCP payload rate (bytes/s) from host src to host dst, one connection for `seconds`."""
        port = 29599
        server = self.popen(dst, [sys.executable, "-c", _SINK, self.host_ip(dst), str(port)],
                            stdout=subprocess.PIPE, text=True)
        try:
            client = self.popen(src, [sys.executable, "-c", _SOURCE, self.host_ip(dst), str(port),
                                      str(seconds)], stdout=subprocess.PIPE, text=True)
            out, _ = client.communicate(timeout=seconds + 30)
            server.communicate(timeout=30)
        finally:
            for p in (server,):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
        return float(out.strip())


_SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30)
while c.recv(1 << 20): pass
"""

_SOURCE = """
import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.05)
block = b"x" * (1 << 20); sent = 0
# Warm up (fill the shaper's burst and TCP's window), then time.
warm = time.monotonic() + 0.3
while time.monotonic() < warm: c.sendall(block)
start = time.monotonic(); end = start + float(sys.argv[3])
while time.monotonic() < end: c.sendall(block); sent += len(block)
print(sent / (time.monotonic() - start)); c.close()
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2, help="ranks per host")
    parser.add_argument("--rate", default="1gbit", help="host link rate (tc syntax; 0: unshaped)")
    parser.add_argument("--racks", help="hosts per rack, comma-separated (e.g. 2,2)")
    parser.add_argument("--rack-rate", default=None, help="rack uplink rate")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--measure", action="store_true", help="print the link's TCP rate")
    parser.add_argument("--torchrun", action="store_true",
                        help="run the command as a script under torchrun, one per host")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    racks = [int(v) for v in args.racks.split(",")] if args.racks else None
    rate = None if args.rate in ("0", "none") else args.rate
    with Cluster(args.hosts, args.ranks, rate, racks, args.rack_rate) as cluster:
        if args.measure:
            print(f"link: {cluster.measure_link() / 1e6:.1f} MB/s TCP payload", flush=True)
        if command:
            failed = 0
            if args.torchrun:
                results, what = cluster.torchrun(command, timeout=args.timeout), "host"
            else:
                results, what = cluster.launch(command, timeout=args.timeout), "rank"
            for i, (code, out) in enumerate(results):
                print(f"--- {what} {i}: exit {code}\n{out}", end="" if out.endswith("\n") else "\n")
                failed += code != 0
            sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
