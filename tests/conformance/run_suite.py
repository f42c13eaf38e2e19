"""PyTorch's own distributed test suite, DistributedTest._DistTestBase from
torch/testing/_internal/distributed/distributed_test.py, over a chosen backend.

    BACKEND=ddl WORLD_SIZE=2 python -m pytest tests/conformance/run_suite.py -q
    BACKEND=gloo WORLD_SIZE=3 python -m pytest tests/conformance/run_suite.py -q -k all_reduce

The suite reads BACKEND and WORLD_SIZE when it is imported and decides then, test by test, what
the backend supports. For 'ddl' this file declares what ddl implements (DDP, subgroups, being a
plugin backend) before the suite is imported; everything else runs exactly as PyTorch ships it.
"""

import os
import tempfile

os.environ.setdefault("BACKEND", "ddl")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="ddl_conformance_"))

import torch_ddl  # noqa: E402,F401  registers 'ddl' (also in every spawned rank)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

BACKEND = os.environ["BACKEND"]
if BACKEND == "ddl":
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("ddl")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
