"""The test class pytest runs: PyTorch's ``DistributedTest._DistTestBase`` with one backend.

PyTorch ships its generic distributed suite in the wheel
(``torch/testing/_internal/distributed/distributed_test.py``) and drives it from
``test/distributed/test_distributed_spawn.py`` (not in the wheel): that file reads ``BACKEND``,
``WORLD_SIZE`` and ``TEMP_DIR``, refuses any backend but gloo, nccl and ucc, and defines
``TestDistBackendWithSpawn`` from ``TestDistBackend`` and ``_DistTestBase``. This module is our
equivalent for any registered backend; ``tests/torchsuite/__main__.py`` runs it in a child
pytest with the environment below. How the suite treats a backend it does not know:

- ``BACKEND`` is read once, when ``distributed_test`` is imported, and every skip decorator is
  evaluated then, mostly by name (``BACKEND != "gloo"``) or against the feature sets in
  ``common_distributed.DistTestCases`` (``backend_feature["ddp"]``, ``["subgroup"]``, ...).
  An unknown name is simply absent from those sets, so e.g. all DDP tests skip.
- ``RINGSEED_SUITE_SELECT`` picks whose decorators decide: ``ringseed`` imports the suite with
  ``BACKEND=ringseed`` after declaring ringseed's features in ``DistTestCases`` (the suite's own
  mechanism for out-of-tree backends); ``gloo`` imports it with ``BACKEND=gloo``, so exactly the
  tests Gloo runs are selected, and then points the module's ``BACKEND`` (used at run time by
  ``init_process_group`` and by the tests' assertions) at the backend under test
  (``RINGSEED_SUITE_BACKEND``). The second mode is how "every test that passes with Gloo passes
  with ringseed" is checked; the first shows what the suite itself grants an unknown name.
- Child processes are forked from the pytest process that imported this module, so the backend
  is registered and the same selection is made there.
- Four tests (``test_accumulate_gradients_no_sync*``) are selected for Gloo but build their model
  only under ``if BACKEND == "mpi" or BACKEND == "gloo"`` in the test body, read at run time:
  under any other name they fail with ``UnboundLocalError: ddp_model``. With the Gloo selection
  the helper they share runs with the module's ``BACKEND`` reading "gloo" for its duration (it
  picks the CPU model by that name and nothing else); the group it trains on is still the one
  ``init_process_group`` made for the backend under test, which it asserts first.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.testing._internal import common_distributed

import ringseed.collective.torch_backend  # noqa: F401  (registers "ringseed" in every process)

UNDER_TEST = os.environ.get("RINGSEED_SUITE_BACKEND", "ringseed")
SELECT = os.environ.get("RINGSEED_SUITE_SELECT", UNDER_TEST)
RINGSEED_FEATURES = ("ddp", "subgroup", "gpu", "cuda")  # what ringseed supports, in the suite's terms

if SELECT == "ringseed":
    for feature in RINGSEED_FEATURES:
        common_distributed.DistTestCases.backend_feature[feature].add("ringseed")

os.environ["BACKEND"] = SELECT
from torch.testing._internal.distributed import distributed_test  # noqa: E402

distributed_test.BACKEND = UNDER_TEST

torch.backends.cuda.matmul.allow_tf32 = False


class TestDistBackendWithSpawn(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        # Forked, not spawned as upstream does: a spawned child imports torch and its test
        # internals again, about 100 s per test on a loaded 2-core machine; a forked child has them.
        self._start_processes(torch.multiprocessing.get_context("fork").Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def _test_accumulate_gradients_no_sync(self, *args: object, **kwargs: object) -> None:
        upstream = distributed_test.DistributedTest._DistTestBase._test_accumulate_gradients_no_sync
        if SELECT != "gloo":
            upstream(self, *args, **kwargs)
            return
        assert dist.get_backend() == UNDER_TEST, (dist.get_backend(), UNDER_TEST)
        distributed_test.BACKEND = "gloo"  # the body's only use of the name: which model to build
        try:
            upstream(self, *args, **kwargs)
        finally:
            distributed_test.BACKEND = UNDER_TEST


assert dist.is_available()
