"""Any exception inside an operation (a reducer raising, as a CUDA reduction can) aborts it on
every peer at once: not at the I/O timeout, with the caller's buffer restored bit for bit by the
Communicator, and close() returning promptly."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import numpy as np
import pytest

from ringseed.collective import communicator, engine, ops, runner
from tests.component.collective import _engine_ring
from tests.component.collective import coordinator_helpers as h

IO_TIMEOUT = 120.0  # every wait below is far shorter: only the abort path can end the ops in time
PROMPT = 20.0


class InjectedFault(RuntimeError):
    pass


@dataclasses.dataclass
class RaisingReducer:
    """The numpy reducer, except that call number ``fail_at`` of ``where`` raises."""

    inner: runner.Reducer
    where: str
    fail_at: int
    calls: int = 0

    def _tick(self, method: str) -> None:
        if method == self.where:
            self.calls += 1
            if self.calls == self.fail_at:
                raise InjectedFault(f"injected {method} failure")

    def combine(self, *, start: int, stop: int, src: np.ndarray, op: ops.ReduceOp) -> None:
        self._tick("combine")
        self.inner.combine(start=start, stop=stop, src=src, op=op)

    def divide(self, *, start: int, stop: int, divisor: int) -> None:
        self._tick("divide")
        self.inner.divide(start=start, stop=stop, divisor=divisor)


FAULTS = [("combine", 1), ("combine", 3), ("divide", 1)]


def close_all_promptly(engines: list[engine.RingEngine]) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(engines)) as pool:
        closing = [pool.submit(e.close) for e in engines]
        _, stuck = concurrent.futures.wait(closing, timeout=PROMPT)
        assert not stuck, "close() blocked"


@pytest.mark.parametrize(("where", "fail_at"), FAULTS, ids=[f"{w}-{n}" for w, n in FAULTS])
def test_a_raising_reducer_aborts_every_engine_at_once(where: str, fail_at: int) -> None:
    length = 3 * 300_000  # several segments per chunk, so a late failure lands mid-operation
    with _engine_ring.ring(3, io_timeout=IO_TIMEOUT) as peers:
        arrays = [np.random.default_rng(r).standard_normal(length).astype(np.float32) for r in range(3)]
        reducer = RaisingReducer(runner.NumpyReducer(arrays[1], ops.wire_dtype(arrays[1])), where, fail_at)
        futures = [
            e.all_reduce_async(arrays[e.rank], op=engine.ReduceOp.AVG, tag=1, reducer=reducer if e.rank == 1 else None)
            for e in peers
        ]
        _, pending = concurrent.futures.wait(futures, timeout=PROMPT)
        assert not pending, "a peer waited for the I/O timeout instead of aborting"
        for f in futures:
            assert isinstance(f.exception(), engine.CollectiveAborted)
        faulty = futures[1].exception()
        assert isinstance(faulty.__cause__, InjectedFault) and "InjectedFault" in str(faulty)
        close_all_promptly(peers)


def test_close_does_not_block_on_an_operation_whose_peer_never_comes() -> None:
    with _engine_ring.ring(2, io_timeout=IO_TIMEOUT) as peers:
        future = peers[0].all_reduce_async(np.ones(1000, np.float32), op=engine.ReduceOp.SUM, tag=1)
        close_all_promptly(peers[:1])
        with pytest.raises(engine.CollectiveAborted, match="engine closed"):
            future.result(timeout=PROMPT)


def test_communicator_restores_every_buffer_bit_for_bit_when_one_reducer_raises() -> None:
    n, length = 3, 1 << 20
    with h.running_coordinator(min_peers=n) as url:
        comms = [
            communicator.Communicator(coordinator_url=url, token=h.TOKEN, peer_id=f"p{i}", io_timeout=IO_TIMEOUT)
            for i in range(n)
        ]
        try:
            h.on_each(comms, lambda i, c: c.connect(timeout=30))
            rng = np.random.default_rng(7)
            bits = [rng.integers(0, 2**32, length, dtype=np.uint32) for _ in range(n)]
            bits[0][:3] = [0x7FC00001, 0xFF800000, 0x80000000]  # a NaN payload, -inf, -0.0 survive the restore
            arrays = [b.copy().view(np.float32) for b in bits]
            reducer = RaisingReducer(runner.NumpyReducer(arrays[1], ops.wire_dtype(arrays[1])), "combine", 2)
            works = [c.all_reduce(arrays[i], reducer=reducer if i == 1 else None) for i, c in enumerate(comms)]
            for w in works:
                with pytest.raises(engine.CollectiveAborted):
                    w.wait(timeout=PROMPT)
            for a, b in zip(arrays, bits, strict=True):
                np.testing.assert_array_equal(a.view(np.uint32), b)
            # the fault is gone: the same group computes again
            finite = [np.full(length, i + 1.0, np.float32) for i in range(n)]
            h.on_each(comms, lambda i, c: c.all_reduce(finite[i]).wait(timeout=60))
            for f in finite:
                np.testing.assert_array_equal(f, np.full(length, 6.0, np.float32))
        finally:
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                closing = [pool.submit(c.close) for c in comms]
                _, stuck = concurrent.futures.wait(closing, timeout=PROMPT)
                assert not stuck, "Communicator.close() blocked"


def test_communicator_close_ends_an_operation_waiting_for_a_peer_that_never_votes() -> None:
    """p1 never calls the collective: p0's call waits in the begin vote. close() returns at once,
    the call raises CollectiveAborted and the buffer is as before the call."""
    with h.running_coordinator(min_peers=2) as url:
        comms = [
            communicator.Communicator(coordinator_url=url, token=h.TOKEN, peer_id=f"p{i}", io_timeout=IO_TIMEOUT)
            for i in range(2)
        ]
        try:
            h.on_each(comms, lambda i, c: c.connect(timeout=30))
            array = np.arange(1000, dtype=np.float32)
            work = comms[0].all_reduce(array)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                _, stuck = concurrent.futures.wait([pool.submit(comms[0].close)], timeout=PROMPT)
                assert not stuck, "Communicator.close() blocked"
            with pytest.raises(engine.CollectiveAborted, match="close"):
                work.wait(timeout=PROMPT)
            np.testing.assert_array_equal(array, np.arange(1000, dtype=np.float32))
        finally:
            comms[1].close()
