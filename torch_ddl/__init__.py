"""torch_ddl: the 'ddl' backend for torch.distributed.

    import torch_ddl                                   # optional: torch loads it for "ddl"
    torch.distributed.init_process_group(backend="ddl")
"""

import atexit
import contextlib
import functools
import glob
import importlib.util
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def _load_extension():
    """torch_ddl._C, from beside this file, or else from an installed torch_ddl that a source
    checkout shadows on sys.path (the tests run from a checkout after `pip install .`)."""
    try:
        from . import _C

        return _C
    except ImportError as error:
        here = os.path.dirname(os.path.abspath(__file__))
        for entry in sys.path:
            for path in glob.glob(os.path.join(entry or ".", "torch_ddl", "_C.*.so")):
                if os.path.dirname(os.path.abspath(path)) == here:
                    continue
                spec = importlib.util.spec_from_file_location(f"{__name__}._C", path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
                return module
        raise ImportError(
            f"torch_ddl's extension is neither built in {here} nor installed elsewhere on "
            "sys.path: build it with `pip install --no-build-isolation -e .` (or `make build`)"
        ) from error


_C = _load_extension()

__version__ = "0.1.0"
__all__ = ["ProcessGroupDDL", "empty_shared", "failure", "new_window", "quorum_waived", "__version__"]

ProcessGroupDDL = _C.ProcessGroupDDL

# Fail at import, naming the variable, rather than in the middle of a collective.
_C.check_config()
# TORCH_DDL_SHARED_ALLOCATOR=1: CPU tensors from shared memory from here on (docs/shared-memory.md).
_C.install_shared_allocator()

from . import _status  # noqa: E402 (needs _C)


def dump_trace(path=None):
    """Writes the flight recorder (the last operations of this process's ddl groups) to `path`,
    by default TORCH_DDL_TRACE_FILE followed by the rank; returns the path written. Read the
    ranks' dumps with `python -m torch_ddl.info --trace FILES`."""
    written = _C.dump_trace(path or "")
    if not written:
        raise RuntimeError("ddl: the flight recorder could not be written "
                           f"({path or 'TORCH_DDL_TRACE_FILE is empty'})")
    return written


def failure(group=None):
    """How a ddl group first failed, as a dict: `kind` ("ok" while nothing failed, "timeout",
    "peer lost", "partitioned", "mismatch", "invalid argument", "closed", "other"), `ranks` (the
    group ranks it names: the peers that are gone, the ones a timeout still waited for, the ones
    that called something else), `detail` (the words the exception carried) and `remote` (another
    rank reported it). A job that shrinks after a failure excludes the ranks a "peer lost" names:

        info = torch_ddl.failure()
        if info["kind"] == "peer lost":
            group = dist.shrink_group(info["ranks"])
    """
    import torch.distributed as dist

    group = group or dist.group.WORLD
    return group._get_backend(torch.device("cpu")).failure()


@contextlib.contextmanager
def quorum_waived():
    """dist.shrink_group on a ddl group goes on only where the ranks left are more than half of
    the group, or exactly half with its rank 0: of the two sides of a network partition only one
    then goes on, and the other's shrink raises DistNetworkError saying so. A job that knows the
    ranks it excludes are dead (not merely cut off) may shrink without that rule:

        with torch_ddl.quorum_waived():
            group = dist.shrink_group(dead_ranks)
    """
    _C.waive_quorum(True)
    try:
        yield
    finally:
        _C.waive_quorum(False)


def empty_shared(*size, dtype=torch.float32):
    """An uninitialised CPU tensor in memory that the ddl ranks of one host can map.

    An allreduce over 'ddl' whose tensor lies in such memory on every rank (the tensor itself or
    a contiguous view of it) moves no data through staging: each rank reduces its share straight
    out of its peers' tensors and writes the result into all of them. Use it for buffers that are
    allreduced again and again; other ops treat it as any tensor. The memory is freed with the
    tensor (and its views), and stays valid until torch_ddl shuts down at interpreter exit.

        grads = torch_ddl.empty_shared(1 << 24)          # float32, 64 MiB
        grads.copy_(...); dist.all_reduce(grads)
    """
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if any(not isinstance(s, int) or s < 0 for s in size):
        raise ValueError(f"empty_shared: sizes must be non-negative integers, got {size}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"empty_shared: dtype must be a torch.dtype, got {dtype!r}")
    element = torch.empty((), dtype=dtype).element_size()
    raw = _C.shared_buffer(math.prod(size) * element)
    return raw.view(dtype).view(size)


def new_window(tensor=None, group=None):
    """A one-sided window over a ddl group (collective: every rank calls it, in the same order).

    Each rank registers a tensor (here, or later with ``window.tensor_register(t)``, also
    collective; every rank's must have the same dtype and shape). Then any rank writes into a
    peer's tensor with nothing posted there, and tells it so:

        win = torch_ddl.new_window(torch_ddl.empty_shared(n))
        win.put(block, dst_rank=1, target_offset_nelems=0, async_op=False)
        win.signal(1, False)          # rank 1: win.wait_signal(0, False), then reads its tensor

    A signal is seen after every put its sender made to that peer before it. Puts to a peer on
    this host whose tensor is in shared memory (``empty_shared``, or a tensor that is its whole
    storage) are one copy into its mapped memory, and ``map_remote_tensor(rank)`` gives that
    memory as a tensor; other puts go over UCX's one-sided puts. From torch 2.14 on this is
    torch's own ``dist._new_window``; before, ddl's window has the same methods (a ``timeout``
    keyword stands for torch's options).
    """
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise RuntimeError("new_window: no default process group (call init_process_group first)")
    backend = pg._get_backend(torch.device("cpu"))
    if not isinstance(backend, _C.ProcessGroupDDL):
        raise ValueError(f"new_window: the group's backend is {type(backend).__name__}, not ddl's")
    return backend._new_window(tensor)


def _create_backend(dist_backend_opts, backend_options=None):
    backend = _C.ProcessGroupDDL(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
    )
    # The process's status port (python -m torch_ddl.status) and metrics, with its first group.
    _status.serve(dist_backend_opts.store, dist_backend_opts.group_rank,
                  dist_backend_opts.group_size,
                  list(getattr(dist_backend_opts, "global_ranks_in_group", None) or []))
    return backend


def _allow_monitored_barrier():
    """torch's monitored_barrier refuses every backend but gloo before reaching the backend;
    let it through for 'ddl' groups (whose backend implements monitoredBarrier)."""
    c10d = dist.distributed_c10d
    original = c10d.monitored_barrier
    if getattr(original, "_torch_ddl", False):
        return

    @functools.wraps(original)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        if c10d._rank_not_in_group(group) or dist.get_backend(group) != "ddl":
            return original(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(dist.get_backend(group))
        elif isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        group_to_use = c10d._get_default_group() if group is None else group
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._torch_ddl = True
    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier


def _name_backend_in_ddp_logging():
    """DDP's logging data takes the backend name from torch's ProcessGroup, which calls every
    plugin backend 'custom'; report the name the group was created with, as for gloo."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    original = DDP._get_ddp_logging_data
    if getattr(original, "_torch_ddl", False):
        return

    @functools.wraps(original)
    def _get_ddp_logging_data(self):
        data = original(self)
        if data.get("backend_name") == "custom":
            try:
                data["backend_name"] = dist.get_backend(self.process_group)
            except (RuntimeError, ValueError):
                pass
        return data

    _get_ddp_logging_data._torch_ddl = True
    DDP._get_ddp_logging_data = _get_ddp_logging_data


def _register_shrunk_groups_as_custom():
    """torch 2.13 and 2.14's shrink_group registers the shrunk group's backend as GLOO (NCCL on
    CUDA) whatever it is. Code that trusts the type then takes ddl's backend for gloo's: DDP's
    logger reads gloo's options out of it and crashes. The ddl backend of a shrunk group is
    registered again as CUSTOM, the type the group it came from had, and made the default."""
    c10d = dist.distributed_c10d
    original = getattr(c10d, "_create_shrunk_process_group", None)
    if original is None or getattr(original, "_torch_ddl", False):
        return

    @functools.wraps(original)
    def _create_shrunk_process_group(new_backend, *args, **kwargs):
        pg = original(new_backend, *args, **kwargs)
        if isinstance(new_backend, ProcessGroupDDL):
            custom = dist.ProcessGroup.BackendType.CUSTOM
            for device in ("cpu", "cuda"):
                pg._register_backend(torch.device(device), custom, new_backend)
            pg._set_default_backend(custom)
        return pg

    _create_shrunk_process_group._torch_ddl = True
    c10d._create_shrunk_process_group = _create_shrunk_process_group


# Three of torch's functions are wrapped on import, each where torch itself stops a plugin
# backend from doing what gloo does (see each docstring). Each wrapper passes every other
# backend's calls to torch unchanged, wraps once (re-imports leave it be), and is tested by the
# behaviour it restores (test_coalesced.py's monitored_barrier, test_sparse.py's logging data,
# test_shrink.py's DDP after a shrink). Each can go once the oldest torch ddl supports does this
# itself: monitored_barrier letting through a backend that implements it, DDP's logging naming a
# plugin backend, shrink_group registering the backend it is given under that backend's type.
_allow_monitored_barrier()
_name_backend_in_ddp_logging()
_register_shrunk_groups_as_custom()

# torch may have registered "ddl" already (torch_ddl_autoload), creating groups through this
# module all the same.
if "ddl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("ddl", _create_backend, extended_api=True,
                                  devices=["cpu", "cuda"])
# Stop the progress thread and close UCX endpoints before the interpreter tears down.
atexit.register(_C.shutdown)
