"""torch_ddl: the 'ddl' backend for torch.distributed.

    import torch_ddl
    torch.distributed.init_process_group(backend="ddl")
"""

import atexit

import torch
import torch.distributed as dist

from . import _C

__version__ = "0.1.0"
__all__ = ["ProcessGroupDDL", "__version__"]

ProcessGroupDDL = _C.ProcessGroupDDL

# Fail at import, naming the variable, rather than in the middle of a collective.
_C.check_config()


def _create_backend(dist_backend_opts, backend_options=None):
    return _C.ProcessGroupDDL(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
    )


if "ddl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("ddl", _create_backend, extended_api=True, devices=["cpu"])
    # Stop the progress thread and close UCX endpoints before the interpreter tears down.
    atexit.register(_C.shutdown)
