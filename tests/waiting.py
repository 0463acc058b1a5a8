"""Waiting on a condition in tests: poll a check until it holds, fail naming what never happened.

Tests wait on conditions and assert on state (never a sleep to prove something did or did not
happen): these two are the project's one way to do it, sync and async.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

TRANSIENT = (KeyError, ValueError, AssertionError)  # a check may fail like this while the state settles


def wait_for(check: Callable[[], Any], *, within: float = 10.0, what: str = "condition", every: float = 0.02) -> Any:
    """Call ``check`` until it returns something truthy and return that; ``AssertionError`` naming
    ``what`` (and the last value) after ``within`` seconds. A check raising one of ``TRANSIENT`` counts
    as not yet."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except TRANSIENT as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}; last: {last!r}")
        time.sleep(every)


async def eventually(
    check: Callable[[], Any], *, within: float = 15.0, what: str = "condition", every: float = 0.05
) -> Any:
    """:func:`wait_for` on an event loop: ``check`` may be sync or async; the loop runs between calls."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            last = check()
            if isinstance(last, Awaitable):
                last = await last
            if last:
                return last
        except TRANSIENT as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}; last: {last!r}")
        await asyncio.sleep(every)
