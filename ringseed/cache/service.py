"""The node cache agent (``ringseed agent --role cache``): PCache's cache worker on one node.

Owns the agent's life cycle and its state shared by the parts: the chunk store
(:mod:`ringseed.cache.chunks`), writes (:mod:`ringseed.cache.writes`), reads
(:mod:`ringseed.cache.reads`), persist behind (:mod:`ringseed.cache.persist`), the peer server
(:mod:`ringseed.cache.peers`) on TCP and the local API (:mod:`ringseed.cache.local_api`) on a
Unix socket for the training pods of this node.

Rules:
- Start: adopt the chunk files a previous run left (tmpfs survives an agent restart; the SSD
  tier survives a reboot), then register with the master's leader with all of them.
- A heartbeat every ``heartbeat_interval`` carries the chunks added and dropped since the last
  one and the free bytes; the reply brings persist and copy duties, evictable changes and orphans to
  drop. A 404 ``unknown_node`` (a new leader, or a purge) means register again with
  everything held. An unreachable master only delays heartbeats: writes that need it wait
  (their commit retries until ``write_deadline``), reads of local chunks go on.
- SIGTERM/SIGINT stop it cleanly; SIGKILL loses nothing that was acknowledged (the copies
  live on other nodes, and its own files are adopted again at restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import peerclient
from ringseed.cache import chunks, data, local_api, master_client, peers, persist, reads, sink, writes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    master_urls: list[str]
    node_name: str
    advertise_host: str
    port: int
    token: str
    socket_path: Path
    memory_dir: Path
    ssd_dir: Path | None
    memory_bytes: int
    ssd_bytes: int
    group: str = ""
    host: str = "0.0.0.0"
    chunk_size: int = 32 << 20
    sink: str | None = None
    persist_rate_limit: float | None = None
    secret_env: dict[str, str] = field(default_factory=dict)
    upload_slots: int = 8
    fetch_slots: int = 4
    persist_slots: int = 1
    write_deadline: float = 120.0
    idle_timeout: float = 600.0
    read_lease: float = 30.0
    buffer_pool: int = 4  # writer buffers allocated ahead
    data_sources: dict[str, str] = field(default_factory=dict)  # dataset name -> source URI
    list_ttl: float = 300.0  # seconds a dataset listing stays current
    readahead: int = 4  # chunks fetched ahead of a sequential reader
    warmup: bool = False
    warmup_paths: tuple[str, ...] = ()


class CacheAgent:
    """One node's cache worker; :meth:`run` until ``stop`` is set."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.session_id = secrets.token_hex(8)
        self.store = chunks.ChunkStore(
            memory_dir=config.memory_dir,
            ssd_dir=config.ssd_dir,
            memory_bytes=config.memory_bytes,
            ssd_bytes=config.ssd_bytes,
        )
        self.sink: sink.Sink | None = None
        if config.sink:
            self.sink = sink.open_sink(config.sink, rate_limit=config.persist_rate_limit, secret_env=config.secret_env)
        self.writes = writes.Writes(self)
        self.reads = reads.Reads(self)
        self.peer_client = peerclient.PeerClient(token=config.token, threads=config.fetch_slots)
        self.persister = persist.Persister(self)
        self.copies = reads.Copies(self)
        self.datasets = data.Datasets(self, config.data_sources)
        self.peer_server = peers.PeerServer(
            self.store, upload_slots=config.upload_slots, deadline=config.write_deadline
        )
        self.replicas = 1
        self.heartbeat_interval = 1.0
        self.url = ""
        self.registered = asyncio.Event()
        self.warmup: asyncio.Task[None] | None = None
        self.metrics = web.Metrics()
        self.http: aiohttp.ClientSession
        self.master: master_client.MasterClient

    async def run(self, stop: asyncio.Event) -> None:
        found = await asyncio.to_thread(self.store.open)
        log.info("Cache agent %s adopted %d chunks from an earlier run", self.config.node_name, found)
        runners = [await self._serve_peers(), await self._serve_local()]
        try:
            async with aiohttp.ClientSession() as http:
                self.http = http
                self.master = master_client.MasterClient(
                    urls=self.config.master_urls, token=self.config.token, node=self.config.node_name, session=http
                )
                await self._work(stop)
        finally:
            for runner in runners:
                await runner.cleanup()
            if self.sink is not None:
                await self.sink.close()
            await self.datasets.close()
            self.peer_client.close()

    async def _work(self, stop: asyncio.Event) -> None:
        await self._register_until_done(stop)
        tasks = [asyncio.create_task(c) for c in (self._sync_loop(), self.persister.loop(), self._expire_loop())]
        tasks.append(self.store.start_pool(size=self.config.chunk_size, count=self.config.buffer_pool))
        if self.config.warmup and self.config.data_sources:
            self.warmup = asyncio.create_task(self.datasets.warm_up(prefixes=self.config.warmup_paths))
        stopper = asyncio.create_task(stop.wait())
        try:
            pending = {*tasks, stopper}
            while stopper in pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done - {stopper}:
                    task.result()
        finally:
            extra = [self.warmup] if self.warmup is not None else []
            for task in [*tasks, stopper, *extra]:
                task.cancel()
            await asyncio.gather(*tasks, stopper, *extra, return_exceptions=True)
            await self.copies.close()

    async def _serve_peers(self) -> aioweb.AppRunner:
        app = web.make_app(token=self.config.token, max_body_bytes=self.config.chunk_size + (1 << 20))
        self.peer_server.routes(app)
        app.router.add_get("/metrics", self.metrics.handler(self._refresh_metrics))
        app.router.add_get("/v1/status", self._status)
        runner = aioweb.AppRunner(app, access_log=None)
        await runner.setup()
        await aioweb.TCPSite(runner, self.config.host, self.config.port).start()
        port = runner.addresses[0][1] if runner.addresses else self.config.port
        self.url = f"http://{self.config.advertise_host}:{port}"
        log.info("Cache agent %s serves peers at %s", self.config.node_name, self.url)
        return runner

    async def _serve_local(self) -> aioweb.AppRunner:
        path = self.config.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        runner = aioweb.AppRunner(local_api.create_app(self), access_log=None)
        await runner.setup()
        await aioweb.UnixSite(runner, str(path)).start()
        os.chmod(path, 0o666)  # the pods of this group reach it through a shared hostPath
        log.info("Cache agent %s serves its node's writers at %s", self.config.node_name, path)
        return runner

    # -- master --------------------------------------------------------------------------------

    async def _register_until_done(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.register()
                return
            except master_client.MasterError as exc:
                log.info("Cache master not reachable yet: %s", exc)
                await asyncio.sleep(0.5)

    async def register(self) -> None:
        self.store.take_changes()  # the registration carries everything held
        reply = await self.master.register(
            url=self.url,
            session=self.session_id,
            group=self.config.group,
            chunks=self.store.held(),
            free_bytes=self.store.book.free_bytes(now=time.monotonic()),
        )
        self.replicas = int(reply.get("replicas", 1))
        self.heartbeat_interval = float(reply.get("heartbeat_interval", 1.0))
        self.registered.set()

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            added, dropped = self.store.take_changes()
            try:
                reply = await self.master.heartbeat(
                    added=added,
                    dropped=dropped,
                    free_bytes=self.store.book.free_bytes(now=time.monotonic()),
                    data=self.datasets.counters(),
                )
            except master_client.UnknownNode:
                log.info("Cache master does not know us (new leader?); registering again")
                with contextlib.suppress(master_client.MasterError):
                    await self.register()
                continue
            except master_client.MasterError as exc:
                self.store.added[:0], self.store.dropped[:0] = added, dropped  # report them next time
                log.info("Heartbeat failed: %s", exc)
                continue
            self._absorb(reply)

    def _absorb(self, reply: dict[str, Any]) -> None:
        self.store.set_evictable(list(reply.get("evictable_add", [])), True)
        self.store.set_evictable(list(reply.get("evictable_remove", [])), False)
        busy = self.writes.uncommitted_chunks()
        for sha in reply.get("drop", []):
            entry = self.store.book.get(sha)
            if sha not in busy and entry is not None and not entry.busy(time.monotonic()):
                self.store.drop(sha)
        self.persister.assign([(str(p), int(v)) for p, v in reply.get("persist", [])])
        self.copies.assign([(str(p), int(v)) for p, v in reply.get("copy", [])])

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.writes.expire(now=time.monotonic())

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        book = self.store.book
        return {
            "node": self.config.node_name,
            "memory": {"used": book.used(chunks.MEMORY), "limit": book.limit(chunks.MEMORY)},
            "ssd": {"used": book.used(chunks.SSD), "limit": book.limit(chunks.SSD)},
            "chunks": len(book.entries),
            "writes": len(self.writes.sessions),
            "sources": dict(self.reads.sources),
            "bytes_from": dict(self.reads.bytes_from),
            "received_bytes": self.peer_server.received_bytes,
            "uploaded_bytes": self.peer_server.uploaded_bytes,
            "persist": self.persister.status(),
            "copies": {
                "running": len(self.copies.running),
                "done": self.copies.copied_objects,
                "last_error": self.copies.last_error,
            },
            "data": {
                "counters": self.datasets.counters(),
                "warmup": {n: [d.warm_done, d.warm_total] for n, d in self.datasets.sources.items()},
            },
        }

    async def _status(self, request: aioweb.Request) -> aioweb.Response:
        return aioweb.json_response(self.status())

    def _refresh_metrics(self) -> None:
        m, book = self.metrics, self.store.book
        m.set("cache_memory_bytes", book.used(chunks.MEMORY))
        m.set("cache_ssd_bytes", book.used(chunks.SSD))
        m.set("cache_chunks", len(book.entries))
        for source, count in self.reads.sources.items():
            m.set("cache_chunk_reads", count, source=source)
        m.set("cache_persisted_bytes", self.persister.persisted_bytes)
        m.set("cache_received_bytes", self.peer_server.received_bytes)
        m.set("cache_uploaded_bytes", self.peer_server.uploaded_bytes)
