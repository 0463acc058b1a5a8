"""The node agent (distribution role): joins the swarm, fetches, verifies, stores, serves, publishes.

Owns the agent's state and its life cycle; the work is split over :mod:`ringseed.agent.fetch`
(peer downloads, rarest first), :mod:`ringseed.agent.seeder` (origin duty),
:mod:`ringseed.agent.store` (SSD tier, journal, materialiser), :mod:`ringseed.agent.cache`
(memory tier) and :mod:`ringseed.agent.server` (peer server).

Rules:
- Nothing unverified is written, announced or served: a chunk enters ``held`` only after its
  SHA-256 matched the known hash (from a manifest or the origin-duty agent), or, on origin
  duty, after this agent hashed what it pulled (that hash is then published).
- Start: the staging directory's layout and journal (a previous run) are offered to the tracker
  at registration, so a restarted agent resumes without fetching verified chunks again.
- The layout comes from the tracker; if none is published and this agent holds origin duty,
  it lists the origin (or fetches ``--manifest-uri``) and publishes it.
- A sync loop heartbeats every ``heartbeat_interval`` (sooner when there is news) with load,
  counters, the batch of new chunks (each naming the peer it came from: the tracker's evidence
  that the peer serves good chunks) and the chunks dropped since, and learns duty, hashes and
  availability. A chunk the tracker calls ``suspect`` (peers reported our copy bad) is dropped
  and fetched again. A 404 ``unknown_node`` (master restarted or purged us) means register again
  with everything held.
- A verified chunk is held (pinned in the memory tier, announced, served from memory) at once;
  its disk write runs behind it, a bounded number at a time. Its journal line is queued only
  after the write finished; a failed write drops the chunk (fetched again). Materialising waits
  for every pending write.
- When every chunk is held: make the writes durable, materialise atomically under
  ``<data-dir>/<namespace>/<name>/`` and report the manifest digest; keep serving peers. With an
  expected digest (``RINGSEED_EXPECTED_DIGEST``, the resource's ``source.digest``) a model whose
  digest differs is never published (logged as an error; the node never reports verified).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import cache, fetch, origins, seeder, server, store, stream, tracker_client
from ringseed.protocol import manifest

log = logging.getLogger(__name__)
MAX_ANNOUNCE = 4096
MAX_PENDING_WRITES = 8  # write-behind chunks in flight (also bounded by the memory budget)


@dataclass(frozen=True)
class Config:
    master_url: str
    node_name: str
    advertise_host: str
    port: int
    token: str
    source: str
    data_dir: Path
    cache_dir: Path
    namespace: str
    name: str
    manifest_uri: str | None = None
    chunk_size: int = manifest.DEFAULT_CHUNK_SIZE
    memory_bytes: int = 256 << 20
    origin_rate_limit: float | None = None
    host: str = "0.0.0.0"
    download_slots: int = 4
    upload_slots: int = 4
    origin_depth: int = 1
    origin_upload_slots: int = 1
    stream_slots: int = 8
    expected_digest: str | None = None


class Agent:
    """One node's distribution agent; :meth:`run` until ``stop`` is set."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.session_id = secrets.token_hex(8)
        self.store = store.Store(config.cache_dir / config.namespace / config.name)
        self.memory = cache.MemoryTier(config.memory_bytes)
        self.model_dir = config.data_dir / config.namespace / config.name
        self.layout: manifest.Layout | None = None
        self.held: dict[int, str] = {}
        self.hashes: dict[int, str] = {}
        self.missing: set[int] = set()
        self.availability: list[int] = []
        self.sync_state: dict[str, Any] = {"epoch": None, "hash_cursor": 0, "avail_version": -1}
        self.origin_duty = False
        self.pulling: set[int] = set()  # chunks the origin-duty agent is pulling now (streamable there)
        self.inflight: dict[int, stream.Inflight] = {}  # ours, on origin duty
        self.active_uploads = 0
        self.active_streams = 0
        self.uploaded_bytes = 0
        self.fetched_bytes = 0
        self.origin_bytes = 0
        self.resumed_chunks = 0
        self.streamed_chunks = 0  # verified chunks received by cut-through from the origin puller
        self.rejected_chunks = 0  # chunks received with a wrong hash (served or streamed)
        self.announce: list[tuple[int, str | None, str | None]] = []  # (index, hash on duty, from whom)
        self.dropped: list[int] = []  # chunks no longer held, to tell the tracker
        self.uncommitted: list[tuple[int, str]] = []
        self.pending_writes: dict[int, asyncio.Task[None]] = {}
        self.write_failures = 0
        self.verified_digest: str | None = None
        self.heartbeat_interval = 1.0
        self.avoid: dict[str, float] = {}
        self.url = ""
        self.origin: origins.Origin | None = None
        self.metrics = web.Metrics()
        self.changed = asyncio.Event()
        self.news = asyncio.Event()
        self.tracker: tracker_client.TrackerClient
        self.http: aiohttp.ClientSession

    # -- life cycle ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        runner = await self._serve()
        try:
            async with aiohttp.ClientSession() as http:
                self.http = http
                self.tracker = tracker_client.TrackerClient(
                    base_url=self.config.master_url, token=self.config.token, node=self.config.node_name, session=http
                )
                await self._work(stop)
        finally:
            await runner.cleanup()
            await seeder.close_origin(self)
            self.store.close()

    async def _work(self, stop: asyncio.Event) -> None:
        saved = self.store.saved_layout()
        if saved is not None:
            await self._adopt(saved, hashes=None)
        await self._register_until_done(stop)
        loops = [self._sync_loop(), self._layout_loop(), self._commit_loop(), self._finish()]
        loops += [fetch.download_loop(self), seeder.origin_loop(self)]
        tasks = [asyncio.create_task(c) for c in loops]
        stopper = asyncio.create_task(stop.wait())
        try:
            pending = {*tasks, stopper}
            while stopper in pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done - {stopper}:
                    task.result()  # a loop that failed stops the agent with its error
        finally:
            for task in [*tasks, stopper]:
                task.cancel()
            await asyncio.gather(*tasks, stopper, return_exceptions=True)
            await self._drain_writes()
            await asyncio.to_thread(self.store.commit, self._take_uncommitted())

    async def _serve(self) -> aioweb.AppRunner:
        self._declare_metrics()
        app = server.create_app(
            token=self.config.token,
            source=self,
            max_uploads=self.upload_limit,
            max_streams=self.config.stream_slots,
            metrics=self.metrics,
            refresh_metrics=self._refresh_metrics,
        )
        runner = aioweb.AppRunner(app, access_log=None)
        await runner.setup()
        site = aioweb.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else self.config.port
        self.url = f"http://{self.config.advertise_host}:{port}"
        log.info("Agent %s serving chunks at %s", self.config.node_name, self.url)
        return runner

    def upload_limit(self) -> int:
        """Upload slots now: fewer while this agent still pulls from the origin, so the pull keeps pace."""
        if self.origin_duty and self.missing:
            return max(1, min(self.config.origin_upload_slots, self.config.upload_slots))
        return max(1, self.config.upload_slots)

    # -- tracker membership ----------------------------------------------------------------

    async def _register_until_done(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._register()
                return
            except tracker_client.Unavailable as exc:
                log.info("Tracker not reachable yet: %s", exc)
                await asyncio.sleep(0.5)

    async def _register(self) -> None:
        layout = self.layout.to_dict() if self.layout is not None else None
        try:
            reply = await self.tracker.register(
                url=self.url, session=self.session_id, chunks=dict(self.held), layout=layout
            )
        except tracker_client.Refused as exc:
            if exc.status != 409:
                raise
            log.warning("Tracker has a different layout; discarding local staging: %s", exc)
            await self._drain_writes()
            self._forget_layout()
            reply = await self.tracker.register(url=self.url, session=self.session_id, chunks={}, layout=None)
        self.heartbeat_interval = float(reply.get("heartbeat_interval", 1.0))
        self.sync_state = {"epoch": reply.get("epoch"), "hash_cursor": 0, "avail_version": -1}
        self.announce.clear()
        self.dropped.clear()  # the registration listed exactly what we hold
        for index in reply.get("rejected", []):
            self._unhold(int(index))

    def _forget_layout(self) -> None:
        self.layout, self.held, self.hashes, self.missing = None, {}, {}, set()

    def _unhold(self, index: int) -> None:
        if self.held.pop(index, None) is not None:
            self.hashes.pop(index, None)
            self.missing.add(index)
            self.memory.discard(index)
            self.announce = [a for a in self.announce if a[0] != index]
            self.dropped.append(index)
            self.news.set()

    async def _adopt(self, layout: manifest.Layout, *, hashes: list[Any] | None) -> None:
        verified = await asyncio.to_thread(self.store.open, layout)
        # Hashes that heartbeats brought while the manifest was fetched or the store opened are
        # kept: the tracker sends each hash once (after our cursor), so dropping one would leave
        # its chunk unfetchable for good.
        learned = {i: h for i, h in self.hashes.items() if 0 <= i < layout.chunk_count}
        self.layout = layout
        self.held = dict(verified)
        self.hashes = dict(verified)
        for index, digest in enumerate(hashes or []):
            if isinstance(digest, str):
                self.hashes.setdefault(index, digest)
        for index, digest in learned.items():
            self.hashes.setdefault(index, digest)
        self.held = {i: h for i, h in self.held.items() if self.hashes[i] == h}
        self.missing = set(range(layout.chunk_count)) - set(self.held)
        self.resumed_chunks = len(self.held)
        self.changed.set()
        log.info("Adopted layout: %d chunks, %d verified from an earlier run", layout.chunk_count, len(self.held))

    async def _layout_loop(self) -> None:
        while self.layout is None:
            try:
                published = await self.tracker.get_manifest()
                if published.get("layout") is not None:
                    layout = manifest.Layout.from_dict(published["layout"])
                    await self._adopt(layout, hashes=published.get("chunk_hashes"))
                    return
                if self.origin_duty:
                    await seeder.publish_layout(self)
                    continue
            except tracker_client.TrackerClientError as exc:
                log.info("Waiting for the layout: %s", exc)
            await asyncio.sleep(self.heartbeat_interval / 2)

    # -- heartbeats ------------------------------------------------------------------------

    async def _sync_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.news.wait(), timeout=self.heartbeat_interval)
            self.news.clear()
            try:
                await self._heartbeat()
            except tracker_client.UnknownNode:
                log.info("Tracker does not know us (restarted?); registering again")
                await self._register_quietly()
            except tracker_client.TrackerClientError as exc:
                log.info("Heartbeat failed: %s", exc)
            await asyncio.sleep(min(0.05, self.heartbeat_interval / 4))

    async def _register_quietly(self) -> None:
        with contextlib.suppress(tracker_client.TrackerClientError):
            await self._register()

    async def _heartbeat(self) -> None:
        # Taken out before the call: a chunk dropped meanwhile leaves the announcements still to
        # send (``_unhold``), and the tracker applies ``dropped`` before ``chunks``.
        batch, self.announce = self.announce[:MAX_ANNOUNCE], self.announce[MAX_ANNOUNCE:]
        dropped, self.dropped = self.dropped[:MAX_ANNOUNCE], self.dropped[MAX_ANNOUNCE:]
        body = dict(
            self.sync_state,
            load=self.active_uploads,
            counters=self.counters(),
            chunks=[list(a) for a in batch],
            dropped=dropped,
            verified_digest=self.verified_digest,
        )
        try:
            reply = await self.tracker.heartbeat(body)
        except BaseException:
            self.announce[:0] = [a for a in batch if a[0] in self.held]
            self.dropped[:0] = dropped
            raise
        if self.announce or self.dropped:
            self.news.set()
        self._absorb(reply)

    def _absorb(self, reply: dict[str, Any]) -> None:
        self.origin_duty = bool(reply.get("origin_duty"))
        self.sync_state["epoch"] = reply.get("epoch")
        self.sync_state["hash_cursor"] = int(reply.get("hash_cursor", 0))
        self.sync_state["avail_version"] = int(reply.get("avail_version", -1))
        for key, digest in reply.get("hashes", {}).items():
            index = int(key)
            if self.held.get(index, digest) != digest:
                log.warning("Chunk %d held here does not match the tracker's hash; fetching again", index)
                self._unhold(index)
            self.hashes[index] = digest
        if reply.get("availability") is not None:
            self.availability = [int(n) for n in reply["availability"]]
        self.pulling = {int(i) for i in reply.get("pulling", [])}
        for index in reply.get("suspect", []):  # other nodes got bad bytes of it from us
            if int(index) in self.held:
                log.warning("Peers reported chunk %d from here as corrupt; dropping it to fetch it again", index)
                self._unhold(int(index))
        self.changed.set()

    def counters(self) -> dict[str, int]:
        return {
            "origin_bytes": self.origin_bytes,
            "fetched_bytes": self.fetched_bytes,
            "uploaded_bytes": self.uploaded_bytes,
        }

    # -- chunks ------------------------------------------------------------------------------

    async def accept(
        self, index: int, data: bytes | bytearray, *, digest: str, from_origin: bool, source: str | None = None
    ) -> bool:
        """Hold a verified chunk: pinned in memory, announced at once, written to disk behind it.

        ``source`` names the peer the bytes came from: the announcement carries it, as evidence
        for the tracker that the peer serves good chunks.

        False if already held. The journal line is queued only when the write has finished (and
        :meth:`store.Store.commit` syncs the data before journaling it). At most
        ``memory budget // chunk`` writes are in flight (back-pressure on the caller); a chunk too
        big for the memory tier is written before it counts as held, as before.
        """
        if index in self.held or self.layout is None:
            return False
        limit = min(MAX_PENDING_WRITES, self.memory.budget // max(1, len(data)))
        if limit < 1:
            await asyncio.to_thread(self.store.write_chunk, index, data)
            if index in self.held:
                return False
            self._hold(index, data, digest=digest, from_origin=from_origin, source=source)
            self.uncommitted.append((index, digest))
            return True
        while len(self.pending_writes) >= limit:
            await asyncio.wait(set(self.pending_writes.values()), return_when=asyncio.FIRST_COMPLETED)
        if index in self.held or index in self.pending_writes or self.layout is None:
            return False
        self.memory.put(index, data, pin=True)
        self._hold(index, data, digest=digest, from_origin=from_origin, source=source)
        self.pending_writes[index] = asyncio.create_task(self._write_behind(index, data, digest))
        return True

    def _hold(self, index: int, data: bytes | bytearray, *, digest: str, from_origin: bool, source: str | None) -> None:
        self.held[index] = digest
        self.hashes.setdefault(index, digest)
        self.missing.discard(index)
        if index not in self.memory.pinned:
            self.memory.put(index, data)
        self.announce.append((index, digest if from_origin else None, source))
        self.news.set()
        self.changed.set()

    async def _write_behind(self, index: int, data: bytes | bytearray, digest: str) -> None:
        try:
            await asyncio.to_thread(self.store.write_chunk, index, data)
        except Exception:
            log.exception("Writing chunk %d to staging failed; dropping it and fetching it again", index)
            self.write_failures += 1
            self._unhold(index)
            self.changed.set()
            return
        finally:
            self.memory.unpin(index)
            self.pending_writes.pop(index, None)
        if self.held.get(index) == digest:  # still ours (not dropped on a hash mismatch meanwhile)
            self.uncommitted.append((index, digest))
            self.changed.set()

    async def _drain_writes(self) -> None:
        """Wait until every write-behind has finished (done or failed)."""
        while self.pending_writes:
            await asyncio.wait(set(self.pending_writes.values()))

    def _take_uncommitted(self) -> list[tuple[int, str]]:
        entries, self.uncommitted = self.uncommitted, []
        return entries

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            if self.uncommitted:
                await asyncio.to_thread(self.store.commit, self._take_uncommitted())

    async def _finish(self) -> None:
        while True:
            while self.layout is None or self.missing or len(self.hashes) < self.layout.chunk_count:
                await self.changed.wait()
                await asyncio.sleep(0.05)
            await self._drain_writes()
            if not self.missing:  # a failed write puts its chunk back in ``missing``
                break
        hashes = tuple(self.hashes[i] for i in range(self.layout.chunk_count))
        digest = manifest.Manifest(layout=self.layout, chunk_hashes=hashes).digest
        await asyncio.to_thread(self.store.commit, self._take_uncommitted())
        if self.config.expected_digest and digest != self.config.expected_digest:
            log.error("Model digest %s is not the expected %s; not publishing it", digest, self.config.expected_digest)
            return
        await asyncio.to_thread(self.store.materialise, model_dir=self.model_dir, digest=digest)
        self.verified_digest = digest
        self.news.set()
        log.info("Model complete and verified at %s (digest %s)", self.model_dir, digest[:16])

    # -- metrics -------------------------------------------------------------------------------

    def _declare_metrics(self) -> None:
        m = self.metrics
        m.declare("agent_chunks_held", "gauge", "verified chunks held")
        m.declare("agent_chunks_total", "gauge", "chunks in the model (0 until the layout is known)")
        m.declare("agent_bytes_fetched", "counter", "bytes received from peers and the origin")
        m.declare("agent_bytes_from_origin", "counter", "bytes pulled from the origin")
        m.declare("agent_bytes_uploaded", "counter", "bytes served to peers")
        m.declare("agent_active_uploads", "gauge", "uploads in progress")
        m.declare("agent_memory_tier_bytes", "gauge", "bytes held in the memory tier")
        m.declare("agent_complete", "gauge", "1 when the model is materialised and verified")
        m.declare("agent_chunks_streamed", "counter", "verified chunks streamed from the origin puller")
        m.declare("agent_chunks_rejected", "counter", "chunks received with a wrong hash (served or streamed)")

    def _refresh_metrics(self) -> None:
        m = self.metrics
        m.set("agent_chunks_held", len(self.held))
        m.set("agent_chunks_total", self.layout.chunk_count if self.layout is not None else 0)
        m.set("agent_bytes_fetched", self.fetched_bytes)
        m.set("agent_bytes_from_origin", self.origin_bytes)
        m.set("agent_bytes_uploaded", self.uploaded_bytes)
        m.set("agent_active_uploads", self.active_uploads)
        m.set("agent_memory_tier_bytes", self.memory.used)
        m.set("agent_complete", 1 if self.verified_digest else 0)
        m.set("agent_chunks_streamed", self.streamed_chunks)
        m.set("agent_chunks_rejected", self.rejected_chunks)
