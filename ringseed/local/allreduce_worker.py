"""One peer process of ``ringseed local allreduce`` (started by ``allreduce.py``, not by users).

Owns the peer side of the local run: deterministic data seeded by the peer's index, the
all-reduce through :class:`~ringseed.collective.communicator.Communicator` with retry, and a
check against a reference computed independently (numpy, float64 accumulation over every
member's regenerated data, block by block so memory stays bounded).

Output protocol on stdout: the line ``READY`` after the warm-up operation, then one JSON object
with the measurements. Logs go to stderr. With ``--die-mid-op`` the peer instead starts one
all-reduce and, the moment it combines its first received segment (so the operation is
provably in flight on every peer), prints ``KILLED <unix time>`` and SIGKILLs itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from ringseed.collective import ops

BLOCK = 1 << 20
FLOAT_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
BF16 = "bfloat16"  # numpy has none: held as uint16 bit patterns (``ops.f32_to_bf16``)


def storage(dtype: str) -> np.dtype[Any]:
    """The numpy dtype that holds ``dtype`` elements."""
    return np.dtype(np.uint16 if dtype == BF16 else dtype)


def values(array: np.ndarray, dtype: str) -> np.ndarray:
    """The elements of ``array`` (storage of ``dtype``) as numbers numpy can compute with."""
    return ops.bf16_to_f32(array) if dtype == BF16 else array


def generate(*, index: int, count: int, dtype: str, op: str, seed: int = 20240607) -> np.ndarray:
    """Peer ``index``'s input: the same bytes for the same arguments, on any machine."""
    out = np.empty(count, dtype=np.float32 if dtype == BF16 else dtype)
    for start in range(0, count, BLOCK):
        rng = np.random.default_rng([seed, index, start // BLOCK])
        n = min(BLOCK, count - start)
        if np.issubdtype(out.dtype, np.integer):
            out[start : start + n] = rng.integers(1, 4, n) if op == "prod" else rng.integers(-100, 100, n)
        else:
            out[start : start + n] = rng.uniform(0.5, 1.5, n) if op == "prod" else rng.uniform(-1.0, 1.0, n)
    return ops.f32_to_bf16(out) if dtype == BF16 else out


def reference_error(result: np.ndarray, *, members: list[int], dtype: str, op: str) -> float:
    """Max |result - reference| where the reference reduces every member's data in float64."""
    worst = 0.0
    inputs = [values(generate(index=m, count=len(result), dtype=dtype, op=op), dtype) for m in members]
    result = values(result, dtype)
    for start in range(0, len(result), BLOCK):
        blocks = [a[start : start + BLOCK] for a in inputs]
        if np.issubdtype(result.dtype, np.integer):
            ref = _reduce_int(blocks, op=op, dtype=dtype)
            got = result[start : start + BLOCK].astype(np.int64)
        else:
            ref = _reduce_float(blocks, op=op)
            got = result[start : start + BLOCK].astype(np.float64)
        if len(ref):
            worst = max(worst, float(np.max(np.abs(got - ref))))
    return worst


def _reduce_float(blocks: list[np.ndarray], *, op: str) -> np.ndarray:
    stack = np.stack([b.astype(np.float64) for b in blocks])
    if op == "avg":
        return np.asarray(np.mean(stack, axis=0))
    return _reduce_int(list(stack), op=op, dtype="float64")


def _reduce_int(blocks: list[np.ndarray], *, op: str, dtype: str) -> np.ndarray:
    stack = np.stack(blocks)
    if op == "sum":
        reduced = np.sum(stack, axis=0, dtype=stack.dtype)
    elif op == "prod":
        reduced = np.prod(stack, axis=0, dtype=stack.dtype)
    else:
        reduced = np.min(stack, axis=0) if op == "min" else np.max(stack, axis=0)
    target = np.float64 if dtype == "float64" else np.int64
    return np.asarray(reduced).astype(dtype).astype(target)


def tolerance(*, dtype: str, world: int, quantize: str | None) -> float:
    """A bound on the error of a ring reduction of ``world`` inputs in [-1, 1]."""
    if dtype not in FLOAT_EPS:
        return 0.0
    if quantize == "int8":
        return 2.0 * world * world / 127
    if quantize in ("fp16", "bf16"):
        return 4.0 * world * world * (2.0**-7 if quantize == "bf16" else 2.0**-10)
    return 4.0 * world * world * FLOAT_EPS[dtype]


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    from ringseed.collective import communicator, retry

    args = _parser().parse_args(argv)
    with open(args.token_file, encoding="utf-8") as f:
        token = f.read().strip()
    comm = communicator.Communicator(coordinator_url=args.coordinator, token=token, peer_id=f"peer-{args.index}")
    try:
        comm.connect(timeout=120)
        data = generate(index=args.index, count=args.count, dtype=args.dtype, op=args.op)
        work = data.copy()
        op = ops.ReduceOp(args.op)
        bf16 = args.dtype == BF16
        comm.all_reduce(np.zeros(16, dtype=storage(args.dtype)), op=ops.ReduceOp.MAX, bfloat16=bf16).wait()  # ring up
        _emit("READY")
        if args.die_mid_op:
            return _die_mid_op(comm, work, op, args)
        report: dict[str, Any] = {}
        if args.until_shrunk:
            report = _run_kill(comm, data, work, op, args, retry)
            report["retry_max_abs_error"] = reference_error(work, members=_members(comm), dtype=args.dtype, op=args.op)
        report.update(_run_timed(comm, data, work, op, args))
        members = _members(comm)
        report["max_abs_error"] = reference_error(work, members=members, dtype=args.dtype, op=args.op)
        report["tolerance"] = tolerance(dtype=args.dtype, world=len(members), quantize=args.quantize)
        report.update(peer_id=comm.peer_id, world_size=comm.world_size, members=members)
        _emit(json.dumps(report))
        return 0
    finally:
        comm.close()


class _SigkillOnFirstCombine:
    """A reducer that kills its own process with SIGKILL on its first combine: the death lands
    inside an operation whatever the machine's load (a timer can land between two operations)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def combine(self, *, start: int, stop: int, src: np.ndarray, op: Any) -> None:
        _emit(f"KILLED {time.time()}")
        os.kill(os.getpid(), signal.SIGKILL)

    def divide(self, *, start: int, stop: int, divisor: int) -> None:
        raise AssertionError("unreachable: the process died at its first combine")


def _die_mid_op(comm: Any, work: np.ndarray, op: Any, args: argparse.Namespace) -> int:
    dying = _SigkillOnFirstCombine(work)
    comm.all_reduce(work, op=op, quantize=args.quantize, bfloat16=args.dtype == BF16, reducer=dying).wait()
    print("--die-mid-op: the all-reduce completed without combining a segment (a buffer too small for the ring?)")
    return 1


def _members(comm: Any) -> list[int]:
    return [int(p.rsplit("-", 1)[1]) for p in comm.ring]


def _run_timed(comm: Any, data: np.ndarray, work: np.ndarray, op: Any, args: argparse.Namespace) -> dict[str, Any]:
    times = []
    for _ in range(args.iters):
        np.copyto(work, data)
        start = time.perf_counter()
        comm.all_reduce(work, op=op, quantize=args.quantize, bfloat16=args.dtype == BF16).wait()
        times.append(time.perf_counter() - start)
    return {"times": times}


def _run_kill(
    comm: Any, data: np.ndarray, work: np.ndarray, op: Any, args: argparse.Namespace, retry: Any
) -> dict[str, Any]:
    aborts: list[float] = []
    restored: list[bool] = []

    def on_abort(exc: Exception) -> None:
        aborts.append(time.time())
        restored.append(work.view(np.uint8).tobytes() == data.view(np.uint8).tobytes())

    deadline = time.monotonic() + args.max_seconds
    world = comm.world_size
    while time.monotonic() < deadline:
        np.copyto(work, data)
        world = retry.all_reduce_with_retry(
            comm, work, op=op, quantize=args.quantize, bfloat16=args.dtype == BF16, max_attempts=20, on_abort=on_abort
        )
        if world < args.until_shrunk:
            return {"done_at": time.time(), "abort_times": aborts, "restored": restored}
    raise TimeoutError(f"the group did not shrink below {args.until_shrunk} peers in {args.max_seconds} s")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringseed-allreduce-worker")
    p.add_argument("--coordinator", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum")
    p.add_argument("--quantize", default=None)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--until-shrunk", type=int, default=0, help="loop until the world is smaller than this")
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--die-mid-op", action="store_true", help="SIGKILL this peer inside its first all-reduce")
    return p


if __name__ == "__main__":
    import logging

    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sys.exit(main())
