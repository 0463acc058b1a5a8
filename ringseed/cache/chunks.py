"""The node cache's chunk files: a memory tier in tmpfs and an SSD tier, under the budgets of a TierBook.

Owns the directories of one cache agent and every byte in them; the decisions (what fits, what is
spilled or dropped) are :class:`ringseed.protocol.cachetiers.TierBook`'s.

Layout (``memory_dir`` is on tmpfs, shared read-only with the group's training pods except
``buffers/``, which they write):
- ``<memory_dir>/chunks/<sha256>`` and ``<ssd_dir>/chunks/<sha256>``: verified chunks, one file
  each, named by the SHA-256 of their bytes; a file appears under that name only complete
  (written elsewhere, hashed, then renamed), so a name is a promise about the content.
- ``<memory_dir>/buffers/<id>``: writer buffers, allocated (``posix_fallocate``, so the agent's
  process owns the pages) and counted against the memory budget before a writer gets them. A
  few are kept allocated ahead (:meth:`ChunkStore.start_pool`) from free room only; when room
  runs short they are given back before anyone waits.
- ``*/tmp/``: chunks being received or spilled; emptied at start.

Rules:
- Budgets are hard: room is reserved (spilling or dropping first) before bytes are written.
  When no room can be made the caller waits (back-pressure) until ``deadline`` and then gets
  :class:`CacheFull` naming the budgets and what holds them.
- Every chunk that enters is hashed here; a mismatch with the expected hash is
  :class:`CorruptChunk` and nothing is kept. SSD chunks found at start are checked on first
  use (:meth:`ChunkStore.verify_once`); a corrupt one is dropped.
- ``added``/``dropped`` collect the changes the agent reports to the master.
- Blocking file work runs in threads; the bookkeeping runs on the agent's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ringseed.protocol import cachetiers as tiers

log = logging.getLogger(__name__)
MEMORY, SSD = tiers.Tier.MEMORY, tiers.Tier.SSD
_HASH_STEP = 1 << 20


class CacheFull(Exception):
    """No room could be made within the deadline; the message says what holds the budgets."""


class CorruptChunk(Exception):
    """Bytes that do not hash to the expected SHA-256."""


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _is_sha(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


class ChunkStore:
    """Chunk files in two tiers; one per cache agent."""

    def __init__(self, *, memory_dir: Path, ssd_dir: Path | None, memory_bytes: int, ssd_bytes: int) -> None:
        self.memory_dir = memory_dir
        self.ssd_dir = ssd_dir
        self.book = tiers.TierBook(memory_bytes=memory_bytes, ssd_bytes=ssd_bytes if ssd_dir is not None else 0)
        self.buffers_dir = memory_dir / "buffers"
        self.added: list[str] = []
        self.dropped: list[str] = []
        self.unverified: set[str] = set()
        self.changed = asyncio.Event()  # something was freed, unpinned or became evictable
        self._room = asyncio.Lock()
        self._pool: list[tuple[str, int]] = []  # allocated writer buffers, ready to hand out
        self._pool_size = 0
        self._pool_count = 0
        self._pool_wanted = asyncio.Event()

    def _dirs(self, tier: tiers.Tier) -> Path:
        root = self.memory_dir if tier is MEMORY else self.ssd_dir
        if root is None:
            raise RuntimeError("no SSD tier configured")
        return root

    def path(self, sha: str) -> Path:
        entry = self.book.get(sha)
        if entry is None:
            raise KeyError(sha)
        return self._dirs(entry.tier) / "chunks" / sha

    def has(self, sha: str) -> bool:
        return self.book.get(sha) is not None

    # -- start -------------------------------------------------------------------------------------

    def open(self) -> int:
        """Create the directories and adopt the chunks a previous run left; returns how many."""
        found = 0
        for tier in (MEMORY, SSD):
            if tier is SSD and self.ssd_dir is None:
                continue
            root = self._dirs(tier)
            shutil.rmtree(root / "tmp", ignore_errors=True)
            for sub in ("chunks", "tmp"):
                (root / sub).mkdir(parents=True, exist_ok=True)
            for item in sorted((root / "chunks").iterdir(), key=lambda p: p.stat().st_mtime):
                found += self._adopt_existing(item, tier)
        shutil.rmtree(self.buffers_dir, ignore_errors=True)
        self.buffers_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.buffers_dir, 0o777)
        return found

    def _adopt_existing(self, item: Path, tier: tiers.Tier) -> int:
        size = item.stat().st_size
        if not _is_sha(item.name) or self.has(item.name) or size == 0:
            item.unlink(missing_ok=True)
            return 0
        plan = self.book.reserve(size, tiers=(tier,), now=time.monotonic())
        if not isinstance(plan, tiers.Granted):
            log.warning("Chunk %s does not fit the %s budget any more; dropping it", item.name[:12], tier.value)
            item.unlink(missing_ok=True)
            return 0
        self.book.fill(plan.ticket, key=item.name, size=size, evictable=False, now=0.0)
        self.added.append(item.name)
        if tier is SSD:
            self.unverified.add(item.name)
        return 1

    # -- room ------------------------------------------------------------------------------------------

    async def reserve(self, size: int, *, tiers_: tuple[tiers.Tier, ...], deadline: float) -> tiers.Granted:
        """Room for ``size`` bytes (spilling and dropping as the book says), or CacheFull at ``deadline``."""
        while True:
            async with self._room:
                plan = self.book.reserve(size, tiers=tiers_, now=time.monotonic())
                if isinstance(plan, tiers.Granted):
                    return plan
                if isinstance(plan, tiers.Make):
                    await self._carry_out(plan)
                    continue
                if self._pool:  # idle buffers give their room back before anyone waits
                    self._drain_pool()
                    continue
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise CacheFull(plan.reason)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=min(left, 1.0))

    async def _carry_out(self, plan: tiers.Make) -> None:
        for sha in plan.drop:
            self.drop(sha)
        for sha in plan.spill:
            entry = self.book.begin_move(sha)
            source = self._dirs(MEMORY) / "chunks" / sha
            target = self._dirs(SSD) / "chunks" / sha
            tmp = self._dirs(SSD) / "tmp" / f"{sha}.{secrets.token_hex(4)}"
            try:
                await asyncio.to_thread(_copy_then_rename, source, tmp, target)
            except OSError:
                self.book.abort_move(sha)
                log.exception("Spilling chunk %s to SSD failed", sha[:12])
                raise
            source.unlink(missing_ok=True)
            self.book.spilled(sha)
            log.debug("Spilled chunk %s (%d bytes) to SSD", sha[:12], entry.size)

    def drop(self, sha: str) -> None:
        """Remove chunk ``sha`` from whichever tier holds it (and tell the master)."""
        entry = self.book.get(sha)
        if entry is None:
            return
        (self._dirs(entry.tier) / "chunks" / sha).unlink(missing_ok=True)
        self.book.dropped(sha)
        self.unverified.discard(sha)
        self.dropped.append(sha)
        self.changed.set()

    def release(self, ticket: int) -> None:
        self.book.release(ticket)
        self.changed.set()

    # -- writer buffers ------------------------------------------------------------------------------

    def start_pool(self, *, size: int, count: int) -> asyncio.Task[None]:
        """Keep ``count`` buffers of ``size`` bytes allocated ahead, so a writer never waits for pages."""
        self._pool_size, self._pool_count = size, count
        return asyncio.create_task(self._fill_pool())

    async def _fill_pool(self) -> None:
        while True:
            await self._pool_wanted.wait()
            self._pool_wanted.clear()
            while len(self._pool) < self._pool_count:
                plan = self.book.reserve(self._pool_size, tiers=(MEMORY,), now=time.monotonic())
                if not isinstance(plan, tiers.Granted):
                    break  # no free room: the pool never spills chunks; writers allocate on demand
                try:
                    self._pool.append(await self._allocate(plan.ticket, self._pool_size))
                except OSError:
                    log.exception("Allocating a writer buffer failed")
                    break

    async def _allocate(self, ticket: int, size: int) -> tuple[str, int]:
        name = f"{ticket}-{secrets.token_hex(6)}"
        path = self.buffers_dir / name
        try:
            await asyncio.to_thread(_allocate, path, size)
        except OSError:
            self.release(ticket)
            path.unlink(missing_ok=True)
            raise
        return name, ticket

    def _drain_pool(self) -> None:
        for name, ticket in self._pool:
            (self.buffers_dir / name).unlink(missing_ok=True)
            self.book.release(ticket)
        self._pool.clear()

    async def new_buffer(self, size: int, *, deadline: float) -> tuple[str, int]:
        """A writer buffer of ``size`` bytes in tmpfs: ``(name, ticket)``; its pages are allocated here."""
        self._pool_wanted.set()
        if self._pool and size == self._pool_size:
            return self._pool.pop(0)
        grant = await self.reserve(size, tiers_=(MEMORY,), deadline=deadline)
        return await self._allocate(grant.ticket, size)

    async def adopt_buffer(self, name: str, *, ticket: int, length: int) -> str:
        """Turn a filled writer buffer into chunk files: truncate, hash, rename; returns the SHA-256."""
        path = self.buffers_dir / name
        try:
            sha = await asyncio.to_thread(_truncate_and_hash, path, length)
        except OSError:
            self.release(ticket)
            path.unlink(missing_ok=True)
            raise
        return self._settle(path, ticket=ticket, sha=sha, length=length, tier=MEMORY)

    def _settle(self, path: Path, *, ticket: int, sha: str, length: int, tier: tiers.Tier, data: bool = False) -> str:
        # dataset chunks are evictable at once (the source has them) and enter cold (BIP)
        if self.book.fill(ticket, key=sha, size=length, evictable=data, now=time.monotonic(), cold=data):
            os.replace(path, self._dirs(tier) / "chunks" / sha)
            self.added.append(sha)
        else:
            path.unlink(missing_ok=True)  # the same bytes are already here
        self.changed.set()
        return sha

    # -- receiving -----------------------------------------------------------------------------------

    async def receive(
        self,
        *,
        sha: str,
        length: int,
        fill: Callable[[int], Awaitable[str | None]],
        deadline: float,
        tiers_: tuple[tiers.Tier, ...] = (MEMORY, SSD),
        data: bool = False,
    ) -> None:
        """Make chunk ``sha`` local: reserve room, let ``fill(fd)`` write ``length`` bytes, verify, keep.

        ``fill`` writes the bytes to the file descriptor (any order, ``os.pwrite``, or a mapping
        of it) and returns their SHA-256 if it hashed them as they came (the file then has
        ``length`` bytes), else None (the file is hashed here); a hash mismatch raises
        :class:`CorruptChunk` and nothing is kept. ``data``: a dataset chunk.
        """
        if self.has(sha):
            return
        grant = await self.reserve(length, tiers_=tiers_, deadline=deadline)
        tmp = self._dirs(grant.tier) / "tmp" / f"{sha}.{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                digest = await fill(fd)
            finally:
                os.close(fd)
            got = digest if digest is not None else await asyncio.to_thread(_truncate_and_hash, tmp, length)
            if got != sha:
                raise CorruptChunk(f"chunk {sha[:12]}: received bytes hash to {got[:12]}")
        except BaseException:
            tmp.unlink(missing_ok=True)
            self.release(grant.ticket)
            raise
        self._settle(tmp, ticket=grant.ticket, sha=sha, length=length, tier=grant.tier, data=data)

    async def put_bytes(self, data: bytes | bytearray, *, deadline: float) -> str:
        """Keep a dataset chunk read from its source; returns its SHA-256 (the name it is known by)."""
        grant = await self.reserve(len(data), tiers_=(MEMORY, SSD), deadline=deadline)
        tmp = self._dirs(grant.tier) / "tmp" / f"source.{secrets.token_hex(6)}"
        try:
            sha = await asyncio.to_thread(_write_and_hash, tmp, data)
        except BaseException:
            tmp.unlink(missing_ok=True)
            self.release(grant.ticket)
            raise
        return self._settle(tmp, ticket=grant.ticket, sha=sha, length=len(data), tier=grant.tier, data=True)

    # -- use ---------------------------------------------------------------------------------------------

    async def verify_once(self, sha: str) -> bool:
        """Check an SSD chunk found at start against its name once; drops it (False) when corrupt."""
        if sha not in self.unverified:
            return self.has(sha)
        entry = self.book.pin(sha)
        try:
            got = await asyncio.to_thread(file_sha256, self.path(sha))
        except OSError:
            got = ""
        finally:
            self.book.unpin(sha)
        self.unverified.discard(sha)
        if got != sha:
            log.warning("Chunk %s on the %s tier is corrupt; dropping it", sha[:12], entry.tier.value)
            self.drop(sha)
            return False
        return True

    def lease(self, sha: str, *, seconds: float) -> Path:
        """The chunk's file, kept where it is for ``seconds`` (a reader opens it at once)."""
        self.book.lease(sha, until=time.monotonic() + seconds)
        self.book.touch(sha, now=time.monotonic())
        return self.path(sha)

    def set_evictable(self, shas: list[str], evictable: bool) -> None:
        for sha in shas:
            self.book.set_evictable(sha, evictable)
        if evictable and shas:
            self.changed.set()

    def take_changes(self) -> tuple[list[str], list[str]]:
        added, dropped = self.added, self.dropped
        self.added, self.dropped = [], []
        return added, dropped

    def held(self) -> list[str]:
        return list(self.book.entries)


def _allocate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.fchmod(fd, 0o666)
        if size:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def _truncate_and_hash(path: Path, length: int) -> str:
    with open(path, "r+b") as f:
        f.truncate(length)
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_and_hash(path: Path, data: bytes | bytearray) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def _copy_then_rename(source: Path, tmp: Path, target: Path) -> None:
    shutil.copyfile(source, tmp)  # sendfile(2) between the files: no copy through Python
    os.replace(tmp, target)
