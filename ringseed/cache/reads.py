"""Reads from the node cache: make an object's chunks local from the nearest verified copy.

Owns the restore order for one chunk: local memory, local SSD (checked once against its name
after a restart), a peer that holds it (the master lists the holders), then the sink, the
object's byte range read back through the origin adapters. Every chunk that comes from a peer
or the sink is hashed before it is kept (:meth:`ringseed.cache.chunks.ChunkStore.receive`); a
peer that sends bad bytes or fails is skipped for the next holder.

Rules:
- Single flight: concurrent readers of one chunk on a node wait for one fetch.
- At most ``fetch_slots`` chunks are fetched at once per agent (a restore streams several
  chunks in parallel to fill the node's link).
- A busy holder (upload slots taken) is asked again shortly, not counted as failed, for up to
  ``peers.BUSY_PATIENCE_S``: a loaded cluster must not send a restore to the sink.
- When every listed holder fails, the holder list is asked again once (a new replica may
  exist) before the sink is tried; no copy anywhere is :class:`ReadError` naming the object,
  the chunk and what each source said.
- Where a chunk came from is counted (``sources``) for status and the benchmarks.
- Copy duties (:class:`Copies`): a checkpoint the master says has lost a copy (a holder died
  before it was persisted) is pulled here whole, chunk by chunk through the same order, so the
  promised number of copies is restored and a second node loss loses nothing either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from typing import TYPE_CHECKING, Any

from ringseed.cache import chunks, master_client, peers
from ringseed.protocol import cacheobjects as objects

if TYPE_CHECKING:
    from ringseed.cache.service import CacheAgent

log = logging.getLogger(__name__)


class ReadError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Reads:
    """Chunk fetching for one cache agent."""

    def __init__(self, agent: CacheAgent) -> None:
        self.agent = agent
        self.flights: dict[str, asyncio.Task[None]] = {}
        self.slots = asyncio.Semaphore(agent.config.fetch_slots)
        self.sources = {"memory": 0, "ssd": 0, "peer": 0, "sink": 0}
        self.bytes_from = {"peer": 0, "sink": 0}
        self.rejected = 0  # copies that failed verification here (a peer's or the sink's)
        self.rng = random.Random()

    async def describe(self, path: str) -> dict[str, Any]:
        """The object at ``path`` with per-chunk holders, from the master."""
        try:
            meta: dict[str, Any] = await self.agent.master.object(objects.check_path(path))
        except master_client.Refused as exc:
            raise ReadError(exc.error or "refused", exc.reason) from exc
        except master_client.Unavailable as exc:
            raise ReadError("master_unavailable", str(exc)) from exc
        return meta

    async def ensure(self, meta: dict[str, Any], index: int) -> None:
        """Chunk ``index`` of the object ``meta`` is held here, verified, when this returns."""
        sha, _ = meta["chunks"][index]
        store = self.agent.store
        if store.has(sha) and await store.verify_once(sha):
            entry = store.book.get(sha)
            self.sources["memory" if entry is None or entry.tier is chunks.MEMORY else "ssd"] += 1
            return
        flight = self.flights.get(sha)
        if flight is None:
            flight = asyncio.create_task(self._fetch(meta, index))
            self.flights[sha] = flight
            flight.add_done_callback(lambda _: self.flights.pop(sha, None))
        await asyncio.shield(flight)

    async def _fetch(self, meta: dict[str, Any], index: int) -> None:
        async with self.slots:
            if self.agent.store.has(meta["chunks"][index][0]):
                return
            problems: list[str] = []
            holders = meta.get("sources", [[]] * (index + 1))[index]
            patience = time.monotonic() + peers.BUSY_PATIENCE_S
            while True:
                busy: list[Any] = []
                if await self._from_peers(meta, index, holders, problems, busy):
                    return
                if not busy or time.monotonic() >= patience:
                    problems += [f"peer {name}: busy for {peers.BUSY_PATIENCE_S:.0f} s" for name, _ in busy]
                    break
                await peers.busy_pause(self.rng)  # held, being served: ask the busy holders again
                holders = busy
            if await self._from_new_holders(meta, index, problems):
                return
            if await self._from_sink(meta, index, problems):
                return
        sha = meta["chunks"][index][0]
        raise ReadError(
            "unavailable",
            f"{meta['path']}: chunk {index} ({sha[:12]}) has no reachable verified copy: " + "; ".join(problems)
            if problems
            else f"{meta['path']}: chunk {index} ({sha[:12]}) is held by no online node and there is no sink",
        )

    async def _from_new_holders(self, meta: dict[str, Any], index: int, problems: list[str]) -> bool:
        """Ask for the holders again (a new replica, or a new leader learning them) and try those."""
        tried = {tuple(s) for s in meta.get("sources", [[]] * (index + 1))[index]}
        while True:
            fresh = await self.describe(meta["path"])
            if fresh.get("version") != meta.get("version"):
                return False
            again = [s for s in fresh["sources"][index] if tuple(s) not in tried]
            if again and await self._from_peers(meta, index, again, problems):
                return True
            tried |= {tuple(s) for s in again}
            wait = float(fresh.get("settling") or 0.0)
            if wait <= 0:
                return False
            await asyncio.sleep(min(wait, 0.25))  # a new leader: holders are re-registering

    async def _from_peers(
        self, meta: dict[str, Any], index: int, holders: list[Any], problems: list[str], busy: list[Any] | None = None
    ) -> bool:
        sha, length = meta["chunks"][index]
        order = list(holders)
        self.rng.shuffle(order)  # spread a restore's chunks over all holders
        for name, url in order:
            if name == self.agent.config.node_name:
                continue

            async def fill(fd: int, url: str = url) -> str:
                return await peers.fetch_into(self.agent.peer_client, url=url, sha=sha, length=length, fd=fd)

            try:
                await self._receive(sha, length, fill)
            except peers.PeerBusy as exc:
                if busy is not None:
                    busy.append([name, url])
                else:
                    problems.append(f"peer {name}: {exc}")
                continue
            except (peers.PeerError, chunks.CorruptChunk) as exc:
                self.rejected += isinstance(exc, chunks.CorruptChunk)
                problems.append(f"peer {name}: {exc}")
                continue
            self.sources["peer"] += 1
            self.bytes_from["peer"] += length
            return True
        return False

    async def _from_sink(self, meta: dict[str, Any], index: int, problems: list[str]) -> bool:
        sink = self.agent.sink
        if sink is None:
            return False
        sha, length = meta["chunks"][index]
        start = sum(int(c[1]) for c in meta["chunks"][:index])

        async def fill(fd: int) -> None:
            # One copy more than a peer fetch (buffer, then file); the sink's link is the bottleneck.
            buffer = bytearray(length)
            await sink.read_into(meta["path"], start, memoryview(buffer))  # type: ignore[attr-defined]
            os.pwrite(fd, buffer, 0)

        try:
            await self._receive(sha, length, fill)
        except chunks.CorruptChunk as exc:
            self.rejected += 1
            problems.append(f"sink: holds other bytes for this chunk (an older or newer version?): {exc}")
            return False
        except Exception as exc:
            problems.append(f"sink: {type(exc).__name__}: {exc}")
            return False
        self.sources["sink"] += 1
        self.bytes_from["sink"] += length
        return True

    async def _receive(self, sha: str, length: int, fill: Any) -> None:
        deadline = time.monotonic() + self.agent.config.write_deadline
        try:
            await self.agent.store.receive(sha=sha, length=length, fill=fill, deadline=deadline)
        except chunks.CacheFull as exc:
            raise ReadError("cache_full", f"no room to bring chunk {sha[:12]} here: {exc}") from exc


class Copies:
    """The copy duties of one agent: whole objects pulled here to restore their replica count."""

    def __init__(self, agent: CacheAgent) -> None:
        self.agent = agent
        self.running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.copied_objects = 0
        self.last_error: str | None = None

    def assign(self, duties: list[tuple[str, int]]) -> None:
        """The duties of the latest heartbeat: start the new ones (and retry failed ones), cancel the rest."""
        wanted = set(duties)
        for key in [k for k in self.running if k not in wanted]:
            self.running.pop(key).cancel()
        for key in wanted:
            task = self.running.get(key)
            if task is None or task.done():
                self.running[key] = asyncio.create_task(self._copy(*key))

    async def _copy(self, path: str, version: int) -> None:
        reads = self.agent.reads
        try:
            meta = await reads.describe(path)
            if meta.get("version") != version:
                return  # rewritten or deleted meanwhile: the next heartbeat says what is wanted
            missing = [i for i, (sha, _) in enumerate(meta["chunks"]) if not self.agent.store.has(sha)]
            if not missing:
                return  # done already; the master learns it from the next heartbeat
            await asyncio.gather(*(reads.ensure(meta, i) for i in missing))
        except (ReadError, chunks.CorruptChunk) as exc:
            self.last_error = f"{path}: {exc}"
            log.warning("Copy of %s (version %d) failed, retried with the next heartbeat: %s", path, version, exc)
            return
        self.copied_objects += 1
        log.info("Holding a copy of %s (version %d) again: a holder was lost before it was persisted", path, version)

    async def close(self) -> None:
        for task in self.running.values():
            task.cancel()
        for task in self.running.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.running.clear()
