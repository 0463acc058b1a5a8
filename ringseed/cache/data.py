"""Datasets through the node cache (issue 13): read-through from peers, then the source, once per chunk.

Owns the dataset side of one cache agent: each configured source (``--data NAME=URI``) is seen
at one revision at a time, and a read of a chunk that misses the node's cache is served by the
nearest copy: a peer that holds it (the master knows, and the hash it learned verifies the
bytes), else the source, read by one node of the cluster at a time (the master's claims;
:mod:`ringseed.protocol.datasets`). Concurrent readers of a chunk on a node wait for one fetch.

Rules:
- Staleness: the revision (the listing: each file's size and ETag/mtime, and the layout that
  packs the files into chunks in path order) is taken from the master when one was listed less
  than ``list_ttl`` seconds ago, else this agent lists the source and publishes it, when the
  master grants it the listing (one node lists a source at a time; the others wait for what it
  publishes: a cluster starting together lists once, not once per node). Every source
  read is pinned to the revision's sizes and tags: a file changed under the cache raises
  :class:`DataError` ``changed`` (the reader reopens and gets the new revision), never a mix.
- A peer that fails or sends bad bytes is skipped (the next holder, then the source): the reader
  sees no error for it. A busy one (all upload slots taken) is asked again shortly: the source is
  read only when no holder can serve (a busy cluster must not turn into a second source read).
- Dataset chunks are evictable at once and enter the tiers cold (bimodal insertion,
  :mod:`ringseed.protocol.cachetiers`); a chunk handed to a reader is leased while it reads.
- Read-ahead: chunks read in sequence make the next ``readahead`` chunks come in the background.
- Warm-up (``--warmup``): the agent fills its cache with the dataset (or the listed prefixes)
  in its own rotated order (node k starts at chunk k * n / N), so the nodes pull disjoint parts
  from the source first and take the rest from each other: the source is read about once, the
  rest moves between peers, as in a distribution.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringseed.agent import origins
from ringseed.cache import chunks, master_client, peers
from ringseed.protocol import datasets, manifest, revision

if TYPE_CHECKING:
    from ringseed.cache.service import CacheAgent

log = logging.getLogger(__name__)


class DataError(Exception):
    """A dataset read that cannot be served; ``code``: not_found, changed, unavailable, bad_path."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class _Current:
    revision: revision.Revision
    id: str
    checked: float  # monotonic, when this agent last confirmed it is current
    hashes: dict[int, str] = field(default_factory=dict)


