"""The ``ringseed`` torch.distributed backend: every collective on 3 real processes, checked against
references computed locally from the same seeds; plus the torch reducer used for GPU tensors."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (extra 'torch')")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")

from ringseed.collective import engine, ops, tensors  # noqa: E402
from tests.component.collective import _engine_ring  # noqa: E402

WORLD = 3


def inputs(rank: int, dtype: torch.dtype, n: int = 1001) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    return torch.randint(-50, 50, (n,), generator=g, dtype=dtype)


def check_collectives(rank: int, out_dir: Path) -> None:
    R = dist.ReduceOp
    stacks = {
        dt: torch.stack([inputs(r, dt).double() for r in range(WORLD)])
        for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64)
    }
    refs = {
        R.SUM: lambda s: s.sum(0),
        R.MAX: lambda s: s.max(0).values,
        R.MIN: lambda s: s.min(0).values,
        R.PRODUCT: lambda s: s.prod(0),
        R.AVG: lambda s: s.mean(0),
    }
    for dt, stack in stacks.items():
        for op, ref in refs.items():
            if op == R.AVG and not dt.is_floating_point:
                continue
            t = inputs(rank, dt)
            dist.all_reduce(t, op=op)
            tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.int64: 0}[dt]
            torch.testing.assert_close(t.double(), ref(stack), rtol=tol, atol=tol, msg=f"{dt} {op}")
    matrix = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous
    dist.all_reduce(matrix)
    torch.testing.assert_close(matrix, torch.arange(12.0).reshape(3, 4).t() * WORLD)
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=2)
    torch.testing.assert_close(b, torch.full((5,), 2.0))
    outs = [torch.empty(3, dtype=torch.int32) for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int32))
    assert [o.tolist() for o in outs] == [[r] * 3 for r in range(WORLD)]
    flat = torch.empty(WORLD * 2)
    dist.all_gather_single(flat, torch.tensor([rank, rank + 0.5]))
    assert flat.tolist() == [0, 0.5, 1, 1.5, 2, 2.5]
    single = torch.empty(2)
    dist.reduce_scatter_single(single, torch.arange(WORLD * 2.0) + rank, op=dist.ReduceOp.AVG)
    assert single.tolist() == [2 * rank + 1.0, 2 * rank + 2.0]  # mean over sources of (index + source)
    out = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter(out, [torch.full((2,), r + 10 * rank, dtype=torch.int64) for r in range(WORLD)])
    assert out.tolist() == [rank * WORLD + 30] * 2  # sum over ranks of (rank_index + 10 * source)
    works = [dist.all_reduce(torch.ones(100_000) * k, async_op=True) for k in range(4)]
    for w in works:
        w.wait()
    tensor_list = [torch.ones(3) * rank for _ in range(2)]
    fut = dist.all_reduce(tensor_list[0], async_op=True).get_future()
    assert fut.wait()[0].tolist() == [3.0, 3.0, 3.0]
    check_barriers()
    dist.barrier()


def check_barriers() -> None:
    """A synchronous barrier (on the caller's thread), an asynchronous one, and one behind a queued
    operation, which runs in order after it; so does a synchronous all_reduce behind a queued one."""
    dist.barrier()
    dist.barrier(async_op=True).wait()
    pending = torch.ones(1 << 16)
    work = dist.all_reduce(pending, async_op=True)
    dist.barrier()  # queued behind the all-reduce, so it ends after it
    assert work.is_completed() and pending.eq(WORLD).all().item()
    work = dist.all_reduce(pending, async_op=True)
    small = torch.ones(3, dtype=torch.int32)
    dist.all_reduce(small)  # a synchronous all-reduce behind a queued one: in order too
    assert work.is_completed() and pending.eq(WORLD * WORLD).all().item() and small.tolist() == [WORLD] * 3


def check_cuda(rank: int, out_dir: Path) -> None:
    t = torch.full((1000,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    assert t.is_cuda and t.eq(6.0).all().item()
    b = torch.full((10,), float(rank), device="cuda")
    dist.broadcast(b, src=1)
    assert b.eq(1.0).all().item()
    outs = [torch.empty(2, device="cuda") for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((2,), float(rank), device="cuda"))
    assert [o.tolist() for o in outs] == [[float(r)] * 2 for r in range(WORLD)]
    big = torch.full((1 << 18,), float(rank + 1), device="cuda")  # above the small-message path: GPU reduction
    dist.all_reduce(big, op=dist.ReduceOp.MAX)
    assert big.is_cuda and big.eq(3.0).all().item()
    got = torch.empty(3, device="cuda")
    works = [dist.isend(torch.full((3,), float(rank), device="cuda"), dst=(rank + 1) % WORLD)]
    works.append(dist.irecv(got, src=(rank - 1) % WORLD))
    for w in works:
        w.wait()
    assert got.tolist() == [float((rank - 1) % WORLD)] * 3
    a2a = [torch.empty(1, device="cuda") for _ in range(WORLD)]
    dist.all_to_all(a2a, [torch.tensor([10.0 * rank + r], device="cuda") for r in range(WORLD)])
    assert [t.item() for t in a2a] == [10.0 * r + rank for r in range(WORLD)]


def worker(rank: int, store_path: str, result_dir: str, job: str) -> None:
    import ringseed.collective.torch_backend  # noqa: F401  (registers the backend)

    status = "ok"
    try:
        dist.init_process_group("ringseed", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
        assert dist.get_backend() == "ringseed"
        {"collectives": check_collectives, "ddp": train_ddp, "cuda": check_cuda}[job](rank, Path(result_dir))  # type: ignore[operator]
        dist.destroy_process_group()
    except BaseException:
        status = traceback.format_exc()
    (Path(result_dir) / f"rank{rank}.status").write_text(status)


def spawn(job: str, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, str(tmp_path / "store"), str(tmp_path), job)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        if p.is_alive():
            p.kill()
            p.join()
    for r in range(WORLD):
        status = (tmp_path / f"rank{r}.status").read_text() if (tmp_path / f"rank{r}.status").exists() else "died"
        assert status == "ok", f"rank {r}: {status}"


def train_ddp(rank: int, out_dir: Path) -> None:
    from tests.component.collective import _ddp_model

    model = torch.nn.parallel.DistributedDataParallel(_ddp_model.make_model())
    params = _ddp_model.train(model, rank=rank, world=WORLD)
    torch.save(params, out_dir / f"params{rank}.pt")
    for hook in (None, "allreduce", "then"):  # gradient accumulation with no_sync, with and without hooks
        model = torch.nn.parallel.DistributedDataParallel(_ddp_model.make_model())
        params = _ddp_model.train_accumulating(model, rank=rank, world=WORLD, hook=hook)
        torch.save(params, out_dir / f"params-accumulated-{hook}{rank}.pt")


def test_every_collective_on_three_processes(tmp_path: Path) -> None:
    spawn("collectives", tmp_path)


def test_exiting_while_the_engine_thread_completes_a_work_is_clean() -> None:
    """An asynchronous barrier completed on the engine's thread, whose torch future's callback is
    still running when the main thread exits: the process exits 0 (the engine is closed at exit,
    before the interpreter finalizes), not "terminate called without an active exception"."""
    child = [sys.executable, "-m", "tests.component.collective._exit_race_child"]
    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.run(child, cwd=repo, capture_output=True, text=True, timeout=120, check=False)
    assert (proc.returncode, proc.stdout) == (0, "ok\n"), proc.stderr


@pytest.mark.parametrize("op", list(engine.ReduceOp), ids=lambda o: o.name)
def test_torch_reducer_path_matches_numpy(op: engine.ReduceOp) -> None:
    """The reducer used for CUDA tensors, exercised on CPU tensors (device_reduce=True)."""
    bitwise = op in ops.BITWISE
    with _engine_ring.ring(3) as peers:
        source = [
            (inputs(r, torch.int64, n=70_007) if bitwise else inputs(r, torch.float32, n=70_007)).reshape(7, 10_001)
            for r in range(3)
        ]
        for dtype in (torch.int32, torch.int64) if bitwise else (torch.float32, torch.bfloat16):
            ts = [s.to(dtype).clone() for s in source]  # the sources stay as they were, for the reference
            staged = [tensors.stage(t, device_reduce=True) for t in ts]
            _engine_ring.each(
                peers,
                lambda e, st=staged: e.all_reduce(
                    st[e.rank].array, op=op, tag=1, bfloat16=st[e.rank].bfloat16, reducer=st[e.rank].reducer
                ),
            )
            for s in staged:
                s.finish()
            for t in ts:
                assert torch.equal(t, ts[0])
            if bitwise:
                fold = {
                    engine.ReduceOp.BAND: torch.bitwise_and,
                    engine.ReduceOp.BOR: torch.bitwise_or,
                    engine.ReduceOp.BXOR: torch.bitwise_xor,
                }[op]
                src = [s.to(dtype) for s in source]
                assert torch.equal(ts[0], fold(fold(src[0], src[1]), src[2]))
                continue
            stack = torch.stack([s.to(dtype).double() for s in source])
            ref = {
                engine.ReduceOp.SUM: stack.sum(0),
                engine.ReduceOp.AVG: stack.mean(0),
                engine.ReduceOp.MIN: stack.min(0).values,
                engine.ReduceOp.MAX: stack.max(0).values,
                engine.ReduceOp.PROD: stack.prod(0),
            }[op]
            tol = 1e-5 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(ts[0].double(), ref, rtol=tol, atol=tol)


def test_plain_cpu_tensors_are_used_in_place_and_others_take_the_general_path() -> None:
    """The synchronous all_reduce's short path takes a contiguous dense CPU tensor of a numpy dtype
    as a view of its own memory; everything else (bfloat16, complex, strided, sparse) is None."""
    from ringseed.collective import torch_backend

    grad = torch.arange(6.0, requires_grad=True).reshape(2, 3)
    for tensor in (torch.zeros(5), torch.zeros((2, 3), dtype=torch.int64), torch.zeros(()), grad, torch.zeros(0)):
        view = torch_backend._plain_cpu(tensor)
        assert view is not None and view.ndim == 1 and view.flags.c_contiguous and view.flags.writeable
        assert view.size == tensor.numel() and (not view.size or view.ctypes.data == tensor.data_ptr())
    for other in (
        torch.zeros(4, dtype=torch.bfloat16),
        torch.zeros(4, dtype=torch.complex64),
        torch.zeros(4, dtype=torch.bool),
        torch.zeros((3, 4)).t(),
        torch.zeros(4).to_sparse(),
    ):
        assert torch_backend._plain_cpu(other) is None
