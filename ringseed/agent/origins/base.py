"""What every origin shares: the error types, the Origin seam, retry backoff and the rate limit.

Rules:
- :class:`OriginError` is permanent: retrying will not help (missing file, 4xx, a path that
  leaves the root). Its message names the URI and the problem.
- :class:`TransientError` is retried by the adapter with exponential backoff and jitter
  (:class:`RetryPolicy`); callers never see it, only an :class:`OriginError` once the retries
  are spent.
- :class:`RateLimiter` is a token bucket in bytes per second. One limiter belongs to one
  origin object, so all concurrent reads of that origin share its budget. It starts empty:
  a transfer of ``n`` bytes takes at least ``n / rate`` seconds.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class OriginError(Exception):
    """A permanent failure to read from an origin; names the URI and the problem."""


class TransientError(Exception):
    """A failure worth retrying (5xx, 429, reset, timeout, truncated body)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@runtime_checkable
class Origin(Protocol):
    """A source of model files: list them, read byte ranges with retries and resume."""

    uri: str
    bytes_read: int  # bytes actually pulled from outside (retries included)

    async def list_files(self) -> list[tuple[str, int, int]]:
        """``(relative path, size, mode)`` of every file, in any order."""
        ...

    async def read(self, path: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of ``path`` from ``offset``, or :class:`OriginError`."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class ReadsInto(Protocol):
    """An origin that can read straight into a caller's buffer (saves a copy per piece)."""

    async def read_into(
        self, path: str, offset: int, view: memoryview, progress: Callable[[int], None] | None = None
    ) -> None:
        """Fill ``view`` with ``len(view)`` bytes of ``path`` from ``offset``, or OriginError.

        ``progress(done)``, if given, is called as bytes land: ``view[:done]`` is filled.
        """
        ...


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait between attempts: ``base * 2**(n-1)``, capped, jittered."""

    retries: int = 8
    base_delay: float = 0.2
    max_delay: float = 10.0

    def delay(self, attempt: int, *, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        backoff = min(self.max_delay, self.base_delay * float(2 ** (attempt - 1)))
        jittered: float = backoff * random.uniform(0.5, 1.0)
        if retry_after is not None:
            jittered = max(jittered, min(retry_after, self.max_delay))
        return jittered


class RateLimiter:
    """Token bucket in bytes/s shared by all reads of one origin; ``None`` rate means unlimited."""

    def __init__(self, rate: float | None, *, burst_seconds: float = 0.25) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate limit must be positive bytes/s, got {rate!r}")
        self.rate = rate
        self._capacity = (rate or 0.0) * burst_seconds
        self._tokens = 0.0
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self, n: int) -> None:
        """Take ``n`` bytes of budget, waiting (in turn with other readers) until it is there."""
        if self.rate is None or n <= 0:
            return
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self._capacity, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self.rate)
