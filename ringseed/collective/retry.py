"""Retrying a collective with the survivors after an abort.

Owns the retry loop. Contract (see ``communicator.py``): when an operation is aborted the
caller's buffer already holds its value from before the call, bit for bit, so retrying is
simply calling again; the next attempt waits in the coordinator's vote until every peer still
alive has voted, so a dead peer is left out as soon as the failure detector removes it, and
the ring is rebuilt (new epoch) before any byte moves. A removed peer
(:class:`communicator.PeerRemoved`) is never retried: it must join again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from ringseed.collective import communicator, engine, ops

T = TypeVar("T")


def with_retry(
    attempt: Callable[[], T],
    *,
    max_attempts: int = 5,
    on_abort: Callable[[engine.CollectiveAborted], None] | None = None,
) -> T:
    """Run ``attempt`` until it does not raise ``CollectiveAborted`` (at most ``max_attempts``)."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    for number in range(1, max_attempts + 1):
        try:
            return attempt()
        except communicator.PeerRemoved:
            raise
        except engine.CollectiveAborted as exc:
            if on_abort is not None:
                on_abort(exc)
            if number == max_attempts:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def all_reduce_with_retry(
    comm: communicator.Communicator,
    array: np.ndarray,
    *,
    op: ops.ReduceOp = ops.ReduceOp.SUM,
    quantize: str | None = None,
    bfloat16: bool = False,
    max_attempts: int = 5,
    on_abort: Callable[[engine.CollectiveAborted], None] | None = None,
) -> int:
    """All-reduce ``array`` in place, retrying with the survivors; returns the world size it ran with.
    ``bfloat16``: ``array`` is uint16 storage of bfloat16 values (numpy has no bfloat16)."""

    def attempt() -> int:
        comm.all_reduce(array, op=op, quantize=quantize, bfloat16=bfloat16).wait()
        world: int = comm.world_size
        return world

    return with_retry(attempt, max_attempts=max_attempts, on_abort=on_abort)
