"""The master's tracker role: HTTP/JSON over :class:`ringseed.protocol.tracker.Tracker`.

Owns the wire format of the tracker API (agents, through ``ringseed/agent/tracker_client.py``,
are its only client). Every endpoint needs the group's bearer token; bodies are capped and
checked field by field; errors are JSON ``{"error", "reason"}`` (``ringseed.web``). The master
never touches the origin and never moves model bytes. State is soft: a restarted master starts
empty with a new ``epoch`` and agents re-register (they get 404 ``unknown_node``).

Endpoints (bodies are JSON objects; chunk indices are ints, hashes lowercase hex SHA-256):

- ``POST /v1/register`` ``{node, url, session, chunks?: {index: hash}, layout?: Layout.to_dict()}``
  -> ``{epoch, heartbeat_interval, offline_after, rejected: [index]}``
- ``POST /v1/heartbeat`` ``{node, load?, counters?: {origin_bytes, fetched_bytes},
  chunks?: [[index, hash|null]], verified_digest?, hash_cursor?, epoch?, avail_version?}``
  -> ``{epoch, origin_duty, hashes: {index: hash}, hash_cursor, availability: [int]|null,
  avail_version, rejected, layout_known, pulling: [index]}`` (``pulling``: chunks being pulled from
  the origin now). ``chunks`` are batched announcements of verified
  chunks; a hash rides along only from the origin-duty node. ``hashes`` holds the hashes learned
  since ``hash_cursor``; ``availability`` is null when ``avail_version`` is current.
- ``GET /v1/manifest`` -> ``{layout|null, chunk_hashes: [hash|null], digest|null}``
- ``PUT /v1/manifest`` ``{node, layout, chunk_hashes?}`` (first wins, later must match: 409)
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
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web as aioweb

from ringseed import web
from ringseed.protocol import manifest, tracker

MAX_BODY_BYTES = 16 << 20
TRACKER_KEY = aioweb.AppKey("tracker", tracker.Tracker)
_ERRORS: dict[type[Exception], int] = {
    tracker.UnknownNode: 404,
    tracker.Conflict: 409,
    tracker.Forbidden: 403,
    tracker.TrackerError: 400,
    manifest.ManifestError: 400,
}
Handler = Callable[[aioweb.Request], Awaitable[aioweb.StreamResponse]]


def create_app(*, token: str, offline_after: float, heartbeat_interval: float, seeders: int) -> aioweb.Application:
    """The tracker-role application (state lives on ``app[TRACKER_KEY]``)."""
    app = web.make_app(token=token, max_body_bytes=MAX_BODY_BYTES)
    state = tracker.Tracker(
        epoch=secrets.token_hex(8),
        offline_after=offline_after,
        seeders=seeders,
        now=time.monotonic(),
        claim_grace=2 * heartbeat_interval,
    )
    app[TRACKER_KEY] = state
    api = _Api(state, heartbeat_interval=heartbeat_interval)
    app.router.add_post("/v1/register", _guard(api.register))
    app.router.add_post("/v1/heartbeat", _guard(api.heartbeat))
    app.router.add_get("/v1/manifest", _guard(api.get_manifest))
    app.router.add_put("/v1/manifest", _guard(api.put_manifest))
    app.router.add_post("/v1/origin/claim", _guard(api.claim))
    app.router.add_get("/v1/peers", _guard(api.peers))
    app.router.add_post("/v1/report", _guard(api.report))
    app.router.add_get("/v1/status", _guard(api.status))
    app.router.add_get("/metrics", api.metrics.handler(api.refresh_metrics))
    app.cleanup_ctx.append(_purge_loop(state, every=min(1.0, offline_after / 4)))
    return app


def _guard(handler: Handler) -> Handler:
    async def guarded(request: aioweb.Request) -> aioweb.StreamResponse:
        try:
            return await handler(request)
        except tuple(_ERRORS) as exc:
            status = next(code for kind, code in _ERRORS.items() if isinstance(exc, kind))
            code = getattr(exc, "code", "bad_request")
            raise web.problem(status, code, str(exc)) from exc

    return guarded


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


def _index(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise web.problem(400, "bad_field", f"{name} must be a non-negative integer chunk index")
    return value


def _hash(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= set("0123456789abcdef"):
        raise web.problem(400, "bad_field", f"{name} must be a lowercase hex SHA-256 or null")
    return value


def _name(body: dict[str, Any], key: str = "node") -> str:
    value: str = web.field_of(body, key, str)
    if not 0 < len(value) <= 253:
        raise web.problem(400, "bad_field", f"field {key!r} must be 1 to 253 characters")
    return value


def _chunk_map(raw: Any) -> dict[int, str]:
    if not isinstance(raw, dict):
        raise web.problem(400, "bad_field", "field 'chunks' must be an object {index: hash}")
    out: dict[int, str] = {}
    for key, value in raw.items():
        try:
            index = int(key)
        except ValueError as exc:
            raise web.problem(400, "bad_field", f"chunks key {key!r} is not a chunk index") from exc
        digest = _hash(value, f"chunks[{key}]")
        if digest is None:
            raise web.problem(400, "bad_field", f"chunks[{key}] needs a hash")
        out[_index(index, f"chunks key {key}")] = digest
    return out


def _chunk_list(raw: Any) -> list[tuple[int, str | None]]:
    if not isinstance(raw, list):
        raise web.problem(400, "bad_field", "field 'chunks' must be a list of [index, hash|null]")
    out: list[tuple[int, str | None]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, list) or len(item) != 2:
            raise web.problem(400, "bad_field", f"chunks[{i}] must be [index, hash|null]")
        out.append((_index(item[0], f"chunks[{i}][0]"), _hash(item[1], f"chunks[{i}][1]")))
    return out


def _int_or(body: dict[str, Any], name: str, default: int) -> int:
    value = web.field_of(body, name, int, required=False)
    return default if value is None else int(value)


def _counters(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise web.problem(400, "bad_field", "field 'counters' must be an object of integers")
    out: dict[str, int] = {}
    for key in ("origin_bytes", "fetched_bytes", "uploaded_bytes"):
        value = raw.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise web.problem(400, "bad_field", f"counters.{key} must be a non-negative integer")
        out[key] = value
    return out


class _Api:
    """Request handlers; each translates JSON to one tracker call and back."""

    def __init__(self, state: tracker.Tracker, *, heartbeat_interval: float) -> None:
        self.state = state
        self.heartbeat_interval = heartbeat_interval
        self.rng = random.Random()
        self.metrics = web.Metrics()
        self.metrics.declare("tracker_nodes", "gauge", "registered nodes (online)")
        self.metrics.declare("tracker_nodes_ready", "gauge", "nodes holding a verified model")
        self.metrics.declare("tracker_bytes_from_origin", "gauge", "bytes pulled from the origin by all agents")
        self.metrics.declare("tracker_throughput_bps", "gauge", "summed agent download rate")
        self.metrics.declare("tracker_requests_total", "counter", "tracker API requests by endpoint")

    def refresh_metrics(self) -> None:
        status = self.state.status(now=time.monotonic())
        self.metrics.set("tracker_nodes", len(self.state.nodes))
        self.metrics.set("tracker_nodes_ready", status["nodes_ready"])
        self.metrics.set("tracker_bytes_from_origin", status["bytes_from_origin"])
        self.metrics.set("tracker_throughput_bps", status["throughput_bps"])

    async def register(self, request: aioweb.Request) -> aioweb.Response:
        self.metrics.inc("tracker_requests_total", endpoint="register")
        body = await web.read_json(request)
        raw_layout = web.field_of(body, "layout", dict, required=False)
        layout = manifest.Layout.from_dict(raw_layout) if raw_layout is not None else None
        rejected = self.state.register(
            node=_name(body),
            url=web.field_of(body, "url", str),
            session=web.field_of(body, "session", str),
            now=time.monotonic(),
            chunks=_chunk_map(body.get("chunks", {})),
            layout=layout,
        )
        return aioweb.json_response(
            {
                "epoch": self.state.epoch,
                "heartbeat_interval": self.heartbeat_interval,
                "offline_after": self.state.offline_after,
                "rejected": rejected,
            }
        )

    async def heartbeat(self, request: aioweb.Request) -> aioweb.Response:
        self.metrics.inc("tracker_requests_total", endpoint="heartbeat")
        body = await web.read_json(request)
        load = web.field_of(body, "load", int, required=False) or 0
        reply = self.state.heartbeat(
            node=_name(body),
            now=time.monotonic(),
            load=load,
            counters=_counters(body.get("counters", {})),
            chunks=_chunk_list(body.get("chunks", [])),
            verified_digest=_hash(body.get("verified_digest"), "verified_digest"),
            hash_cursor=_int_or(body, "hash_cursor", 0),
            epoch=web.field_of(body, "epoch", str, required=False),
            avail_version=_int_or(body, "avail_version", -1),
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
            }
        )

    async def get_manifest(self, request: aioweb.Request) -> aioweb.Response:
        layout = self.state.layout
        return aioweb.json_response(
            {
                "layout": layout.to_dict() if layout is not None else None,
                "chunk_hashes": list(self.state.hashes),
                "digest": self.state.digest,
            }
        )

    async def put_manifest(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        layout = manifest.Layout.from_dict(web.field_of(body, "layout", dict))
        hashes = web.field_of(body, "chunk_hashes", list, required=False)
        self.state.publish(node=_name(body), layout=layout, hashes=hashes, now=time.monotonic())
        return aioweb.json_response({"ok": True, "digest": self.state.digest})

    async def claim(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        count = web.field_of(body, "count", int)
        if not 0 < count <= 1024:
            raise web.problem(400, "bad_field", "field 'count' must be between 1 and 1024")
        chunks = self.state.claim_origin(node=_name(body), count=count, now=time.monotonic())
        return aioweb.json_response({"chunks": chunks})

    async def peers(self, request: aioweb.Request) -> aioweb.Response:
        self.metrics.inc("tracker_requests_total", endpoint="peers")
        try:
            chunk = int(request.query.get("chunk", ""))
        except ValueError as exc:
            raise web.problem(400, "bad_query", "query parameter 'chunk' must be an integer") from exc
        node = request.query.get("node", "")
        now, index = time.monotonic(), _index(chunk, "chunk")
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
        chunk = _index(web.field_of(body, "chunk", int), "chunk")
        self.state.report(reporter=_name(body), peer=_name(body, "peer"), chunk=chunk, now=time.monotonic())
        return aioweb.json_response({"ok": True})

    async def status(self, request: aioweb.Request) -> aioweb.Response:
        return aioweb.json_response(self.state.status(now=time.monotonic()))
