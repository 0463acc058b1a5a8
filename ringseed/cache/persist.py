"""Persist behind: upload the objects the master assigns to this agent to the sink, then mark them.

Owns the persist loop of one cache agent. The master hands each unpersisted object to one online
holder (the writer first, a replica holder once the writer is gone); heartbeats bring the list.

Rules:
- One upload at a time per agent (``persist_slots``), paced by the persist rate limit shared by
  all of the agent's uploads (the sink is written behind training, never at its expense).
- An object's chunks are made local first (from a peer when this agent lacks some), pinned for
  the upload, then written to the sink (:mod:`ringseed.cache.sink`) with their sidecar; only
  after the sink write returned is the object marked persisted at the master.
- A failed upload (sink down, network) is retried with exponential backoff (the origins'
  :class:`~ringseed.agent.origins.base.RetryPolicy`, without a retry cap) for as long as the
  assignment stands; the object stays cached and unpersisted meanwhile, and status says so.
- An assignment that disappears (persisted elsewhere, deleted, rewritten) is dropped here;
  an upload in flight for it finishes harmlessly (the master ignores a stale mark).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from ringseed.agent.origins import base
from ringseed.cache import master_client, sink

if TYPE_CHECKING:
    from ringseed.cache.service import CacheAgent

log = logging.getLogger(__name__)


class Persister:
    """Uploads assigned objects to the sink."""

    def __init__(self, agent: CacheAgent) -> None:
        self.agent = agent
        self.assigned: set[tuple[str, int]] = set()
        self.failures: dict[tuple[str, int], int] = {}
        self.retry_at: dict[tuple[str, int], float] = {}
        self.running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.policy = base.RetryPolicy(retries=1 << 30, base_delay=0.5, max_delay=30.0)
        self.persisted_bytes = 0
        self.persisted_objects = 0
        self.last_error: str | None = None
        self.wake = asyncio.Event()

    def assign(self, duties: list[tuple[str, int]]) -> None:
        new = set(duties)
        for key in self.assigned - new:
            self.failures.pop(key, None)
            self.retry_at.pop(key, None)
        if new - self.assigned:
            self.wake.set()
        self.assigned = new

    async def loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=0.5)
            self.wake.clear()
            now = time.monotonic()
            for key in sorted(self.assigned):
                if len(self.running) >= self.agent.config.persist_slots:
                    break
                if key in self.running or self.retry_at.get(key, 0.0) > now:
                    continue
                task = asyncio.create_task(self._upload(*key))
                self.running[key] = task
                task.add_done_callback(functools.partial(self._done, key))

    def _done(self, key: tuple[str, int], _: object = None) -> None:
        task = self.running.pop(key)
        self.wake.set()
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self.failures.pop(key, None)
            self.assigned.discard(key)
            return
        count = self.failures[key] = self.failures.get(key, 0) + 1
        delay = self.policy.delay(count)
        self.retry_at[key] = time.monotonic() + delay
        self.last_error = f"{key[0]}: {error}"
        log.warning("Persisting %s failed (attempt %d, next in %.1fs): %s", key[0], count, delay, error)

    async def _upload(self, path: str, version: int) -> None:
        target = self.agent.sink
        if target is None:
            return
        meta = await self.agent.reads.describe(path)
        if meta.get("version") != version or meta.get("persisted"):
            return  # rewritten, deleted or already done: the next heartbeat says what is left
        for index in range(len(meta["chunks"])):
            await self.agent.reads.ensure(meta, index)
        shas = [c[0] for c in meta["chunks"]]
        for sha in shas:
            self.agent.store.book.pin(sha)
        try:
            parts = [sink.Part(path=self.agent.store.path(s), length=int(n), sha256=s) for s, n in meta["chunks"]]
            sidecar = {"path": path, "version": version, "size": meta["size"], "chunks": meta["chunks"]}
            await target.put(path, parts, sidecar=sidecar)
        finally:
            for sha in shas:
                self.agent.store.book.unpin(sha)
        await self._mark(path, version)
        self.persisted_bytes += int(meta["size"])
        self.persisted_objects += 1
        log.info("Persisted %s (version %d, %d bytes) to %s", path, version, meta["size"], target.uri)

    async def _mark(self, path: str, version: int) -> None:
        while True:
            try:
                await self.agent.master.persisted(path=path, version=version)
                return
            except master_client.Unavailable:
                await asyncio.sleep(0.5)

    def status(self) -> dict[str, Any]:
        return {
            "assigned": len(self.assigned),
            "running": len(self.running),
            "persisted_objects": self.persisted_objects,
            "persisted_bytes": self.persisted_bytes,
            "last_error": self.last_error,
        }
