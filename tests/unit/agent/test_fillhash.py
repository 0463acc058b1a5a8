"""An origin pull's SHA-256 follows the fill: the same digest as one pass over the whole chunk."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringseed.agent import stream

MiB = 1 << 20


async def _fill(data: bytes, cuts: list[int]) -> str:
    buffer = bytearray(len(data))
    hashed = stream.FillHash(buffer)
    done = 0
    for cut in [*sorted(cuts), len(data)]:
        buffer[done:cut] = data[done:cut]
        hashed.advance(cut)
        done = max(done, cut)
        await asyncio.sleep(0)  # jobs run while the next piece lands
    return await hashed.digest()


@settings(max_examples=30, deadline=None)
@given(size=st.integers(0, 5 * MiB), fractions=st.lists(st.floats(0, 1), max_size=12))
def test_digest_equals_one_pass_for_any_fill_order(size: int, fractions: list[float]) -> None:
    data = os.urandom(size)
    cuts = [int(f * size) for f in fractions]  # repeats and pieces below HASH_STEP included
    assert asyncio.run(_fill(data, cuts)) == hashlib.sha256(data).hexdigest()


async def test_digest_of_a_buffer_not_filled_yet_is_refused() -> None:
    hashed = stream.FillHash(bytearray(3 * MiB))
    hashed.advance(2 * MiB)
    with pytest.raises(ValueError, match="2097152 of 3145728"):
        await hashed.digest()


async def test_a_cancelled_caller_leaves_the_digest_to_the_next() -> None:
    data = os.urandom(16 * MiB)
    inflight = stream.Inflight(0, bytearray(data))
    inflight.advance(len(data))
    waiter = asyncio.ensure_future(inflight.digest())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await inflight.digest() == hashlib.sha256(data).hexdigest()
