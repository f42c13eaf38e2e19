"""The side of `python -m torch_ddl.status` that answers, in every process of a job (status.py
is the side that asks): a TCP port per process, served by a thread of the core
(runtime/status_server.h) and published here in the job's store; and, with
TORCH_DDL_METRICS_PORT, the Prometheus endpoint. docs/status.md explains every field."""

import json
import os
import socket
import threading
import warnings

KEY = "torch_ddl/status/"
REQUEST = b"status\n"
_served = {}  # what this process serves: {"status": server, "metrics": port}
_lock = threading.Lock()


def _settings():
    from . import _C

    return {name: value for name, value, _default, _description in _C.config_table()}


def _base_store(store):
    """The store under a group's PrefixStores: the job's, whose keys a tool outside can read."""
    seen = 0
    while hasattr(store, "underlying_store") and seen < 16:
        store = store.underlying_store
        seen += 1
    return store


def _bind_address(store, configured):
    if configured:
        return configured
    host = getattr(store, "host", None)
    port = getattr(store, "port", None)
    if not host or not port:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port)))  # no packet: the route's source address
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def serve(store, rank, world_size, global_ranks=None):
    """Starts this process's status port (once) and publishes its address in the job's store.
    Called as a ddl group is made; the first group's rank names the process."""
    with _lock:
        if "status" in _served:
            return _served["status"]
        settings = _settings()
        if global_ranks:
            rank = global_ranks[rank]
        _start_metrics(settings, rank)
        _served["status"] = None
        if settings["TORCH_DDL_STATUS"] != "1":
            return None
        world_size = int(os.environ.get("WORLD_SIZE", world_size))
        base = _base_store(store)
        address = _bind_address(base, settings["TORCH_DDL_STATUS_ADDR"])
        facts = {"rank": rank, "world_size": world_size, "host": socket.gethostname(),
                 "pid": os.getpid()}
        from . import _C

        try:
            # A thread of the core's answers (runtime/status_server.h): no Python, no GIL.
            port = _C.start_status_server(address, json.dumps(facts)[1:-1])
        except RuntimeError as e:
            warnings.warn(f"torch_ddl: no status port ({e}); python -m torch_ddl.status will "
                          f"name this rank unknown")
            return None
        record = dict(facts, address=f"{address}:{port}")
        base.set(KEY + str(rank), json.dumps(record))
        base.set(KEY + "world_size", str(world_size))
        _served["status"] = port
        return port


def _start_metrics(settings, rank):
    port = settings["TORCH_DDL_METRICS_PORT"]
    if not port or "metrics" in _served:
        return
    try:
        import prometheus_client
    except ImportError as e:
        raise RuntimeError("TORCH_DDL_METRICS_PORT is set, but prometheus_client is not "
                           "installed (pip install prometheus_client)") from e
    local = int(os.environ.get("LOCAL_RANK", rank))
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(_Metrics())
    prometheus_client.start_http_server(int(port) + local, addr=settings["TORCH_DDL_METRICS_ADDR"],
                                        registry=registry)
    _served["metrics"] = int(port) + local


class _Metrics:
    """The core's counts (stats.h), read at each scrape."""

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        from . import _C

        stats = json.loads(_C.stats_json())
        labels = ["collective", "size_class"]
        ops = CounterMetricFamily("ddl_ops", "ops ended (completed or failed)", labels=labels)
        sent = CounterMetricFamily("ddl_op_bytes", "bytes of the ops ended (a rank's tensor)",
                                   labels=labels)
        failed = CounterMetricFamily("ddl_op_failures", "ops that failed", labels=labels)
        seconds = HistogramMetricFamily("ddl_op_seconds", "time from an op's start to its end",
                                        labels=labels)
        bounds = stats["bucket_bounds"]
        for row in stats["ops"]:
            key = [row["collective"], row["size_class"]]
            ops.add_metric(key, row["ops"])
            sent.add_metric(key, row["bytes"])
            failed.add_metric(key, row["failed"])
            cumulative, buckets = 0, []
            for bound, count in zip(bounds + [float("inf")], row["buckets"]):
                cumulative += count
                buckets.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
            seconds.add_metric(key, buckets, row["seconds"])
        errors = CounterMetricFamily("ddl_errors", "failed ops by the kind of failure",
                                     labels=["kind"])
        for kind, count in stats["failures"].items():
            errors.add_metric([kind], count)
        groups = GaugeMetricFamily("ddl_group_last_completed",
                                   "sequence number of each group's last completed op",
                                   labels=["group"])
        for g in stats["groups"]:
            groups.add_metric([g["name"]], g["last_completed"])
        quick = CounterMetricFamily("ddl_quick_allreduces", "one-step allreduces run on the "
                                    "caller's thread (counted in ddl_ops too)")
        quick.add_metric([], stats["quick_ops"])
        handed = CounterMetricFamily("ddl_handed_allreduces", "one-step allreduces a caller "
                                     "began and an op took over (a peer was late)")
        handed.add_metric([], stats["handed_ops"])
        state = json.loads(_C.status_json(200))
        active = GaugeMetricFamily("ddl_ops_in_flight", "ops running now")
        active.add_metric([], state["active_ops"])
        watched = GaugeMetricFamily("ddl_heartbeat_peers", "peers whose heartbeats this process "
                                    "watches", labels=["state"])
        if "watched" in state:
            watched.add_metric(["watched"], state["watched"])
            watched.add_metric(["lost"], state["lost"])
        endpoints = GaugeMetricFamily("ddl_endpoints", "transport endpoints opened")
        endpoints.add_metric([], _C.endpoints_opened())
        shared = GaugeMetricFamily("ddl_shared_buffers", "shared-memory buffers alive "
                                   "(torch_ddl.empty_shared and adopted tensors)")
        shared.add_metric([], _C.shared_buffers_live())
        yield from (ops, sent, failed, seconds, errors, groups, quick, handed, active, watched,
                    endpoints, shared)
