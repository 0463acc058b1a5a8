"""Every c10d operation on CPU tensors through the ``ringseed`` backend, on real processes: point to
point (tags out of order, any source, batches), rooted and personalised operations and their
``_object`` forms, coalesced and bitwise reductions, bool and complex tensors, sparse all_reduce
(SUM; other ops and other operations refuse sparse tensors by name), barriers, a monitored
barrier naming the rank that did not come, a subgroup destroyed; with
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` too. Nothing may be printed at shutdown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'torch')")

from tests.conftest import REPO


def run_world(world: int, tmp_path: Path, *, debug: str | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISTRIBUTED_DEBUG"}
    env["PYTHONWARNINGS"] = "ignore"  # torch's deprecation notices; anything else on stderr is a failure
    if debug is not None:
        env["TORCH_DISTRIBUTED_DEBUG"] = debug
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.component.collective._torch_ops_worker",
                str(r),
                str(world),
                str(tmp_path / "init"),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append((p.returncode, out, err))
    for rank, (rc, _, err) in enumerate(results):
        assert rc == 0, f"rank {rank} failed:\n{err[-4000:]}"
        assert not err.strip(), f"rank {rank} printed on stderr:\n{err[-4000:]}"


@pytest.mark.parametrize("world", [3])
def test_every_c10d_operation_on_cpu_tensors(world: int, tmp_path: Path) -> None:
    run_world(world, tmp_path)


def test_the_same_under_torch_distributed_debug_detail(tmp_path: Path) -> None:
    run_world(2, tmp_path, debug="DETAIL")
