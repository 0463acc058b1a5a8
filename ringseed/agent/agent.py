"""The node agent (distribution role): joins the swarm, fetches, verifies, stores, serves, publishes.

Owns the agent's state, its life cycle and its conversation with the tracker; the work is split
over :mod:`~ringseed.agent.revisions` (which source revision this node holds, moving to a new
one and reusing what still matches), :mod:`~ringseed.agent.chunks` (holding verified chunks,
write-behind, drops, the disk budget), :mod:`~ringseed.agent.fetch` (peer downloads, rarest
first), :mod:`~ringseed.agent.seeder` (origin duty), :mod:`~ringseed.agent.atrest` (checks of
what is on disk, repair, publishing), :mod:`~ringseed.agent.store` (SSD tier),
:mod:`~ringseed.agent.cache` (memory tier) and :mod:`~ringseed.agent.server` (peer server).

Rules:
- Nothing unverified is announced, served or counted as verified: a chunk enters ``held`` only
  after its SHA-256 matched the known hash (from a manifest or the origin-duty agent), or, on origin
  duty, after this agent hashed what it pulled under the pinned revision (that hash is then
  published). Unverified bytes are written only into the staging region of a chunk this node
  has not held under the revision (a peer's chunk received in place, :mod:`fetch`), never into
  a published file; a failed hash leaves the chunk missing, and no journal line names it.
- Every chunk belongs to one source revision (``revision``). The agent follows the tracker's:
  a heartbeat or registration naming another one makes it move (:mod:`revisions`), and work
  started under the previous one (a fetch, a pull, a write) is discarded when it ends
  (``generation``). Heartbeats carry the agent's revision, its current problem
  (:mod:`problems`, null when fine), the new chunks (each naming the peer it came from: the
  tracker's evidence that the peer serves good chunks) and the chunks dropped since. A chunk the
  tracker calls ``suspect`` (peers reported our copy bad) is checked at once (``atrest``):
  dropped and fetched again if it rotted, announced again if it is sound.
- Start: the staging directory is locked (one agent per model and node); leftovers of killed
  publishes are removed; a previous run's revision and journal are offered to the tracker at
  registration, and the published copy is re-checked against what was recorded at publish.
- A 404 ``unknown_node`` (master restarted or purged us) means register again with everything held.
- Retries are bounded and back off (``ringseed.protocol.backoff``): the tracker while it is
  unreachable, chunks that fail, origin reads that fail; a lasting failure is a named problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import (
    atrest,
    buffers,
    cache,
    chunks,
    driver,
    origins,
    peerclient,
    problems,
    publish,
    revisions,
    seeder,
    server,
    store,
    stream,
    tracker_client,
)
from ringseed.protocol import (
    agentcore,
    agentsteps,
    announcements,
    backoff,
    digests,
    manifest,
    pacing,
    revision,
    watches,
)

log = logging.getLogger(__name__)
MAX_ANNOUNCE = 4096


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
    ssd_bytes: int | None = None
    staging_writes: str = "auto"  # how verified chunks get into staging (``store.WRITES``)
    origin_rate_limit: float | None = None
    host: str = "0.0.0.0"
    download_slots: int = 4
    upload_slots: int = 4
    origin_depth: int = 1
    origin_upload_slots: int = 1
    stream_slots: int = 8
    expected_digest: str | None = None
    scrub_rate: float = 16 << 20  # bytes/s re-hashed from disk while idle (0: off)
    scrub_after: float = 60.0  # seconds after publishing before the background check starts
    verify_on_start: bool = False
    source_check_interval: float = 300.0  # seconds between the duty holder's checks of the source for changes


class Agent:
    """One node's distribution agent; :meth:`run` until ``stop`` is set."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.session_id = secrets.token_hex(8)
        self.store = store.Store(
            config.cache_dir / config.namespace / config.name, budget=config.ssd_bytes, writes=config.staging_writes
        )
        self.memory = cache.MemoryTier(config.memory_bytes)
        self.model_dir = config.data_dir / config.namespace / config.name
        # The decisions and the copy's state (held, hashes, missing, candidates, what the tracker
        # said, announcements, downloads, origin duty) are the core's; this object drives it.
        self.core = agentcore.AgentCore(
            settings=agentcore.Settings(download_slots=config.download_slots, origin_depth=config.origin_depth)
        )
        self.jobs: dict[tuple[str, int], asyncio.Task[None]] = {}  # the core's jobs running (``driver``)
        self.revision: revision.Revision | None = None
        self.generation = 0
        self.prior: store.Prior | None = None
        self.prior_checked: set[int] = set()  # chunks of ``prior`` re-hashed fine (origin duty proofs)
        self.sync_state: dict[str, Any] = {"epoch": None, "since": None}  # the tracker's view we hold
        # origin duty
        self.inflight: dict[int, stream.Inflight] = {}  # ours, on origin duty
        self.origin: origins.Origin | None = None
        # serving and counters
        self.active_uploads = 0
        self.active_streams = 0
        self.uploaded_bytes = 0
        self.refused_uploads = 0
        self.fetched_bytes = 0
        self.origin_bytes = 0
        self.resumed_chunks = 0
        self.reused_chunks = 0
        self.landed_chunks = 0  # chunks from peers received in place into staging (``fetch``)
        # writes
        self.store_drops: list[int] = []  # to journal
        self.uncommitted: list[tuple[int, str]] = []
        self.pending_writes: dict[int, asyncio.Task[None]] = {}
        self.once_held: set[int] = set()  # held at some point under this revision (never received in place)
        self.write_failures = 0
        self.write_backoff: backoff.Backoff[str] = backoff.Backoff(base=1.0, cap=30.0)
        # publishing and checks at rest
        self.verified_digest: str | None = None
        self.must_republish = False
        self.check = atrest.CheckState()
        self.problems = problems.Problems()
        self.pacer = pacing.Pacer(interval=1.0, gap=pacing.DEFAULT_GAP)  # the tracker's pace replaces it
        self.tracker_runs = False  # whether the tracker takes announcements as runs (its registration reply says)
        self.url = ""
        self.metrics = web.Metrics()
        self.changed = asyncio.Event()
        self.news = asyncio.Event()
        self.revision_news = asyncio.Event()
        self.hashes_news = asyncio.Event()
        self.copy_news = asyncio.Event()  # held set, drops or revision changed: publishing looks again
        self.journal_news = asyncio.Event()  # a journal line or a drop is queued
        self.buffers = buffers.Pool(capacity=config.chunk_size, limit=self._buffer_limit(config.chunk_size))
        self.peer_client = peerclient.PeerClient(token=config.token, threads=config.download_slots)
        self.tracker: tracker_client.TrackerClient
        self.http: aiohttp.ClientSession

    @property
    def layout(self) -> manifest.Layout | None:
        return self.revision.layout if self.revision is not None else None

    # The core's state, read-only here: it changes through the core's events only.

    @property
    def held(self) -> Mapping[int, str]:
        return self.core.held

    @property
    def hashes(self) -> Mapping[int, str]:
        return self.core.hashes

    @property
    def missing(self) -> Set[int]:
        return self.core.missing

    @property
    def candidates(self) -> Set[int]:
        """Chunks whose bytes were kept from another revision, to check by hash."""
        return self.core.candidates

    @property
    def availability(self) -> Sequence[int]:
        return self.core.availability

    @property
    def origin_duty(self) -> bool:
        return self.core.duty

    @property
    def writes_paused(self) -> bool:
        return self.core.writes_paused

    @property
    def tracker_revision(self) -> str | None:
        return self.core.tracker_revision

    @property
    def tracker_confirmed(self) -> bool:
        return self.core.confirmed

    def perform(self, actions: list[agentsteps.Action]) -> None:
        """Carry out actions the core returned from an event (``driver.perform``)."""
        driver.perform(self, actions)

    # -- life cycle ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.to_thread(self._prepare)
        runner = await self._serve()
        try:
            async with aiohttp.ClientSession() as http:
                self.http = http
                self.tracker = tracker_client.TrackerClient(
                    urls=self.config.master_url.split(","),
                    token=self.config.token,
                    node=self.config.node_name,
                    session=http,
                )
                await self._work(stop)
        finally:
            await runner.cleanup()
            await seeder.close_origin(self)
            self.peer_client.close()
            self.store.close()

    def _prepare(self) -> None:
        """Lock the staging directory and remove what killed publishes left."""
        self.store.acquire()
        for path in publish.remove_leftovers(self.model_dir):
            log.info("Removed %s (left by an interrupted publish)", path)

    async def _work(self, stop: asyncio.Event) -> None:
        saved = self.store.saved_revision()
        if saved is not None:
            await revisions.adopt(self, saved, hashes=None)
            await atrest.check_published(self)
        if self.config.verify_on_start:
            atrest.start_verify(self)
        await self._register_until_done(stop)
        loops = [self._sync_loop(), revisions.revision_loop(self), revisions.reuse_loop(self)]
        loops += [chunks.commit_loop(self), chunks.disk_loop(self), atrest.publish_loop(self), atrest.scrub_loop(self)]
        loops += [driver.core_loop(self)]
        tasks = [asyncio.create_task(c) for c in loops]
        stopper = asyncio.create_task(stop.wait())
        try:
            pending = {*tasks, stopper}
            while stopper in pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done - {stopper}:
                    task.result()  # a loop that failed stops the agent with its error
        finally:
            jobs = list(self.jobs.values())
            for task in [*tasks, stopper, *jobs]:
                task.cancel()
            await asyncio.gather(*tasks, stopper, *jobs, return_exceptions=True)
            await atrest.stop_verify(self)
            await chunks.drain_writes(self)
            if self.revision is not None:
                await asyncio.to_thread(self.store.commit, chunks.take_uncommitted(self))

    async def _serve(self) -> aioweb.AppRunner:
        self._declare_metrics()
        app = server.create_app(
            token=self.config.token,
            source=self,
            max_uploads=self.upload_limit,
            max_streams=self.config.stream_slots,
            metrics=self.metrics,
            refresh_metrics=self._refresh_metrics,
            control=self,
            upload_threads=self.config.upload_slots,
        )
        runner = aioweb.AppRunner(app, access_log=None)
        await runner.setup()
        site = aioweb.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else self.config.port
        self.url = f"http://{self.config.advertise_host}:{port}"
        log.info("Agent %s serving chunks at %s", self.config.node_name, self.url)
        return runner

    def chunk_buffer(self, length: int) -> memoryview:
        """A buffer for one chunk of the layout, reused once nothing refers to it (``buffers``)."""
        capacity = self.layout.chunk_size if self.layout is not None else length
        if capacity != self.buffers.capacity:
            self.buffers = buffers.Pool(capacity=capacity, limit=self._buffer_limit(capacity))
        return self.buffers.take(length)

    def _buffer_limit(self, chunk_size: int) -> int:
        # Chunks alive at once: the memory tier's, the downloads' and the origin pulls' (one ending
        # while the next starts), plus two.
        config = self.config
        return config.memory_bytes // max(1, chunk_size) + config.download_slots + config.origin_depth + 3

    def upload_limit(self) -> int:
        """Upload slots now: fewer while this agent still pulls from the origin, so the pull keeps pace."""
        if self.origin_duty and self.missing:
            return max(1, min(self.config.origin_upload_slots, self.config.upload_slots))
        return max(1, self.config.upload_slots)

    # -- tracker membership ----------------------------------------------------------------

    async def _register_until_done(self, stop: asyncio.Event) -> None:
        waits: backoff.Backoff[str] = backoff.Backoff(base=0.2, cap=5.0)
        while not stop.is_set():
            try:
                await self._register()
                return
            except tracker_client.Unavailable as exc:
                log.info("Tracker not reachable yet: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), waits.failed("tracker", now=time.monotonic()))

    async def _register(self) -> None:
        rev = self.revision
        held = dict(self.held) if rev is not None else {}
        reply = await self.tracker.register(
            url=self.url,
            session=self.session_id,
            chunks=held,
            layout=rev.layout.to_dict() if rev is not None else None,
            revision=rev.to_dict() if rev is not None else None,
        )
        self.pacer.follow(interval=reply.get("heartbeat_interval"), gap=reply.get("early_gap"))
        self.sync_state = {"epoch": reply.get("epoch"), "since": None}
        self.tracker_runs = reply.get("announce_runs") is True
        self.core.registered(held)  # a chunk verified or dropped while the call ran is still told
        self.core.tracker_moved(reply.get("revision"))
        if rev is not None and self.tracker_revision == rev.id:
            for index in reply.get("rejected", []):
                chunks.unhold(self, int(index))
        self.revision_news.set()

    # -- heartbeats ------------------------------------------------------------------------

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between regular heartbeats, as the tracker last told (its pace)."""
        return self.pacer.interval

    async def _sync_loop(self) -> None:
        """Heartbeat at the tracker's pace: every interval, early when there is news to tell
        (``news``: a verified chunk, a drop, a problem) but never sooner than the gap after the
        last one (:class:`ringseed.protocol.pacing.Pacer`)."""
        while True:
            wait = self.pacer.due(now=time.monotonic(), news=self.news.is_set())
            if wait > 0:
                if self.news.is_set():
                    await asyncio.sleep(wait)
                else:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.news.wait(), timeout=wait)
                continue
            self.news.clear()
            self.pacer.sent(now=time.monotonic())
            try:
                await self._heartbeat()
            except tracker_client.UnknownNode:
                log.info("Tracker does not know us (restarted?); registering again")
                await self._register_quietly()
            except tracker_client.TrackerClientError as exc:
                log.info("Heartbeat failed: %s", exc)

    async def _register_quietly(self) -> None:
        with contextlib.suppress(tracker_client.TrackerClientError):
            await self._register()

    async def _heartbeat(self) -> None:
        # Taken out before the call: a chunk dropped meanwhile leaves the announcements still to
        # send (``chunks.drop``), and the tracker applies ``dropped`` before ``chunks``.
        batch, drops = self.core.take_announcements(MAX_ANNOUNCE)
        generation = self.generation
        if self.tracker_runs:  # (a master that takes runs says so at registration)
            items, runs, sources = announcements.pack(batch)
            told: dict[str, Any] = {"chunks": items, "runs": runs, "sources": sources}
        else:
            told = {"chunks": [list(a) for a in batch]}
        body = dict(
            self.sync_state,
            index_runs=True,  # (views' chunk lists as runs; a master of an older release sends lists)
            load=self.active_uploads,
            counters=self.counters(),
            **told,
            dropped=drops,
            verified_digest=self.verified_digest,
            revision=self.revision.id if self.revision is not None else None,
            problem=self.problems.current(),
        )
        try:
            reply = await self.tracker.heartbeat(body)
        except BaseException:
            if generation == self.generation:
                self.core.announcements_failed(batch, drops)
            raise
        self.pacer.follow(interval=reply.get("heartbeat_interval"), gap=reply.get("early_gap"))
        if generation == self.generation and reply.get("rejected"):
            self.core.announcements_rejected([int(i) for i in reply["rejected"]])
        if self.core.announce or self.core.dropped:
            self.news.set()
        if generation != self.generation:  # moved to another revision meanwhile: this reply is stale
            self.news.set()
            return
        self._absorb(reply)

    def _absorb(self, reply: dict[str, Any]) -> None:
        # a new duty holder checks the revision against the source first (revisions rules: Retake)
        self.perform(
            self.core.tracker_state(
                revision=reply.get("revision"),
                confirmed=bool(reply.get("revision_confirmed")),
                duty=bool(reply.get("origin_duty")),
            )
        )
        ours = self.core.ours
        if not ours or (self.origin_duty and not self.tracker_confirmed):
            self.revision_news.set()
        if not ours:
            self.sync_state = {"epoch": reply.get("epoch"), "since": None}
            return
        self.absorb_view(reply)
        suspect = [int(i) for i in reply.get("suspect", [])]  # other nodes got bad bytes of these from us
        if suspect:
            atrest.start_recheck(self, suspect)
        self.changed.set()

    def absorb_view(self, reply: dict[str, Any]) -> bool:
        """Take in the tracker's view from a heartbeat or watch reply (``ringseed/master/tracker.py``):
        the changes since our version, or a snapshot. False when it is older than what we hold
        (a reply that crossed a newer one)."""
        version = int(reply.get("version", -1))
        since = self.sync_state.get("since")
        if reply.get("epoch") == self.sync_state.get("epoch") and since is not None and version < since:
            return False
        self.sync_state = {"epoch": reply.get("epoch"), "since": version if version >= 0 else None}
        try:
            hashes = digests.unpack(reply.get("hash_runs", []))
        except digests.DigestError as exc:  # (a master of another release; the rest still counts)
            log.warning("The tracker's reply has hashes this agent cannot read: %s", exc)
            hashes = {}
        if hashes:
            self.hashes_news.set()
        for index in self.core.learn_hashes(hashes):
            log.warning("Chunk %d held here does not match the tracker's hash; fetching again", index)
            chunks.drop(self, index)
        if reply.get("availability") is not None:
            self.core.set_availability([int(n) for n in reply["availability"]])
        runs = reply.get("index_runs") is True  # chunk lists as [[first, count]] (announcements.expand)

        def chunks_of(raw: Any, label: str) -> list[int]:
            return announcements.expand(raw, label=label) if runs else [int(i) for i in raw]

        pulling = chunks_of(reply.get("pulling", []), "pulling")
        if reply.get("full"):
            self.core.set_pulling(pulling)
        else:
            self.core.pulling_changed(started=pulling, stopped=chunks_of(reply.get("pulling_stopped", []), "stopped"))
        if reply.get("avail"):
            levels = {i: int(level) for level, raw in reply["avail"].items() for i in chunks_of(raw, "avail")}
            self.core.change_availability(levels)
        return True

    async def watch(self, chunks: list[int] | None, *, wait: float) -> None:
        """Wait for news of ``chunks`` (None: of any chunk we lack) from the tracker, at most
        ``wait`` seconds (a long-poll, never a poll), and take the news in."""
        generation = self.generation
        wait = min(wait, watches.MAX_WAIT)  # (the pace's interval may be longer than a watch may last)
        body = {**self.sync_state, "index_runs": True, "chunks": chunks, "wait": wait}
        try:
            reply = await self.tracker.watch(body, wait=wait)
        except tracker_client.TrackerClientError as exc:
            log.debug("Watch failed: %s", exc)
            self.news.set()  # the heartbeat re-registers if the tracker forgot us
            await asyncio.sleep(min(wait, 1.0))
            return
        if generation == self.generation and self.core.ours and self.absorb_view(reply):
            self.changed.set()

    def counters(self) -> dict[str, int]:
        return {
            "origin_bytes": self.origin_bytes,
            "fetched_bytes": self.fetched_bytes,
            "uploaded_bytes": self.uploaded_bytes,
        }

    # -- control (agent HTTP API) ----------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``GET /v1/status`` on the agent: this node's copy, problem and checks."""
        return {
            "node": self.config.node_name,
            "revision": self.revision.id if self.revision is not None else None,
            "tracker_revision": self.tracker_revision,
            "chunks_total": self.layout.chunk_count if self.layout is not None else 0,
            "chunks_held": len(self.held),
            "verified_digest": self.verified_digest,
            "problem": self.problems.current(),
            "problems": self.problems.all(),
            "pace": {"heartbeat_interval": self.pacer.interval, "early_gap": self.pacer.gap},
            "origin_duty": self.origin_duty,
            "writes_paused": self.writes_paused,
            "reused_chunks": self.reused_chunks,
            "landed_chunks": self.landed_chunks,
            "check": self.check.to_dict(),
        }

    def start_verify(self) -> bool:
        """``POST /v1/verify``: hash every held chunk from disk now (False if one is running)."""
        return atrest.start_verify(self)

    # -- metrics -------------------------------------------------------------------------------

    def _declare_metrics(self) -> None:
        m = self.metrics
        m.declare("agent_chunks_held", "gauge", "verified chunks held")
        m.declare("agent_chunks_total", "gauge", "chunks in the model (0 until the layout is known)")
        m.declare("agent_bytes_fetched", "counter", "bytes received from peers and the origin")
        m.declare("agent_bytes_from_origin", "counter", "bytes pulled from the origin")
        m.declare("agent_bytes_uploaded", "counter", "bytes served to peers")
        m.declare("agent_active_uploads", "gauge", "uploads in progress")
        m.declare("agent_uploads_refused", "counter", "chunk requests answered busy (429)")
        m.declare("agent_memory_tier_bytes", "gauge", "bytes held in the memory tier")
        m.declare("agent_complete", "gauge", "1 when the model is materialised and verified")
        m.declare("agent_chunks_streamed", "counter", "verified chunks streamed from the origin puller")
        m.declare("agent_chunks_rejected", "counter", "chunks received with a wrong hash (served or streamed)")
        m.declare("agent_chunks_dropped", "counter", "chunks dropped after they were held (rot, write failure)")
        m.declare("agent_problem", "gauge", "1 while the node has the problem named by reason")
        m.declare("agent_chunk_buffers_mapped", "counter", "chunk buffers mapped fresh (each page's first touch)")
        m.declare("agent_chunk_buffers_reused", "counter", "chunk buffers handed out again from the pool")

    def _refresh_metrics(self) -> None:
        m = self.metrics
        m.set("agent_chunks_held", len(self.held))
        m.set("agent_chunks_total", self.layout.chunk_count if self.layout is not None else 0)
        m.set("agent_bytes_fetched", self.fetched_bytes)
        m.set("agent_bytes_from_origin", self.origin_bytes)
        m.set("agent_bytes_uploaded", self.uploaded_bytes)
        m.set("agent_active_uploads", self.active_uploads)
        m.set("agent_uploads_refused", self.refused_uploads)
        m.set("agent_memory_tier_bytes", self.memory.used)
        m.set("agent_complete", 1 if self.verified_digest else 0)
        m.set("agent_chunks_streamed", self.core.streamed_chunks)
        m.set("agent_chunks_rejected", self.core.rejected_chunks)
        m.set("agent_chunks_dropped", self.check.dropped)
        m.set("agent_chunk_buffers_mapped", self.buffers.created + self.buffers.one_off)
        m.set("agent_chunk_buffers_reused", self.buffers.reused)
        for reason in problems.SEVERITY:
            m.set("agent_problem", 1 if self.problems.active(reason) else 0, reason=reason)
