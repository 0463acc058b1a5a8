"""Bounded retries with exponential back-off: the one formula, and per-key state for loops.

Pure: time is the ``now`` argument, randomness a ``random.Random`` argument.

Rules:
- Attempt ``n`` (1-based) waits ``base * 2**(n-1)`` seconds, capped at ``cap``, times a jitter
  in ``[0.5, 1.0]`` so that many nodes retrying the same thing spread out. A server's
  ``Retry-After`` raises the wait (never above ``cap``).
- :class:`Backoff` keeps, per key (a chunk index, a peer), the number of consecutive failures
  and the time before which the key is not tried again. A success forgets the key; ``reset``
  makes it ready at once without forgetting the count (a copy appeared: try now, but a key that
  keeps failing still backs off afterwards).
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


def delay(attempt: int, *, base: float, cap: float, rng: random.Random, retry_after: float | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based)."""
    wait = min(cap, base * float(2 ** min(max(attempt, 1) - 1, 62))) * rng.uniform(0.5, 1.0)
    if retry_after is not None:
        wait = max(wait, min(retry_after, cap))
    return wait


class Backoff(Generic[K]):
    """Consecutive failures and the next allowed attempt, per key."""

    def __init__(self, *, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.rng = rng or random.Random()
        self._failures: dict[K, int] = {}
        self._until: dict[K, float] = {}

    def failed(self, key: K, *, now: float, retry_after: float | None = None) -> float:
        """Record a failure of ``key``; returns the seconds until it may be tried again."""
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        wait = delay(count, base=self.base, cap=self.cap, rng=self.rng, retry_after=retry_after)
        self._until[key] = now + wait
        return wait

    def succeeded(self, key: K) -> None:
        self._failures.pop(key, None)
        self._until.pop(key, None)

    def reset(self, key: K) -> None:
        """Ready now (keeps the failure count)."""
        self._until.pop(key, None)

    def ready(self, key: K, *, now: float) -> bool:
        return self._until.get(key, 0.0) <= now

    def until(self, key: K) -> float:
        """When ``key`` may be tried again (0.0: now)."""
        return self._until.get(key, 0.0)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def __len__(self) -> int:
        """Keys with failures on record."""
        return len(self._failures)

    def clear(self) -> None:
        self._failures.clear()
        self._until.clear()
