"""A chunk still arriving from the origin, readable while it fills (cut-through to peers).

The agent on origin duty pulls a chunk into one buffer; peers that ask for it with
``?stream=1`` get its bytes as they land instead of waiting for the whole chunk (and its
hash) first. On a slow origin link this takes the last chunk's spread inside the cluster off
the critical path: when the pull ends, the streaming peers end with it.

Rules:
- ``buffer[:filled]`` is final: it holds origin bytes and never changes. ``filled`` only grows.
- The stream is not verified: the hash is known (or, without a manifest, defined) only when
  the pull ends. A receiver keeps a streamed chunk to itself until its SHA-256 matches the
  tracker's hash, exactly as for a chunk from a verified holder; only then is it stored,
  announced or served. Only the origin-duty agent streams (one hop): a node never relays bytes
  it has not verified.
- A pull that fails ends every stream of it early (short body: the receiver drops it).
- The pull's own SHA-256 follows the fill on a worker thread (:meth:`Inflight.digest`): each
  final prefix is hashed while it is still in the CPU's caches and while the rest arrives, not
  in a second pass over the whole chunk once it has landed. The buffer stays referenced by that
  thread until the hash is done (``buffers``: it is not reused early).
- Streams use the uplink while the pull still arrives, so a new stream is admitted only while
  every running stream keeps up with the fill (:meth:`Inflight.keeping_up`, within
  ``STREAM_LAG``): a stream still catching up on the prefix, or one slowed by a full uplink,
  holds back the next. Where the node link is not much faster than the origin link, one or two
  streams take the uplink and the rest are refused (they fetch the chunk once it is held).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading

STREAM_LAG = 2 << 20  # a stream further behind the fill than this is catching up or uplink-bound
HASH_STEP = 1 << 20  # a hash job starts once this much more is filled (or the chunk is complete)


class FillHash:
    """SHA-256 of a buffer that fills from the front, hashed on a worker thread as it fills.

    :meth:`advance` (event loop) reports the final prefix; at most one job per buffer runs at a
    time and takes everything filled so far, so updates stay in order without a thread each.
    """

    def __init__(self, buffer: bytearray | memoryview) -> None:
        self._view = memoryview(buffer).cast("B")
        self._hasher = hashlib.sha256()
        self._lock = threading.Lock()
        self._target = 0  # bytes final so far
        self._hashed = 0  # bytes hashed so far
        self._running = False  # a job is hashing (it stops once it caught up with _target)
        self._job: asyncio.Future[None] | None = None  # the latest job

    def advance(self, filled: int) -> None:
        """``buffer[:filled]`` is final: hash it (once ``HASH_STEP`` more is there, or all of it)."""
        with self._lock:
            self._target = max(self._target, min(filled, len(self._view)))
            if self._target - self._hashed >= HASH_STEP or self._target == len(self._view):
                self._start()

    def _start(self) -> None:  # with _lock held
        if not self._running and self._hashed < self._target:
            self._running = True
            self._job = asyncio.get_running_loop().run_in_executor(None, self._run)

    def _run(self) -> None:
        while True:
            with self._lock:
                start, end = self._hashed, self._target
                if start >= end:
                    self._running = False
                    return
            self._hasher.update(self._view[start:end])
            with self._lock:
                self._hashed = end

    async def digest(self) -> str:
        """The hex SHA-256 of the whole buffer, once every byte of it was reported final."""
        while True:
            with self._lock:
                if self._target < len(self._view):
                    raise ValueError(f"buffer final up to {self._target} of {len(self._view)} bytes")
                self._start()
                if not self._running:
                    return self._hasher.hexdigest()
                job = self._job
            assert job is not None
            await asyncio.shield(job)  # a cancelled caller leaves the job (and later callers) alone


class Inflight:
    """One chunk being pulled from the origin into ``buffer`` (a writable buffer of the chunk's length)."""

    def __init__(self, index: int, buffer: bytearray | memoryview) -> None:
        self.index = index
        self.buffer = buffer
        self.filled = 0
        self.failed = False
        self.sent: dict[int, int] = {}  # stream id -> bytes handed to its socket
        self._waiters: list[asyncio.Future[None]] = []
        self._next_id = 0
        self._hash = FillHash(buffer)

    @property
    def length(self) -> int:
        return len(self.buffer)

    def advance(self, filled: int) -> None:
        """The pull filled ``buffer[:filled]``; wake the streams."""
        if filled > self.filled:
            self.filled = min(filled, self.length)
            self._hash.advance(self.filled)
            self._wake()

    async def digest(self) -> str:
        """SHA-256 hex of the whole chunk once the pull filled it (hashed as it landed)."""
        return await self._hash.digest()

    def fail(self) -> None:
        """The pull ended without the whole chunk; streams end early."""
        self.failed = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    async def wait_beyond(self, offset: int) -> None:
        """Return once ``filled > offset`` or the pull failed."""
        while self.filled <= offset and not self.failed:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(future)
            await future

    def keeping_up(self) -> bool:
        """True while no running stream lags the fill by more than ``STREAM_LAG``."""
        return all(self.filled - sent <= STREAM_LAG for sent in self.sent.values())

    def open_stream(self) -> int:
        self._next_id += 1
        self.sent[self._next_id] = 0
        return self._next_id

    def close_stream(self, stream: int) -> None:
        self.sent.pop(stream, None)
