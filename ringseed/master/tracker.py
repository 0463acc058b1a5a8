"""The master's tracker role: HTTP/JSON over :class:`ringseed.protocol.tracker.Tracker`.

Owns the wire format of the tracker API (agents, through ``ringseed/agent/tracker_client.py``,
are its only client). Every endpoint needs the group's bearer token; bodies are capped and
checked field by field; errors are JSON ``{"error", "reason"}`` (``ringseed.web``) naming the
field. The master never touches the origin and never moves model bytes. State is soft: a
restarted master starts empty with a new ``epoch`` and agents re-register (they get 404
``unknown_node``).

Endpoints (bodies are JSON objects; chunk indices are ints in ``[0, MAX_INDEX]``, hashes
lowercase hex SHA-256, node names 1-253 of ``[A-Za-z0-9._-]`` starting with a letter or digit):

- ``POST /v1/register`` ``{node, url, session, chunks?: {index: hash}, layout?: Layout.to_dict(),
  revision?: Revision.to_dict()}`` -> ``{epoch, heartbeat_interval, offline_after, rejected: [index],
  revision: id|null}`` (chunks of another revision than the tracker's are all rejected)
- ``POST /v1/heartbeat`` ``{node, load?, counters?: {origin_bytes, fetched_bytes, uploaded_bytes},
  chunks?: [[index, hash|null, from?]], dropped?: [index], verified_digest?, hash_cursor?, epoch?,
  avail_version?, problem?: {reason, message}|null, revision?: str|null}``
  -> ``{epoch, origin_duty, hashes: {index: hash}, hash_cursor, availability: [int]|null,
  avail_version, rejected, layout_known, pulling: [index], suspect: [index], revision: id|null,
  revision_confirmed}``.
  ``chunks`` are batched announcements of verified chunks; a hash rides along only from the
  origin-duty node; ``from`` names the node the chunk was fetched (or streamed) from, null or
  absent when it came from the origin: it is the evidence that the node serves good chunks.
  ``dropped`` lists chunks the node no longer holds (processed before ``chunks``).
  ``problem`` is the node's current blocking problem (``reason`` CamelCase, at most 64
  characters; ``message`` one sentence, whitespace folded and cut to ``MAX_MESSAGE``
  characters) or null when it has none; ``revision`` the source revision of the copy it holds
  (at most 128 of ``[A-Za-z0-9._:+-]``); either left out means unchanged. Counters are integers
  in ``[0, 2**63 - 1]``, ``load`` in ``[0, MAX_LOAD]``. In the reply, ``hashes`` holds the hashes
  learned since ``hash_cursor``; ``availability`` is null when ``avail_version`` is current;
  ``pulling`` lists chunks being pulled from the origin now; ``suspect`` lists chunks of this
  node that other nodes reported bad: the tracker no longer lists it as their holder, and it
  should check them (drop or announce again). A reply repeats them until then. A node whose
  ``revision`` is not the tracker's gets no hashes or availability and its chunks are ignored;
  the reply's ``revision`` (the swarm's) tells it which revision to move to.
- ``GET /v1/manifest`` -> ``{layout|null, chunk_hashes: [hash|null], digest|null,
  revision: Revision.to_dict()|null, revision_confirmed}``
- ``PUT /v1/manifest`` ``{node, layout, chunk_hashes?, revision?: Revision.to_dict(), replaces?: id}``
  (first wins; the same revision from the node on origin duty confirms it; another revision
  replaces the current one only from that node naming it in ``replaces``, else 409)
- ``POST /v1/origin/claim`` ``{node, count}`` -> ``{chunks: [index]}`` (403 without origin duty)
- ``GET /v1/peers?chunk=I&node=N`` -> ``{peers: [{name, url, load}], streaming: {name, url}|null}``
  (``streaming``: when nobody holds the chunk, the node pulling it, which serves ``?stream=1``)
- ``POST /v1/report`` ``{node, peer, chunk}``: ``peer`` served bytes that failed verification.
- ``GET /v1/status`` (docs/contracts.md) and ``GET /metrics`` (Prometheus).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from aiohttp import web as aioweb

from ringseed import web
from ringseed.protocol import manifest, revision, tracker

MAX_BODY_BYTES = 16 << 20
MAX_INDEX = (1 << 31) - 1
MAX_COUNTER = (1 << 63) - 1
MAX_LOAD = 1 << 20
MAX_MESSAGE = 512
TRACKER_KEY = aioweb.AppKey("tracker", tracker.Tracker)
ERRORS: web.ErrorMap = {
    tracker.UnknownNode: 404,
    tracker.Conflict: 409,
    tracker.Forbidden: 403,
    tracker.TrackerError: 400,
    manifest.ManifestError: 400,
}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
TOKEN = re.compile(r"[A-Za-z0-9._-]{1,128}")
URL = re.compile(r"https?://[^\s/?#]+(/[^\s]*)?")
REASON = re.compile(r"[A-Z][A-Za-z0-9]{0,63}")
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}")
HEX64 = re.compile(r"[0-9a-f]{64}")
DIGITS = re.compile(r"[0-9]{1,10}")


def create_app(*, token: str, offline_after: float, heartbeat_interval: float, seeders: int) -> aioweb.Application:
    """The tracker-role application (state lives on ``app[TRACKER_KEY]``)."""
    app = web.make_app(token=token, max_body_bytes=MAX_BODY_BYTES, errors=ERRORS)
    state = tracker.Tracker(
        epoch=secrets.token_hex(8),
        offline_after=offline_after,
        seeders=seeders,
        now=time.monotonic(),
        claim_grace=2 * heartbeat_interval,
    )
    app[TRACKER_KEY] = state
    api = _Api(state, heartbeat_interval=heartbeat_interval)
    app.router.add_post("/v1/register", api.register)
    app.router.add_post("/v1/heartbeat", api.heartbeat)
    app.router.add_get("/v1/manifest", api.get_manifest)
    app.router.add_put("/v1/manifest", api.put_manifest)
    app.router.add_post("/v1/origin/claim", api.claim)
    app.router.add_get("/v1/peers", api.peers)
    app.router.add_post("/v1/report", api.report)
    app.router.add_get("/v1/status", api.status)
    app.router.add_get("/metrics", api.metrics.handler(api.refresh_metrics))
    app.cleanup_ctx.append(_purge_loop(state, every=min(1.0, offline_after / 4)))
    return app


def _purge_loop(state: tracker.Tracker, *, every: float) -> Callable[[aioweb.Application], AsyncIterator[None]]:
    async def ctx(app: aioweb.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(every)
                state.purge(now=time.monotonic())

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx


# -- fields ------------------------------------------------------------------------------


def _index(value: Any, label: str) -> int:
    return web.bounded(value, label, low=0, high=MAX_INDEX)


def _hash(value: Any, label: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or HEX64.fullmatch(value) is None:
        raise web.problem(400, "bad_field", f"{label} must be a lowercase hex SHA-256 or null")
    return value


def _name(body: dict[str, Any], key: str = "node") -> str:
    value = web.text(body, key, max_length=253, pattern=NAME, what="a node name (letters, digits, '.', '_', '-')")
    assert value is not None
    return value


def _node_or_null(value: Any, label: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or NAME.fullmatch(value) is None:
        raise web.problem(400, "bad_field", f"{label} must be a node name or null")
    return value


def _list(body: dict[str, Any], key: str, what: str) -> list[Any]:
    raw = body.get(key, [])
    if not isinstance(raw, list):
        raise web.problem(400, "bad_field", f"field {key!r} must be a list of {what}")
    return raw


def _chunk_map(raw: Any) -> dict[int, str]:
    if not isinstance(raw, dict):
        raise web.problem(400, "bad_field", "field 'chunks' must be an object {index: hash}")
    out: dict[int, str] = {}
    for key, value in raw.items():
        if DIGITS.fullmatch(key) is None:
            raise web.problem(400, "bad_field", f"chunks key {key[:32]!r} is not a chunk index")
        digest = _hash(value, f"chunks[{key}]")
        if digest is None:
            raise web.problem(400, "bad_field", f"chunks[{key}] needs a hash")
        out[_index(int(key), f"chunks key {key}")] = digest
    return out


def _announcements(body: dict[str, Any]) -> list[tracker.Announcement]:
    out: list[tracker.Announcement] = []
    for i, item in enumerate(_list(body, "chunks", "[index, hash|null, from?]")):
        if not isinstance(item, list) or len(item) not in (2, 3):
            raise web.problem(400, "bad_field", f"chunks[{i}] must be [index, hash|null, from?]")
        index, digest = _index(item[0], f"chunks[{i}][0]"), _hash(item[1], f"chunks[{i}][1]")
        source = _node_or_null(item[2], f"chunks[{i}][2]") if len(item) == 3 else None
        out.append((index, digest, source))
    return out


def _counters(body: dict[str, Any]) -> dict[str, int]:
    raw = body.get("counters", {})
    if not isinstance(raw, dict):
        raise web.problem(400, "bad_field", "field 'counters' must be an object of integers")
    names = ("origin_bytes", "fetched_bytes", "uploaded_bytes")
    return {k: web.integer(raw, k, low=0, high=MAX_COUNTER, default=0, label=f"counters.{k}") for k in names}


def _problem(body: dict[str, Any]) -> tracker.Problem | Literal[tracker.Keep.KEEP] | None:
    if "problem" not in body:
        return tracker.KEEP
    raw = body["problem"]
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise web.problem(400, "bad_field", "field 'problem' must be {reason, message} or null")
    what = "a CamelCase reason of at most 64 letters and digits (e.g. DiskFull)"
    reason = web.text(raw, "reason", max_length=64, pattern=REASON, what=what, label="field 'problem.reason'")
    message = web.field_of(raw, "message", str, label="field 'problem.message'")
    folded = " ".join(message.split())
    if len(folded) > MAX_MESSAGE:
        folded = folded[: MAX_MESSAGE - 1] + "\u2026"
    assert reason is not None
    return tracker.Problem(reason=reason, message=folded)


def _source(body: dict[str, Any]) -> revision.Revision | None:
    """The ``revision`` object of a registration or publication (``Revision.to_dict()``), if any."""
    raw = body.get("revision")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise web.problem(400, "bad_field", "field 'revision' must be a revision object {id, layout, tags, ...}")
    return revision.Revision.from_dict(raw)


def _revision(body: dict[str, Any]) -> str | Literal[tracker.Keep.KEEP] | None:
    if "revision" not in body:
        return tracker.KEEP
    if body["revision"] is None:
        return None
    return web.text(body, "revision", max_length=128, pattern=REVISION, what="a revision id ([A-Za-z0-9._:+-])")


class _Api:
    """Request handlers; each translates JSON to one tracker call and back."""

    def __init__(self, state: tracker.Tracker, *, heartbeat_interval: float) -> None:
        self.state = state
        self.heartbeat_interval = heartbeat_interval
        self.rng = random.Random()
        self.metrics = web.Metrics()
        m = self.metrics
        m.declare("tracker_nodes", "gauge", "registered nodes (online)")
        m.declare("tracker_nodes_ready", "gauge", "nodes holding a verified model")
        m.declare("tracker_nodes_penalised", "gauge", "nodes penalised for serving chunks that failed verification")
        m.declare("tracker_nodes_discredited", "gauge", "nodes whose reports others contradicted")
        m.declare("tracker_node_problem", "gauge", "1 per node with a blocking problem, by reason")
        m.declare("tracker_bytes_from_origin", "gauge", "bytes pulled from the origin by all agents")
        m.declare("tracker_throughput_bps", "gauge", "summed agent download rate")
        m.declare("tracker_requests_total", "counter", "tracker API requests by endpoint")
        m.declare("tracker_reports_total", "counter", "reports of chunks that failed verification")

    def refresh_metrics(self) -> None:
        status = self.state.status(now=time.monotonic())
        m = self.metrics
        m.set("tracker_nodes", len(self.state.nodes))
        m.set("tracker_nodes_ready", status["nodes_ready"])
        m.set("tracker_nodes_penalised", len(self.state.penalised))
        m.set("tracker_nodes_discredited", len(self.state.discredited))
        m.set("tracker_bytes_from_origin", status["bytes_from_origin"])
        m.set("tracker_throughput_bps", status["throughput_bps"])
        m.clear("tracker_node_problem")
        for name, entry in status["nodes"].items():
            if entry["reason"] is not None:
                m.set("tracker_node_problem", 1, node=name, reason=entry["reason"])

    async def register(self, request: aioweb.Request) -> aioweb.Response:
        self.metrics.inc("tracker_requests_total", endpoint="register")
        body = await web.read_json(request)
        raw_layout = web.field_of(body, "layout", dict, required=False)
        layout = manifest.Layout.from_dict(raw_layout) if raw_layout is not None else None
        source = _source(body)
        if source is not None and layout is None:
            layout = source.layout
        rejected = self.state.register(
            node=_name(body),
            url=str(web.text(body, "url", max_length=2048, pattern=URL, what="an http(s) URL")),
            session=str(web.text(body, "session", max_length=128, pattern=TOKEN, what="a session id")),
            now=time.monotonic(),
            chunks=_chunk_map(body.get("chunks", {})),
            layout=layout,
            source=source,
        )
        return aioweb.json_response(
            {
                "epoch": self.state.epoch,
                "heartbeat_interval": self.heartbeat_interval,
                "offline_after": self.state.offline_after,
                "rejected": rejected,
                "revision": self.state.revision,
            }
        )

    async def heartbeat(self, request: aioweb.Request) -> aioweb.Response:
        self.metrics.inc("tracker_requests_total", endpoint="heartbeat")
        body = await web.read_json(request)
        dropped = [_index(v, f"dropped[{i}]") for i, v in enumerate(_list(body, "dropped", "chunk indices"))]
        reply = self.state.heartbeat(
            node=_name(body),
            now=time.monotonic(),
            load=web.integer(body, "load", low=0, high=MAX_LOAD, default=0),
            counters=_counters(body),
            chunks=_announcements(body),
            dropped=dropped,
            verified_digest=_hash(body.get("verified_digest"), "field 'verified_digest'"),
            hash_cursor=web.integer(body, "hash_cursor", low=0, high=MAX_COUNTER, default=0),
            epoch=web.text(body, "epoch", max_length=128, pattern=TOKEN, required=False, what="an epoch id"),
            avail_version=web.integer(body, "avail_version", low=-1, high=MAX_COUNTER, default=-1),
            problem=_problem(body),
            revision=_revision(body),
        )
        return aioweb.json_response(
            {
                "epoch": self.state.epoch,
                "origin_duty": reply.origin_duty,
                "hashes": {str(i): h for i, h in reply.hashes.items()},
                "hash_cursor": reply.hash_cursor,
                "availability": reply.availability,
                "avail_version": reply.avail_version,
                "rejected": reply.rejected,
                "layout_known": reply.layout_known,
                "pulling": reply.pulling,
                "suspect": reply.suspect,
                "revision": reply.revision,
                "revision_confirmed": reply.revision_confirmed,
            }
        )

    async def get_manifest(self, request: aioweb.Request) -> aioweb.Response:
        layout = self.state.layout
        return aioweb.json_response(
            {
                "layout": layout.to_dict() if layout is not None else None,
                "chunk_hashes": list(self.state.hashes),
                "digest": self.state.digest,
                "revision": self.state.source.to_dict() if self.state.source is not None else None,
                "revision_confirmed": self.state.confirmed,
            }
        )

    async def put_manifest(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        layout = manifest.Layout.from_dict(web.field_of(body, "layout", dict))
        hashes = web.field_of(body, "chunk_hashes", list, required=False)
        replaces = web.text(body, "replaces", max_length=128, pattern=REVISION, required=False, what="a revision id")
        node = _name(body)
        now = time.monotonic()
        self.state.publish(node=node, layout=layout, hashes=hashes, now=now, source=_source(body), replaces=replaces)
        return aioweb.json_response({"ok": True, "digest": self.state.digest})

    async def claim(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        count = web.integer(body, "count", low=1, high=1024)
        chunks = self.state.claim_origin(node=_name(body), count=count, now=time.monotonic())
        return aioweb.json_response({"chunks": chunks})

    async def peers(self, request: aioweb.Request) -> aioweb.Response:
        self.metrics.inc("tracker_requests_total", endpoint="peers")
        raw = request.query.get("chunk", "")
        if DIGITS.fullmatch(raw) is None:
            raise web.problem(400, "bad_query", "query parameter 'chunk' must be a chunk index (decimal digits)")
        index = _index(int(raw), "query parameter 'chunk'")
        node = request.query.get("node", "")
        if node and NAME.fullmatch(node) is None:
            raise web.problem(400, "bad_query", "query parameter 'node' must be a node name")
        now = time.monotonic()
        found = self.state.peers(chunk=index, node=node, now=now, rng=self.rng)
        source = None if found else self.state.stream_source(chunk=index, node=node, now=now)
        return aioweb.json_response(
            {
                "peers": [{"name": p.name, "url": p.url, "load": p.load} for p in found],
                "streaming": {"name": source.name, "url": source.url} if source is not None else None,
            }
        )

    async def report(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        chunk = web.integer(body, "chunk", low=0, high=MAX_INDEX)
        self.state.report(reporter=_name(body), peer=_name(body, "peer"), chunk=chunk, now=time.monotonic())
        self.metrics.inc("tracker_reports_total")
        return aioweb.json_response({"ok": True})

    async def status(self, request: aioweb.Request) -> aioweb.Response:
        return aioweb.json_response(self.state.status(now=time.monotonic()))
