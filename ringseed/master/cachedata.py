"""The cache master's dataset endpoints (issue 13): revisions of sources, single flight per chunk, fill.

Owns the wire format between cache agents and the leader for datasets. Soft state (rebuilt from
the agents and the sources after a leader switch; never replicated): each source's current
revision, the chunk hashes learned from the sources, who is reading which chunk from a source
now (:class:`ringseed.protocol.datasets.Flights`), and the agents' read counters.

Endpoints (leader; bearer token; JSON):
- ``GET /v1/data/revision?source=S`` -> ``{source, revision: Revision.to_dict(), id, listed_at}``
  or 404 ``not_found``. ``PUT /v1/data/revision`` ``{source, revision, listed_at}`` stores a
  listing an agent made (the newest ``listed_at`` wins) and answers like GET: one listing per
  source per staleness period serves every node. Revision answers are gzip-compressed for a client
  that accepts it (a listing of 10,000 files is about 1 MB of JSON, sent to every agent).
- ``POST /v1/data/listing`` ``{node, source, max_age?, release?}`` -> ``{answer:
  "list"|"wait"|"published"|"released", wait: seconds}``: one agent at a time lists a source (a
  listing claim, held until its ``PUT``, its release, its node going offline, or
  ``LISTING_CLAIM_S``); the others wait for the published revision instead of listing the source
  too. ``published``: a revision listed less than ``max_age`` seconds ago is here now (published
  since the agent asked for it): take it.
- ``POST /v1/data/chunk`` ``{node, source, revision, chunk}`` -> ``{answer: "peers"|"fetch"|"wait",
  sha256: hash|null, holders: [[name, url]], wait: seconds}``
- ``POST /v1/data/learned`` ``{node, source, revision, chunk, sha256}`` -> ``{ok}`` (409 when another
  hash was learned first); ``POST /v1/data/release`` gives a claim up.
- Agents add ``data: {hits, misses, bytes_from_source, bytes_from_peers}`` to heartbeats (counters);
  ``GET /v1/status`` then carries ``data: {source: {revision, total_bytes, chunks, cached_bytes,
  nodes_complete, percent}, hit_ratio}`` (``cached_bytes``: bytes of the chunks some online node
  holds; ``nodes_complete``: nodes holding every chunk).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web as aioweb

from ringseed import web
from ringseed.master import cachemeta
from ringseed.protocol import cacheobjects, datasets, manifest, revision

MAX_SOURCE = 63
LISTING_CLAIM_S = 60.0  # a lister that neither publishes nor gives up in this long is taken for gone
LISTING_WAIT_S = 0.2


@dataclass
class DataState:
    flights: datasets.Flights = field(default_factory=datasets.Flights)
    revisions: dict[str, tuple[revision.Revision, float]] = field(default_factory=dict)
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    listings: dict[str, tuple[str, float]] = field(default_factory=dict)  # source -> (lister, claim ends)
    term: int = 0  # the leadership this soft state belongs to

    def current(self, master: cachemeta.CacheMaster) -> DataState:
        """This state, emptied first when a new leadership began (soft state starts afresh)."""
        if self.term != master.term:
            self.flights, self.revisions, self.counters, self.term = datasets.Flights(), {}, {}, master.term
            self.listings = {}
        return self

    def count(self, node: str, raw: Any) -> None:
        if not isinstance(raw, dict):
            return
        self.counters[node] = {
            k: int(v) for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0
        }

    def status(self, master: cachemeta.CacheMaster) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for source, (rev, _) in sorted(self.revisions.items()):
            layout = rev.layout
            learned = self.flights.hashes(source, rev.id)
            cached, complete = 0, set(master.nodes.nodes)
            for index in range(layout.chunk_count):
                holders = {n.name for n in master.nodes.holders_of(learned[index])} if index in learned else set()
                if holders:
                    cached += layout.chunk_length(index)
                complete &= holders
            out[source] = {
                "revision": rev.id,
                "total_bytes": layout.total_size,
                "chunks": layout.chunk_count,
                "cached_bytes": cached,
                "nodes_complete": len(complete),
                "percent": int(100 * cached // max(1, layout.total_size)),
            }
        hits = sum(c.get("hits", 0) for c in self.counters.values())
        misses = sum(c.get("misses", 0) for c in self.counters.values())
        return {"sources": out, "hit_ratio": hits / (hits + misses) if hits + misses else None}


DATA_KEY = aioweb.AppKey("cache_data", DataState)


def _source(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_SOURCE or "/" in value:
        raise web.problem(400, "bad_field", "field 'source' must be a dataset name (a DNS label)")
    return value


def routes(app: aioweb.Application, master: cachemeta.CacheMaster, guard: Any) -> DataState:
    state = DataState()
    app[DATA_KEY] = state
    api = _DataApi(master, state)
    app.router.add_get("/v1/data/revision", guard(api.get_revision))
    app.router.add_put("/v1/data/revision", guard(api.put_revision))
    app.router.add_post("/v1/data/listing", guard(api.listing))
    app.router.add_post("/v1/data/chunk", guard(api.chunk))
    app.router.add_post("/v1/data/learned", guard(api.learned))
    app.router.add_post("/v1/data/release", guard(api.release))
    return state


class _DataApi:
    def __init__(self, master: cachemeta.CacheMaster, state: DataState) -> None:
        self.master = master
        self.state = state

    def _leader(self) -> cachemeta.CacheMaster:
        self.master.require_leader()
        self.state.current(self.master)
        return self.master

    def _answer(self, source: str) -> dict[str, Any]:
        found = self.state.revisions.get(source)
        if found is None:
            raise web.problem(404, "not_found", f"no revision of dataset {source!r} is known yet; list the source")
        rev, listed_at = found
        return {"source": source, "revision": rev.to_dict(), "id": rev.id, "listed_at": listed_at}

    def _revision(self, source: str, rev_id: str) -> revision.Revision:
        found = self.state.revisions.get(source)
        if found is None or found[0].id != rev_id:
            raise web.problem(409, "stale_revision", f"dataset {source!r} is not at revision {rev_id[:12]} (any more)")
        return found[0]

    @staticmethod
    def _compressed(answer: dict[str, Any]) -> aioweb.Response:
        response = aioweb.json_response(answer)
        response.enable_compression()  # gzip or deflate when the request accepts it, else as is
        return response

    async def get_revision(self, request: aioweb.Request) -> aioweb.Response:
        self._leader()
        return self._compressed(self._answer(_source(request.query.get("source"))))

    async def listing(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        master = self._leader()
        node = web.field_of(body, "node", str)
        source = _source(body.get("source"))
        held = self.state.listings.get(source)
        if web.field_of(body, "release", bool, required=False):
            if held is not None and held[0] == node:
                del self.state.listings[source]
            return aioweb.json_response({"answer": "released", "wait": 0})
        published = self.state.revisions.get(source)
        max_age = web.field_of(body, "max_age", (int, float), required=False)
        if published is not None and max_age is not None and time.time() - published[1] < float(max_age):
            return aioweb.json_response({"answer": "published", "wait": 0})
        now = time.monotonic()
        if held is None or held[0] == node or held[1] <= now or held[0] not in master.nodes.nodes:
            self.state.listings[source] = (node, now + LISTING_CLAIM_S)
            return aioweb.json_response({"answer": "list", "wait": 0})
        return aioweb.json_response({"answer": "wait", "wait": LISTING_WAIT_S})

    async def put_revision(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        self._leader()
        source = _source(body.get("source"))
        try:
            rev = revision.Revision.from_dict(web.field_of(body, "revision", dict))
        except manifest.ManifestError as exc:
            raise web.problem(400, "bad_revision", str(exc)) from exc
        listed_at = float(web.field_of(body, "listed_at", (int, float)))
        current = self.state.revisions.get(source)
        if current is None or listed_at > current[1]:
            self.state.revisions[source] = (rev, listed_at)
        self.state.listings.pop(source, None)  # listed: the waiting agents take this one
        return self._compressed(self._answer(source))

    def _chunk_args(self, body: dict[str, Any]) -> tuple[str, str, revision.Revision, int]:
        node = web.field_of(body, "node", str)
        source = _source(body.get("source"))
        rev = self._revision(source, web.field_of(body, "revision", str))
        chunk = web.field_of(body, "chunk", int)
        if not 0 <= chunk < rev.layout.chunk_count:
            raise web.problem(400, "bad_field", f"chunk {chunk} is outside the dataset's {rev.layout.chunk_count}")
        return node, source, rev, chunk

    async def chunk(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        master = self._leader()
        node, source, rev, chunk = self._chunk_args(body)
        sha = self.state.flights.hashes(source, rev.id).get(chunk)
        holders = master.nodes.holders_of(sha, exclude=node) if sha else []
        answer, sha, wait = self.state.flights.ask(
            source=source, revision=rev.id, chunk=chunk, chunk_count=rev.layout.chunk_count, node=node,
            holders={h.name for h in holders}, online=master.nodes.nodes.keys(), now=time.monotonic(),
        )  # fmt: skip
        return aioweb.json_response(
            {"answer": answer.value, "sha256": sha, "holders": [[h.name, h.url] for h in holders], "wait": wait}
        )

    async def learned(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        master = self._leader()
        node, source, rev, chunk = self._chunk_args(body)
        sha = cacheobjects.check_sha256(body.get("sha256"), what="sha256")
        ok = self.state.flights.learned(
            source=source, revision=rev.id, chunk=chunk, chunk_count=rev.layout.chunk_count, sha=sha, node=node
        )
        if not ok:
            raise web.problem(409, "conflict", f"chunk {chunk} of {source!r} was learned with another hash")
        master.nodes.hold(node, [sha])
        return aioweb.json_response({"ok": True})

    async def release(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        self._leader()
        node, source, rev, chunk = self._chunk_args(body)
        self.state.flights.release(source=source, revision=rev.id, chunk=chunk, node=node)
        return aioweb.json_response({"ok": True})
