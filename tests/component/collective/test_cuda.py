"""CUDA tensors: staged through pinned host memory, reduced on the GPU, results back on the device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (extra 'torch')")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from ringseed.collective import engine, tensors  # noqa: E402
from tests.component.collective import _engine_ring  # noqa: E402

pytestmark = pytest.mark.gpu


CASES = [
    (op, dt)
    for op in (engine.ReduceOp.SUM, engine.ReduceOp.MAX, engine.ReduceOp.AVG)
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64)
    if op is not engine.ReduceOp.AVG or dt.is_floating_point
]  # AVG: floating dtypes only


@pytest.mark.parametrize(("op", "dtype"), CASES, ids=[f"{o.name}-{d}" for o, d in CASES])
def test_gpu_tensors_all_reduce_on_the_gpu(op: engine.ReduceOp, dtype: torch.dtype) -> None:
    n = 3
    with _engine_ring.ring(n) as peers:
        cpu = [torch.arange(7 * 42_859, dtype=torch.float64).remainder(97 + r).to(dtype) for r in range(n)]
        gpu = [t.to("cuda").reshape(7, -1)[:, :-1] for t in cpu]  # non-contiguous views on the GPU
        expect_src = torch.stack([t.reshape(7, -1)[:, :-1].double() for t in cpu])
        ref = {
            engine.ReduceOp.SUM: expect_src.sum(0),
            engine.ReduceOp.MAX: expect_src.max(0).values,
            engine.ReduceOp.AVG: expect_src.mean(0),
        }[op]
        staged = [tensors.stage(t) for t in gpu]
        assert all(s.reducer is not None for s in staged), "CUDA tensors must reduce on the device"
        _engine_ring.each(
            peers,
            lambda e: e.all_reduce(
                staged[e.rank].array, op=op, tag=1, bfloat16=staged[e.rank].bfloat16, reducer=staged[e.rank].reducer
            ),
        )
        for s in staged:
            s.finish()
        tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 2e-3, torch.int64: 0}[dtype]
        for t in gpu:
            assert t.is_cuda and torch.equal(t, gpu[0])
            torch.testing.assert_close(t.double().cpu(), ref, rtol=tol, atol=tol)


def test_cuda_backend_collectives(tmp_path: object) -> None:
    from pathlib import Path

    from tests.component.collective import test_torch_backend

    test_torch_backend.spawn("cuda", Path(str(tmp_path)))