class Dataset:
    """One source as seen by this agent."""

    def __init__(self, agent: CacheAgent, *, name: str, uri: str, secret_env: Mapping[str, str]) -> None:
        self.agent = agent
        self.name = name
        self.uri = uri
        self.origin = origins.open_origin(uri, secret_env=secret_env)
        self.current: _Current | None = None
        self.kept: dict[str, _Current] = {}  # revisions readers may still hold open
        self.flights: dict[tuple[str, int], asyncio.Task[str]] = {}
        self.ahead = datasets.ReadAhead(depth=agent.config.readahead)
        self.counters = {"hits": 0, "misses": 0, "bytes_from_source": 0, "bytes_from_peers": 0}
        self.warm_total = 0
        self.warm_done = 0
        self._listing = asyncio.Lock()

    # -- revisions --------------------------------------------------------------------------------

    async def revision(self) -> _Current:
        """The current revision (listing the source when the cluster's listing is stale)."""
        ttl = self.agent.config.list_ttl
        if self.current is not None and time.monotonic() - self.current.checked < ttl:
            return self.current
        async with self._listing:
            if self.current is not None and time.monotonic() - self.current.checked < ttl:
                return self.current
            while True:
                answer = await self._published()
                if answer is not None and time.time() - float(answer["listed_at"]) < ttl:
                    return self._adopt(answer)
                wait = await self._may_list()
                if wait is None:
                    break
                await asyncio.sleep(wait)  # another node is listing: take its revision when published
            try:
                return self._adopt(await self._list_and_publish())
            except DataError:
                await self._give_up_listing()
                raise

    async def _may_list(self) -> float | None:
        """None when this node is to list the source (the master's claim); else seconds to wait."""
        body = {"node": self.agent.config.node_name, "source": self.name, "max_age": self.agent.config.list_ttl}
        try:
            answer = await self.agent.master.call("POST", "/v1/data/listing", body)
        except master_client.Refused as exc:
            if exc.status == 404:  # a master without listing claims: list, as before
                return None
            raise DataError("unavailable", f"dataset {self.name!r}: {exc.reason}") from exc
        except master_client.Unavailable:
            return None  # publishing will say the master is gone
        if answer.get("answer") == "published":  # listed since this node asked for the revision
            return 0.0
        return None if answer.get("answer") == "list" else max(0.05, float(answer.get("wait") or 0.2))

    async def _give_up_listing(self) -> None:
        body = {"node": self.agent.config.node_name, "source": self.name, "release": True}
        with contextlib.suppress(master_client.MasterError):
            await self.agent.master.call("POST", "/v1/data/listing", body)

    async def _published(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.agent.master.call("GET", "/v1/data/revision", source=self.name)
            return found
        except master_client.Refused as exc:
            if exc.status == 404:
                return None
            raise DataError("unavailable", f"dataset {self.name!r}: {exc.reason}") from exc
        except master_client.Unavailable as exc:
            raise DataError("unavailable", f"dataset {self.name!r}: {exc}") from exc

    async def _list_and_publish(self) -> dict[str, Any]:
        try:
            listing = await self.origin.listing()
            pinned = revision.Revision.of_listing(listing, chunk_size=self.agent.config.chunk_size)
        except (origins.OriginError, manifest.ManifestError) as exc:
            raise DataError("unavailable", f"dataset {self.name!r}: listing {self.uri} failed: {exc}") from exc
        body = {"source": self.name, "revision": pinned.to_dict(), "listed_at": time.time()}
        try:
            published: dict[str, Any] = await self.agent.master.call("PUT", "/v1/data/revision", body)
        except master_client.MasterError as exc:
            raise DataError("unavailable", f"dataset {self.name!r}: {exc}") from exc
        return published

    def _adopt(self, answer: dict[str, Any]) -> _Current:
        rev_id = str(answer["id"])
        if self.current is None or self.current.id != rev_id:
            if self.current is not None:
                log.info("Dataset %s changed: revision %s -> %s", self.name, self.current.id[:12], rev_id[:12])
                self.kept[self.current.id] = self.current
                while len(self.kept) > datasets.MAX_REVISIONS_KEPT:
                    self.kept.pop(next(iter(self.kept)))
            pinned = revision.Revision.from_dict(answer["revision"])
            self.current = _Current(revision=pinned, id=rev_id, checked=time.monotonic())
            self.origin.pin(pinned.pins())
        self.current.checked = time.monotonic()
        return self.current

    def known_hash(self, rev_id: str, index: int) -> str | None:
        state = self.current if self.current is not None and self.current.id == rev_id else self.kept.get(rev_id)
        return state.hashes.get(index) if state is not None else None

    def _at(self, rev_id: str) -> _Current:
        if self.current is not None and self.current.id == rev_id:
            return self.current
        found = self.kept.get(rev_id)
        if found is None:
            raise DataError("changed", f"dataset {self.name!r} moved past revision {rev_id[:12]}; open the file again")
        return found

    # -- chunks -----------------------------------------------------------------------------------

    async def chunk(self, rev_id: str, index: int, *, prefetch: bool = True) -> str:
        """Chunk ``index`` of revision ``rev_id`` is held here (verified); returns its SHA-256."""
        state = self._at(rev_id)
        count = state.revision.layout.chunk_count
        if not 0 <= index < count:
            raise DataError("bad_index", f"chunk {index} is outside the dataset's {count} chunks")
        if prefetch:
            for ahead in self.ahead.saw(rev_id, index, count=count):
                self._start(state, ahead)
        sha = state.hashes.get(index)
        if sha is not None and self.agent.store.has(sha) and await self.agent.store.verify_once(sha):
            self.counters["hits"] += 1
            return sha
        self.counters["misses"] += 1
        return await asyncio.shield(self._start(state, index))

    def _start(self, state: _Current, index: int) -> asyncio.Task[str]:
        key = (state.id, index)
        flight = self.flights.get(key)
        if flight is None:
            flight = asyncio.create_task(self._fetch(state, index))
            self.flights[key] = flight
            flight.add_done_callback(lambda t: self._landed(key, t))
        return flight

    def _landed(self, key: tuple[str, int], task: asyncio.Task[str]) -> None:
        self.flights.pop(key, None)
        if not task.cancelled() and task.exception() is not None:  # read-ahead nobody waits for: say why here
            log.debug("Dataset %s chunk %d: %s", self.name, key[1], task.exception())

    async def _fetch(self, state: _Current, index: int) -> str:
        sha = state.hashes.get(index)
        if sha is not None and self.agent.store.has(sha):
            return sha
        failed: set[str] = set()
        patience = time.monotonic() + peers.BUSY_PATIENCE_S
        async with self.agent.reads.slots:
            while True:
                answer = await self._ask(state, index)
                sha = answer.get("sha256")
                holders = [(str(n), str(u)) for n, u in answer.get("holders", []) if n not in failed]
                if answer["answer"] == "peers" and holders and sha:
                    busy: set[str] = set()
                    if await self._from_peers(state, index, str(sha), holders, failed, busy):
                        return str(sha)
                    if busy and time.monotonic() < patience:  # held, being served: ask again shortly
                        await peers.busy_pause(self.agent.reads.rng)
                        continue
                    failed |= busy
                    if not [h for h in holders if h[0] not in failed]:
                        return await self._from_source(state, index, claimed=False)
                    continue
                if answer["answer"] == "wait":
                    await asyncio.sleep(float(answer.get("wait") or 0.2))
                    continue
                return await self._from_source(state, index, claimed=True)

    async def _ask(self, state: _Current, index: int) -> dict[str, Any]:
        body = {"node": self.agent.config.node_name, "source": self.name, "revision": state.id, "chunk": index}
        try:
            answer: dict[str, Any] = await self.agent.master.call("POST", "/v1/data/chunk", body)
            return answer
        except master_client.Refused as exc:
            if exc.error == "stale_revision":
                self.current = None if self.current is state else self.current
                raise DataError("changed", f"dataset {self.name!r}: {exc.reason}; open the file again") from exc
            raise DataError("unavailable", f"dataset {self.name!r}: {exc.reason}") from exc
        except master_client.Unavailable:
            return {"answer": "fetch"}  # no master: read the source (single flight is lost, reads are not)

    async def _from_peers(
        self, state: _Current, index: int, sha: str, holders: list[tuple[str, str]], failed: set[str], busy: set[str]
    ) -> bool:
        length = state.revision.layout.chunk_length(index)
        for name, url in holders:

            async def fill(fd: int, url: str = url) -> str:
                return await peers.fetch_into(self.agent.peer_client, url=url, sha=sha, length=length, fd=fd)

            try:
                await self.agent.store.receive(sha=sha, length=length, fill=fill, deadline=self._deadline(), data=True)
            except peers.PeerBusy:
                busy.add(name)
                continue
            except (peers.PeerError, chunks.CorruptChunk) as exc:
                log.info("Dataset %s chunk %d from %s failed (%s); trying the next copy", self.name, index, name, exc)
                failed.add(name)
                continue
            except chunks.CacheFull as exc:
                raise DataError("cache_full", f"no room for a dataset chunk: {exc}") from exc
            state.hashes[index] = sha
            self.counters["bytes_from_peers"] += length
            return True
        return False

    async def _from_source(self, state: _Current, index: int, *, claimed: bool) -> str:
        layout = state.revision.layout
        buffer = bytearray(layout.chunk_length(index))
        try:
            await origins.read_chunk_into(self.origin, layout, index, buffer)
        except origins.SourceChanged as exc:
            self._release(state, index, claimed)
            self.current = None  # list again on the next open
            raise DataError(
                "changed", f"dataset {self.name!r} changed under the cache ({exc}); open the file again"
            ) from exc
        except origins.OriginError as exc:
            self._release(state, index, claimed)
            raise DataError("unavailable", f"dataset {self.name!r}: {exc}") from exc
        try:
            sha = await self.agent.store.put_bytes(buffer, deadline=self._deadline())
        except chunks.CacheFull as exc:
            raise DataError("cache_full", f"no room for a dataset chunk: {exc}") from exc
        self.counters["bytes_from_source"] += len(buffer)
        state.hashes[index] = sha
        body = {"node": self.agent.config.node_name, "source": self.name, "revision": state.id, "chunk": index,
                "sha256": sha}  # fmt: skip
        with contextlib.suppress(master_client.MasterError):
            await self.agent.master.call("POST", "/v1/data/learned", body)
        return sha

    def _release(self, state: _Current, index: int, claimed: bool) -> None:
        if not claimed:
            return
        body = {"node": self.agent.config.node_name, "source": self.name, "revision": state.id, "chunk": index}
        task = asyncio.create_task(self.agent.master.call("POST", "/v1/data/release", body))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _deadline(self) -> float:
        return time.monotonic() + self.agent.config.write_deadline

    # -- warm-up ------------------------------------------------------------------------------------

    async def warm(self, *, prefixes: tuple[str, ...], rank: int, nodes: int) -> None:
        """Bring the dataset (or the files under ``prefixes``) into this node's cache."""
        state = await self.revision()
        wanted = datasets.chunks_of(state.revision.layout, prefixes)
        if not wanted:
            return
        start = (rank * len(wanted)) // max(1, nodes)
        order = wanted[start:] + wanted[:start]
        self.warm_total, self.warm_done = len(order), 0
        for index in order:
            await self.chunk(state.id, index, prefetch=False)
            self.warm_done += 1


class Datasets:
    """The configured sources of one agent, by name."""

    def __init__(self, agent: CacheAgent, sources: Mapping[str, str]) -> None:
        self.agent = agent
        self.sources = {
            name: Dataset(agent, name=name, uri=uri, secret_env=agent.config.secret_env)
            for name, uri in sources.items()
        }

    def get(self, name: str) -> Dataset:
        found = self.sources.get(name)
        if found is None:
            raise DataError(
                "not_found", f"no dataset {name!r} (configured: {', '.join(sorted(self.sources)) or 'none'})"
            )
        return found

    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for dataset in self.sources.values():
            for key, value in dataset.counters.items():
                total[key] = total.get(key, 0) + value
        return total

    async def warm_up(self, *, prefixes: tuple[str, ...]) -> None:
        """The warm-up of every source; the agent's rank among the registered nodes spreads the pulls."""
        for dataset in self.sources.values():
            while True:
                try:
                    rank, nodes = await self._rank()
                    await dataset.warm(prefixes=prefixes, rank=rank, nodes=nodes)
                    break
                except DataError as exc:
                    log.warning("Warm-up of dataset %s: %s; retrying", dataset.name, exc)
                    await asyncio.sleep(2.0)

    async def _rank(self) -> tuple[int, int]:
        try:
            status = await self.agent.master.call("GET", "/v1/status")
        except master_client.MasterError:
            return 0, 1
        names = sorted(status.get("nodes") or [self.agent.config.node_name])
        me = self.agent.config.node_name
        return (names.index(me) if me in names else 0), len(names)

    async def close(self) -> None:
        for dataset in self.sources.values():
            await dataset.origin.close()
