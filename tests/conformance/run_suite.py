"""PyTorch's own distributed test suite, DistributedTest._DistTestBase from
torch/testing/_internal/distributed/distributed_test.py, over a chosen backend.

    BACKEND=ddl WORLD_SIZE=2 python -m pytest tests/conformance/run_suite.py -q
    BACKEND=gloo WORLD_SIZE=3 python -m pytest tests/conformance/run_suite.py -q -k all_reduce

The suite reads BACKEND and WORLD_SIZE when it is imported and decides then, test by test, what
the backend supports. For 'ddl' this file declares what ddl implements (DDP, subgroups, being a
plugin backend) before the suite is imported; everything else runs exactly as PyTorch ships it.
"""

import functools
import os
import tempfile

os.environ.setdefault("BACKEND", "ddl")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="ddl_conformance_"))

BACKEND = os.environ["BACKEND"]
if BACKEND == "ddl":
    import torch_ddl  # noqa: F401  registers 'ddl' (also in every spawned rank)
    from torch.testing._internal.common_distributed import DistTestCases

    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("ddl")

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# Tests the suite restricts to named backends for a reason that holds for ddl as well: each runs
# over ddl exactly as PyTorch wrote it (only the skip decision is replaced). The README lists them.
GLOO_ONLY_TESTS_THAT_APPLY = {
    # "Test requires backend to be one of {'gloo'}": CPU tensors, which ddl takes too.
    "test_all_reduce_coalesced_sum": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_product": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_min": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_max": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_group_sum": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_group_product": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_group_min": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_group_max": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_full_group_sum": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_full_group_product": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_full_group_min": "CPU all_reduce_coalesced",
    "test_all_reduce_coalesced_full_group_max": "CPU all_reduce_coalesced",
    "test_monitored_barrier_gloo": "ddl implements monitored_barrier",
    "test_monitored_barrier_gloo_subgroup": "ddl implements monitored_barrier",
    "test_monitored_barrier_gloo_rank_0_timeout": "ddl implements monitored_barrier",
    "test_monitored_barrier_failure_order": "ddl implements monitored_barrier",
    "test_monitored_barrier_wait_all_ranks": "ddl implements monitored_barrier",
    "test_scatter_object_list": "CPU scatter_object_list",
    "test_grads_same_across_ranks_with_no_sync": "CPU DDP with no_sync",
    # backend_feature["gpu"]: the object collectives run on CPU tensors for ddl.
    "test_all_gather_object_default_pg": "CPU all_gather_object",
    "test_all_gather_object_subgroup": "CPU all_gather_object",
    # "GLOO Batch Send Recv CPU"
    "test_batch_isend_irecv_gloo": "CPU batch_isend_irecv",
    "test_batch_isend_irecv_gloo_tags": "CPU batch_isend_irecv",
    # "get_future is only supported on mpi, nccl and gloo"
    "test_get_future": "Work.get_future",
    "test_accumulate_gradients_no_sync": "Work.get_future",
    "test_accumulate_gradients_no_sync_grad_is_view": "Work.get_future",
    "test_accumulate_gradients_no_sync_allreduce_hook": "Work.get_future",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": "Work.get_future",
    # "Only gloo backend supports timeouts"
    "test_barrier_timeout_group": "per-group timeouts",
    "test_barrier_timeout_full_group": "per-group timeouts",
    # "Only Gloo backend supports sparse all reduce"
    "test_sparse_all_reduce_sum": "sparse all_reduce",
}

# Of those, the tests whose body picks its model setup by backend name ("if BACKEND == 'mpi' or
# BACKEND == 'gloo'": the CPU setup) and has none for other names. They run that CPU setup over
# ddl: the body sees the name 'gloo' while the group it uses is ddl's.
CPU_SETUP_BY_NAME = {
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
}


def _with_cpu_setup(test):
    @functools.wraps(test)
    def run(self, *args, **kwargs):
        assert dist.get_backend() == "ddl"
        saved, distributed_test.BACKEND = distributed_test.BACKEND, "gloo"
        try:
            return test(self, *args, **kwargs)
        finally:
            distributed_test.BACKEND = saved

    return run


if BACKEND == "ddl":
    for name in GLOO_ONLY_TESTS_THAT_APPLY:
        test = getattr(DistributedTest._DistTestBase, name)
        # Only a skip that names gloo is lifted; a platform or world-size skip stays.
        if "gloo" in getattr(test, "__unittest_skip_why__", "").lower():
            if name in CPU_SETUP_BY_NAME:
                test = _with_cpu_setup(test)
                setattr(DistributedTest._DistTestBase, name, test)
            test.__unittest_skip__ = False


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
