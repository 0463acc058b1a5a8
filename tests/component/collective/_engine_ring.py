"""Test helper: N real RingEngines on loopback in one process, each op run on its own thread."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from ringseed.collective import engine

T = TypeVar("T")
TOKEN = "test-token"


@contextlib.contextmanager
def ring(n: int, *, channels: int = 1, io_timeout: float = 20.0, epoch: int = 1) -> Iterator[list[engine.RingEngine]]:
    engines = [
        engine.RingEngine(peer_id=f"p{i}", token=TOKEN, connections_per_peer=channels, io_timeout=io_timeout)
        for i in range(n)
    ]
    try:
        addresses = [e.start() for e in engines]
        each(engines, lambda e: e.set_ring(addresses, epoch=epoch, timeout=20))
        yield engines
    finally:
        for e in engines:
            e.close()


def each(engines: Sequence[engine.RingEngine], fn: Callable[[engine.RingEngine], T]) -> list[T]:
    """Run fn on every engine concurrently (as separate processes would); re-raise the first error."""
    with concurrent.futures.ThreadPoolExecutor(len(engines)) as pool:
        return list(pool.map(fn, engines))


def outcomes(engines: Sequence[engine.RingEngine], fn: Callable[[engine.RingEngine], T]) -> list[T | BaseException]:
    """Like each, but returns exceptions instead of raising them."""
    with concurrent.futures.ThreadPoolExecutor(len(engines)) as pool:
        futures = [pool.submit(fn, e) for e in engines]
        return [f.exception() or f.result() for f in futures]  # type: ignore[misc]


def wait_started(*futures: concurrent.futures.Future[None], timeout: float = 10.0) -> None:
    """Return once every operation has started running on its engine (or already ended)."""
    deadline = time.monotonic() + timeout
    while not all(f.running() or f.done() for f in futures):
        if time.monotonic() > deadline:
            raise TimeoutError(f"operations not started within {timeout} s")
        time.sleep(0.005)
