"""All-reduce correctness on real loopback rings: every op and dtype, awkward sizes, N = 2..5, 64 MiB.

References are computed with plain numpy over the stacked inputs, never through ringseed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
from collections.abc import Iterator

import numpy as np
import pytest

from ringseed.collective import engine, small
from tests.component.collective import _engine_ring

Op = engine.ReduceOp
DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64"]
EPS = {"float32": 2.0**-23, "float64": 2.0**-52, "float16": 2.0**-10, "bfloat16": 2.0**-7}
_tags = itertools.count(1)


@pytest.fixture(scope="module", params=[2, 3, 4, 5], ids=lambda n: f"N{n}")
def peers(request: pytest.FixtureRequest) -> Iterator[list[engine.RingEngine]]:
    with _engine_ring.ring(request.param) as engines:
        yield engines


def make_inputs(dtype: str, *, n: int, length: int, op: Op, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype in ("float32", "float64", "float16"):
        low, high = (0.5, 1.5) if op is Op.PROD else (-4.0, 4.0)
        return [rng.uniform(low, high, length).astype(dtype) for _ in range(n)]
    if dtype == "bfloat16":  # truncate float32 bit patterns to their high half
        low, high = (0.5, 1.5) if op is Op.PROD else (-4.0, 4.0)
        return [
            (rng.uniform(low, high, length).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            for _ in range(n)
        ]
    info = np.iinfo(dtype)
    return [rng.integers(info.min, info.max, length, dtype=dtype, endpoint=True) for _ in range(n)]


def as_float(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def check(results: list[np.ndarray], inputs: list[np.ndarray], *, dtype: str, op: Op) -> None:
    for r in results[1:]:
        assert r.tobytes() == results[0].tobytes(), "peers differ"
    got = results[0]
    if dtype not in EPS:  # integers: exact, wrapping like torch
        stack = np.stack(inputs)
        ref = {
            Op.SUM: lambda: stack.sum(axis=0, dtype=dtype),
            Op.PROD: lambda: stack.prod(axis=0, dtype=dtype),
            Op.MIN: lambda: stack.min(axis=0),
            Op.MAX: lambda: stack.max(axis=0),
            Op.BAND: lambda: np.bitwise_and.reduce(stack, axis=0),
            Op.BOR: lambda: np.bitwise_or.reduce(stack, axis=0),
            Op.BXOR: lambda: np.bitwise_xor.reduce(stack, axis=0),
        }[op]()
        np.testing.assert_array_equal(got, ref)
        return
    stack = np.stack([as_float(a, dtype) for a in inputs])
    n = len(inputs)
    if op in (Op.MIN, Op.MAX):
        np.testing.assert_array_equal(as_float(got, dtype), stack.min(0) if op is Op.MIN else stack.max(0))
        return
    if op is Op.PROD:
        ref = stack.prod(axis=0)
        tol = (n + 1) * EPS[dtype] * np.abs(ref)
    else:
        ref = stack.sum(axis=0) / (n if op is Op.AVG else 1)
        tol = (n + 1) * EPS[dtype] * np.abs(stack).sum(axis=0) / (n if op is Op.AVG else 1)
    err = np.abs(as_float(got, dtype) - ref)
    assert (err <= tol + 1e-300).all(), f"max error {err.max()} over tolerance"


def run_all_reduce(peers: list[engine.RingEngine], inputs: list[np.ndarray], *, dtype: str, op: Op) -> list[np.ndarray]:
    arrays = [a.copy() for a in inputs]
    tag = next(_tags)
    bf16 = dtype == "bfloat16"
    _engine_ring.each(peers, lambda e: e.all_reduce(arrays[e.rank], op=op, tag=tag, bfloat16=bf16))
    return arrays


# AVG is for floating dtypes only, BAND/BOR/BXOR for integers (the rest is refused before sending)
BITWISE = (Op.BAND, Op.BOR, Op.BXOR)
CASES = [
    (op, dtype)
    for op in Op
    for dtype in DTYPES
    if (op is not Op.AVG or dtype in EPS) and (op not in BITWISE or dtype not in EPS)
]


@pytest.mark.parametrize(("op", "dtype"), CASES, ids=[f"{o.name}-{d}" for o, d in CASES])
def test_all_reduce_every_op_dtype_and_awkward_size(peers: list[engine.RingEngine], op: Op, dtype: str) -> None:
    n = len(peers)
    assert 10007 * 8 <= small.SMALL_BYTES < 131101  # for every dtype, one length on each path
    for length in (1, n - 1, 10007, 131101):  # one element, fewer than peers, primes on both sides of SMALL_BYTES
        inputs = make_inputs(dtype, n=n, length=length, op=op, seed=length * 31 + n)
        check(run_all_reduce(peers, inputs, dtype=dtype, op=op), inputs, dtype=dtype, op=op)


def test_all_reduce_64_mib_float32(peers: list[engine.RingEngine]) -> None:
    n = len(peers)
    inputs = make_inputs("float32", n=n, length=(64 << 20) // 4, op=Op.SUM, seed=n)
    check(run_all_reduce(peers, inputs, dtype="float32", op=Op.SUM), inputs, dtype="float32", op=Op.SUM)


def test_integer_avg_and_floating_bitwise_ops_are_refused_before_sending(peers: list[engine.RingEngine]) -> None:
    with pytest.raises(ValueError, match="AVG"):
        peers[0].all_reduce(np.zeros(4, np.int32), op=Op.AVG, tag=next(_tags))
    with pytest.raises(ValueError, match="BXOR is defined for integer dtypes only"):
        peers[0].all_reduce(np.zeros(4, np.float32), op=Op.BXOR, tag=next(_tags))
    inputs = make_inputs("float32", n=len(peers), length=100, op=Op.SUM, seed=9)  # the ring still works
    check(run_all_reduce(peers, inputs, dtype="float32", op=Op.SUM), inputs, dtype="float32", op=Op.SUM)


def test_empty_array_and_single_peer_are_no_ops() -> None:
    with _engine_ring.ring(1) as (solo,):
        a = np.arange(5, dtype=np.float32)
        solo.all_reduce(a, op=Op.AVG, tag=1)
        np.testing.assert_array_equal(a, np.arange(5, dtype=np.float32))
    with _engine_ring.ring(2) as pair:
        empties = [np.zeros(0, np.float32) for _ in pair]
        _engine_ring.each(pair, lambda e: e.all_reduce(empties[e.rank], op=Op.SUM, tag=1))


@contextlib.contextmanager
def descriptors_above(floor: int) -> Iterator[None]:
    """Hold open descriptors up to ``floor``, so the next sockets get numbers above it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = floor + 256
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the open-files hard limit ({hard}) is below {want}")
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < floor:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ring_and_small_paths_work_on_descriptors_above_fd_setsize() -> None:
    """select() cannot watch a descriptor >= FD_SETSIZE (1024), and a training process with many
    files and sockets open gets its ring links there: both paths wait with poll()."""
    with descriptors_above(1100), _engine_ring.ring(2) as peers:
        assert min(s.fileno() for p in peers for s in p._outs + p._ins) > 1024
        for count in (16, (1 << 20) // 4):  # the small path, then the ring
            arrays = [np.full(count, e.rank + 1.0, np.float32) for e in peers]
            _engine_ring.each(
                peers, lambda e, a=arrays, t=count: e.all_reduce(a[e.rank], op=engine.ReduceOp.SUM, tag=t)
            )
            for a in arrays:
                np.testing.assert_array_equal(a, np.full(count, 3.0, np.float32))
