"""DDP over the ringseed backend on 3 processes ends with the parameters of one process on the whole
batch: plainly, and accumulating gradients over two micro-batches with ``no_sync``, without a
communication hook, with torch's all-reduce hook and with a hook chained by ``then`` (what
PyTorch's ``test_accumulate_gradients_no_sync*`` check, which build their model only for a
backend named gloo, mpi or nccl)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (extra 'torch')")

from tests.component.collective import _ddp_model, test_torch_backend  # noqa: E402


def test_ddp_matches_single_process_reference(tmp_path: Path) -> None:
    test_torch_backend.spawn("ddp", tmp_path)
    reference = _ddp_model.train(_ddp_model.make_model(), rank=0, world=1)
    runs = ["params", *(f"params-accumulated-{hook}" for hook in (None, "allreduce", "then"))]
    for run in runs:
        for rank in range(test_torch_backend.WORLD):
            params = torch.load(tmp_path / f"{run}{rank}.pt")
            assert params.keys() == reference.keys()
            for name, value in reference.items():
                torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"{run} rank {rank}: {name}")
