"""What every origin shares: the error types, the Origin seam, retry backoff and the rate limit.

Rules:
- :class:`OriginError` is permanent: retrying will not help (missing file, 4xx, a path that
  leaves the root). Its message names the URI and the problem.
- :class:`SourceChanged` (an OriginError) means a file no longer is the object that was listed
  (``pin``): its size or identity changed (HTTP 412 on ``If-Match``, another ETag, another
  ``mtime``/inode). Bytes read across such a change are never returned: the caller moves to a
  new revision (``ringseed.protocol.revision``).
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ringseed.protocol import backoff

_RNG = random.Random()


class OriginError(Exception):
    """A permanent failure to read from an origin; names the URI and the problem."""


class SourceChanged(OriginError):
    """A file of the source is no longer the object the pinned revision listed."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


Pin = tuple[int, str]  # (size, tag) of one file as listed; tag "" when the source gives none
Listing = list[tuple[str, int, int, str]]  # (relative path, size, mode, tag)


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

    async def listing(self) -> Listing:
        """``(relative path, size, mode, tag)`` of every file: what a revision pins."""
        ...

    def pin(self, pins: Mapping[str, Pin]) -> None:
        """From now on every read of a pinned path checks its size and tag (:class:`SourceChanged`)."""
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
        """Seconds to wait before retry number ``attempt`` (1-based); see :func:`backoff.delay`."""
        return backoff.delay(attempt, base=self.base_delay, cap=self.max_delay, rng=_RNG, retry_after=retry_after)


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
