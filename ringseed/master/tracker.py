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
  revision?: Revision.to_dict()}`` -> ``{epoch, heartbeat_interval, early_gap, offline_after,
  rejected: [index], revision: id|null, announce_runs: true}`` (chunks of another revision than the
  tracker's are all rejected; ``announce_runs``: heartbeats may carry ``runs`` and ``sources``)
- ``POST /v1/heartbeat`` ``{node, load?, counters?: {origin_bytes, fetched_bytes, uploaded_bytes},
  chunks?: [[index, hash|null, from?]], runs?: [[first, count]], sources?: [[index, node]],
  dropped?: [index], verified_digest?, since?: int|null,
  epoch?, problem?: {reason, message}|null, revision?: str|null}``
  -> ``{epoch, origin_duty, rejected, layout_known, suspect: [index], revision: id|null,
  revision_confirmed, heartbeat_interval, early_gap}`` plus the *view* (below).
  ``heartbeat_interval`` and ``early_gap`` are the node's pace (:mod:`ringseed.protocol.pacing`):
  heartbeat every ``heartbeat_interval`` seconds, and when there is news to tell (a verified
  chunk, a drop, a problem) no sooner than ``early_gap`` seconds after the last heartbeat. Both
  grow with the swarm so that it sends at most ``--heartbeat-rate`` heartbeats per second
  (nodes on origin duty and ``--front-seats`` nodes that last announced a chunk at most 4 nodes
  hold keep the base gap);
  a node waiting for news of chunks watches (below) instead of heartbeating.
  ``chunks`` are batched announcements of verified chunks; a hash rides along only from the
  origin-duty node; ``from`` names the node the chunk was fetched (or streamed) from, null or
  absent when it came from the origin: it is the evidence that the node serves good chunks.
  ``runs`` announce chunks ``first .. first + count - 1`` (no hash, no source) in bulk and
  ``sources`` (at most ``MAX_SOURCES``) name where some of them came from
  (:mod:`ringseed.protocol.announcements`: a heartbeat of ~200 chunks is a run or two).
  A body with ``index_runs: true`` (heartbeat or watch) gets the view's chunk lists (``avail``
  values, ``pulling``, ``pulling_stopped``) as runs ``[[first, count]]``, and the reply says
  ``index_runs: true``.
  ``dropped`` lists chunks the node no longer holds (processed before ``chunks``).
  ``problem`` is the node's current blocking problem (``reason`` CamelCase, at most 64
  characters; ``message`` one sentence, whitespace folded and cut to ``MAX_MESSAGE``
  characters) or null when it has none; ``revision`` the source revision of the copy it holds
  (at most 128 of ``[A-Za-z0-9._:+-]``); either left out means unchanged. Counters are integers
  in ``[0, 2**63 - 1]``, ``load`` in ``[0, MAX_LOAD]``. ``suspect`` lists chunks of this
  node that other nodes reported bad: the tracker no longer lists it as their holder, and it
  should check them (drop or announce again). A reply repeats them until then. A node whose
  ``revision`` is not the tracker's gets an empty view (``version: -1``) and its chunks are
  ignored; the reply's ``revision`` (the swarm's) tells it which revision to move to.
- The *view* (:class:`ringseed.protocol.tracker.View`): ``{version, full, availability?,
  avail?: {level: [index]}, hash_runs?: [[first, base64]], pulling?: [index], pulling_stopped?:
  [index]}``, absent keys empty; ``hash_runs`` are the hashes learned as runs of binary digests
  of consecutive chunks (:mod:`ringseed.protocol.digests`). ``since`` names the ``version`` of the last view the node
  absorbed (with ``epoch``; null or absent: none). ``full``: ``availability`` is every chunk's
  level and ``pulling`` every chunk being pulled (replace). Otherwise ``avail`` maps a level
  (0, 1, 2, 4, ...) to the chunks the node lacks that reached it since ``since``,
  ``pulling``/``pulling_stopped`` the pulls that started/ended, ``hash_runs`` the hashes
  learned (of chunks the node lacks), and with ``--heartbeat-replies full`` ``availability`` is the
  whole vector of exact counts whenever one changed. A view whose ``version`` is below the
  node's current one is stale (a reply that crossed a newer one) and is skipped.
- ``POST /v1/watch`` ``{node, since, epoch, chunks?: [index]|null, wait}`` -> ``{epoch}`` plus the
  view: a long-poll held until a watched chunk (at most 64; null: any chunk the node lacks) gets
  a new copy or starts being pulled, or ``wait`` seconds (at most 30); at once when that
  happened since ``since`` already.
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
import gc
import json
import random
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Container
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web as aioweb

from ringseed import web
from ringseed.master import election as locks
from ringseed.master import replica
from ringseed.protocol import (
    announcements,
    digests,
    election,
    manifest,
    pacing,
    revision,
    tracker,
    tracker_log,
    watches,
)

MAX_BODY_BYTES = 16 << 20
MAX_INDEX = (1 << 31) - 1
MAX_COUNTER = (1 << 63) - 1
MAX_LOAD = 1 << 20
MAX_MESSAGE = 512
MAX_SOURCES = 256  # ``sources`` entries per heartbeat
GC_FULL_EVERY = 600.0  # seconds between full collections under --gc-freeze-every
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
_dumps = json.JSONEncoder(separators=(",", ":")).encode  # (one encoder: json.dumps with options builds one a call)


def _encode(out: dict[str, Any]) -> str:
    """A view reply as JSON, its ``hash_runs`` spliced in as text: base64 needs no escaping,
    and the encoder's walk of it cost ~20 us per 8 KB (a paced reply at 10,000 agents)."""
    runs = out.pop("hash_runs", None)
    text = _dumps(out)
    if not runs:
        return text
    spliced = ",".join(f'[{first:d},"{b64}"]' for first, b64 in runs)
    return f'{text[:-1]},"hash_runs":[{spliced}]}}'


REPLICA_KEY = aioweb.AppKey("tracker_replica", replica.SoftReplica)


def create_app(
    *,
    token: str,
    offline_after: float,
    heartbeat_interval: float,
    seeders: int,
    replies: tracker_log.Replies = tracker_log.Replies.DELTA,
    lock: locks.Lock | None = None,
    url: str = "",
    heartbeat_rate: float | None = pacing.DEFAULT_RATE,
    early_gap: float = pacing.DEFAULT_GAP,
    front_seats: int = pacing.DEFAULT_FRONT_SEATS,
    heartbeat_jitter: float = pacing.DEFAULT_JITTER,
    gc_freeze_every: float = 0.0,
    gc_full_every: float = GC_FULL_EVERY,
) -> aioweb.Application:
    """The tracker-role application; ``replies``: how heartbeat replies tell availability
    (``FULL``: the behaviour before deltas, for comparison); ``lock``: this replica leads only
    while it holds it (:mod:`ringseed.master.replica`; None: a single replica), ``url`` is where
    it answers (named to followers' callers); ``heartbeat_rate``: heartbeats per second the
    swarm's pace aims at (None: every node keeps ``heartbeat_interval`` and ``early_gap``);
    ``front_seats``: nodes at the front of the pipeline that keep ``early_gap``;
    ``heartbeat_jitter``: the spread of a scaled pace (:mod:`ringseed.protocol.pacing`);
    ``gc_freeze_every``/``gc_full_every``: the collector's policy (:func:`_gc_loop`; 0: Python's own)."""
    settings = _Settings(
        offline_after=offline_after,
        heartbeat_interval=heartbeat_interval,
        seeders=seeders,
        replies=replies,
        heartbeat_rate=heartbeat_rate,
        early_gap=early_gap,
        front_seats=front_seats,
        heartbeat_jitter=heartbeat_jitter,
    )
    api = _Api(settings)
    timing = election.lease_timing(takeover_within=offline_after)
    poll = 0.2 if isinstance(lock, locks.FileLock) else timing.poll_every
    api.replica = replica.SoftReplica(lock=lock, url=url, poll_every=poll, on_lead=api.install, role="tracker")
    app = web.make_app(token=token, max_body_bytes=MAX_BODY_BYTES, errors=ERRORS)
    app.middlewares.append(_leader_only(api.replica))
    app[REPLICA_KEY] = api.replica
    app.router.add_post("/v1/register", api.register)
    app.router.add_post("/v1/heartbeat", api.heartbeat)
    app.router.add_post("/v1/watch", api.watch)
    app.router.add_get("/v1/manifest", api.get_manifest)
    app.router.add_put("/v1/manifest", api.put_manifest)
    app.router.add_post("/v1/origin/claim", api.claim)
    app.router.add_get("/v1/peers", api.peers)
    app.router.add_post("/v1/report", api.report)
    app.router.add_get("/v1/status", api.status)
    app.router.add_get("/readyz", api.ready)
    app.router.add_get("/metrics", api.metrics.handler(api.refresh_metrics))
    app.cleanup_ctx.append(replica.lifecycle(api.replica))
    app.cleanup_ctx.append(_purge_loop(api, every=min(1.0, offline_after / 4)))
    if gc_freeze_every > 0:
        app.cleanup_ctx.append(_gc_loop(freeze_every=gc_freeze_every, full_every=gc_full_every))
    return app


def _gc_loop(*, freeze_every: float, full_every: float) -> Callable[[aioweb.Application], AsyncIterator[None]]:
    """Every ``freeze_every`` seconds ``gc.freeze()`` (O(1)): what survived until then leaves the
    generations the collector walks; every ``full_every`` seconds ``gc.unfreeze()`` and a full
    collection first, so cyclic garbage frozen meanwhile is freed then (non-cyclic garbage is
    freed by reference counting, frozen or not). Why: in a keep-alive server each request's
    objects replace the previous request's on its connection, so generation 0's count
    (allocations minus deallocations) stays low while survivors pile up in it; at 10,000 agents
    a young collection walked 38,000-119,000 of them, 25-123 ms of CPU (BENCHMARKS section 9,
    session 6). The price: one full collection per ``full_every`` (~0.4 s at 10,000 agents)."""

    async def loop() -> None:
        last_full = time.monotonic()
        while True:
            await asyncio.sleep(freeze_every)
            if time.monotonic() - last_full >= full_every:
                gc.unfreeze()
                gc.collect()
                last_full = time.monotonic()
            gc.freeze()

    return web.background(loop, after=gc.unfreeze)


def _leader_only(seat: replica.SoftReplica) -> Any:
    """Tracker calls (``/v1/...``) on a follower: 503 ``not_leader`` naming the leader."""

    @aioweb.middleware
    async def middleware(request: aioweb.Request, handler: Any) -> aioweb.StreamResponse:
        if not seat.leading and request.path.startswith("/v1/"):
            hint = {web.LEADER_HEADER: seat.leader_url} if seat.leader_url else None
            where = seat.leader_url or "not known yet"
            raise web.problem(503, "not_leader", f"this tracker replica follows; the leader is {where}", headers=hint)
        response: aioweb.StreamResponse = await handler(request)
        return response

    return middleware


def _purge_loop(api: _Api, *, every: float) -> Callable[[aioweb.Application], AsyncIterator[None]]:
    async def loop() -> None:
        while True:
            await asyncio.sleep(every)
            if api.replica.leading:
                api.state.purge(now=time.monotonic())
                api.wake()

    return web.background(loop)


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


def _announcements(body: dict[str, Any], known: Container[str] = ()) -> list[tracker.Announcement]:
    """``chunks`` checked item by item (the hot path of a busy swarm: plain type checks; each
    distinct ``from`` name matched once per body, unless it is in ``known``: names checked before)."""
    out: list[tracker.Announcement] = []
    names: set[str] = set()
    for i, item in enumerate(_list(body, "chunks", "[index, hash|null, from?]")):
        if type(item) is not list or not 2 <= len(item) <= 3:
            raise web.problem(400, "bad_field", f"chunks[{i}] must be [index, hash|null, from?]")
        index, digest = item[0], item[1]
        if type(index) is not int or not 0 <= index <= MAX_INDEX:
            _index(index, f"chunks[{i}][0]")
        if digest is not None:
            _hash(digest, f"chunks[{i}][1]")
        source = item[2] if len(item) == 3 else None
        if source is not None and (type(source) is not str or source not in names):
            if type(source) is not str or source not in known:
                _node_or_null(source, f"chunks[{i}][2]")
            names.add(source)
        out.append((index, digest, source))
    return out


def _runs(body: dict[str, Any]) -> list[tuple[int, int]]:
    """``runs``: ``[[first, count]]``, chunks ``first .. first + count - 1`` (plain type checks per run)."""
    out: list[tuple[int, int]] = []
    for i, item in enumerate(_list(body, "runs", "[first index, count]")):
        if (
            type(item) is not list
            or len(item) != 2
            or type(item[0]) is not int
            or type(item[1]) is not int
            or not 0 <= item[0] <= MAX_INDEX
            or not 1 <= item[1] <= tracker.MAX_CHUNKS
        ):
            raise web.problem(
                400, "bad_field", f"runs[{i}] must be [first index, count] (count 1 to {tracker.MAX_CHUNKS})"
            )
        out.append((item[0], item[1]))
    return out


def _sources(body: dict[str, Any], known: Container[str] = ()) -> list[tuple[int, str]]:
    """``sources``: ``[[index, node]]``, where announced chunks came from (evidence, at most ``MAX_SOURCES``)."""
    raw = _list(body, "sources", "[index, node]")
    if len(raw) > MAX_SOURCES:
        raise web.problem(400, "bad_field", f"field 'sources' names at most {MAX_SOURCES} chunks")
    out: list[tuple[int, str]] = []
    for i, item in enumerate(raw):
        if type(item) is not list or len(item) != 2 or type(item[0]) is not int or not 0 <= item[0] <= MAX_INDEX:
            raise web.problem(400, "bad_field", f"sources[{i}] must be [index, node]")
        source = item[1]
        if type(source) is not str or source not in known:
            source = _node_or_null(source, f"sources[{i}][1]")
            if source is None:
                raise web.problem(400, "bad_field", f"sources[{i}][1] must be a node name")
        out.append((item[0], source))
    return out


def _since(body: dict[str, Any]) -> int | None:
    if body.get("since") is None:
        return None
    return web.integer(body, "since", low=-1, high=MAX_COUNTER)


def _epoch(body: dict[str, Any]) -> str | None:
    return web.text(body, "epoch", max_length=128, pattern=TOKEN, required=False, what="an epoch id")


def _view(view: tracker.View, *, index_runs: bool = False) -> dict[str, Any]:
    """The view's JSON (see the module docstring); empty parts are left out. ``index_runs``
    (the node asked for them): ``avail``, ``pulling`` and ``pulling_stopped`` as runs
    ``[[first, count]]``, and the reply says ``index_runs: true``."""
    out: dict[str, Any] = {"version": view.version, "full": view.full}
    listed: Callable[[list[int]], list[Any]] = announcements.runs_of if index_runs else list
    if index_runs:
        out["index_runs"] = True
    if view.availability is not None:
        out["availability"] = view.availability
    if view.levels:
        out["avail"] = {str(level): listed(indices) for level, indices in view.levels.items()}
    if view.hashes:
        out["hash_runs"] = digests.packed(view.hashes)
    if view.pulling:
        out["pulling"] = listed(view.pulling)
    if view.pulling_stopped:
        out["pulling_stopped"] = listed(view.pulling_stopped)
    return out


def _pace(pace: pacing.Pace | None) -> dict[str, float]:
    if pace is None:
        return {}
    return {"heartbeat_interval": round(pace.interval, 3), "early_gap": round(pace.gap, 3)}  # (ms: ~20 B less)


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


@dataclass(frozen=True)
class _Settings:
    offline_after: float
    heartbeat_interval: float
    seeders: int
    replies: tracker_log.Replies
    heartbeat_rate: float | None
    early_gap: float
    front_seats: int
    heartbeat_jitter: float


class _Api:
    """Request handlers; each translates JSON to one tracker call and back."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings
        self.rng = random.Random()
        self.state = self._fresh()
        self.replica: replica.SoftReplica
        self.waiting: dict[int, asyncio.Future[None]] = {}
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

    def _fresh(self) -> tracker.Tracker:
        return tracker.Tracker(
            epoch=secrets.token_hex(8),
            offline_after=self.settings.offline_after,
            seeders=self.settings.seeders,
            now=time.monotonic(),
            claim_grace=2 * self.settings.heartbeat_interval,
            replies=self.settings.replies,
            budget=pacing.Budget(
                interval=self.settings.heartbeat_interval,
                gap=self.settings.early_gap,
                rate=self.settings.heartbeat_rate,
                front_seats=self.settings.front_seats,
                jitter=self.settings.heartbeat_jitter,
                rng=self.rng,
            ),
        )

    def install(self) -> None:
        """Lead with fresh state (a new epoch: agents re-register with what they hold)."""
        for woken in self.waiting.values():
            if not woken.done():
                woken.set_result(None)
        self.state = self._fresh()

    async def ready(self, request: aioweb.Request) -> aioweb.Response:
        """``/readyz``: 200 on the leader, 503 on a follower (a Service routes to the leader)."""
        leading = self.replica.leading
        body = {"leading": leading, "leader_url": self.replica.leader_url, "term": self.replica.term}
        return aioweb.json_response(body, status=200 if leading else 503)

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
        node = _name(body)
        rejected = self.state.register(
            node=node,
            url=str(web.text(body, "url", max_length=2048, pattern=URL, what="an http(s) URL")),
            session=str(web.text(body, "session", max_length=128, pattern=TOKEN, what="a session id")),
            now=time.monotonic(),
            chunks=_chunk_map(body.get("chunks", {})),
            layout=layout,
            source=source,
        )
        self.wake()
        pace = self.state.pace(node, now=time.monotonic())
        assert pace is not None  # (the master's tracker always has a budget)
        return aioweb.json_response(
            {
                "epoch": self.state.epoch,
                "heartbeat_interval": pace.interval,
                "early_gap": pace.gap,
                "offline_after": self.state.offline_after,
                "rejected": rejected,
                "revision": self.state.revision,
                "announce_runs": True,
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
            chunks=_announcements(body, known=self.state.nodes),
            runs=_runs(body),
            sources=_sources(body, known=self.state.nodes),
            dropped=dropped,
            verified_digest=_hash(body.get("verified_digest"), "field 'verified_digest'"),
            since=_since(body),
            epoch=_epoch(body),
            problem=_problem(body),
            revision=_revision(body),
        )
        self.wake()
        out = {
            "epoch": self.state.epoch,
            "origin_duty": reply.origin_duty,
            "rejected": reply.rejected,
            "layout_known": reply.layout_known,
            "suspect": reply.suspect,
            "revision": reply.revision,
            "revision_confirmed": reply.revision_confirmed,
            **_pace(reply.pace),
            **_view(reply.view, index_runs=body.get("index_runs") is True),
        }
        return aioweb.json_response(out, dumps=_encode)

    async def watch(self, request: aioweb.Request) -> aioweb.Response:
        self.metrics.inc("tracker_requests_total", endpoint="watch")
        body = await web.read_json(request)
        node, since, epoch = _name(body), _since(body), _epoch(body)
        raw = body.get("chunks")
        chunks = None
        if raw is not None:
            listed = _list(body, "chunks", "chunk indices")
            if len(listed) > watches.MAX_CHUNKS:
                raise web.problem(400, "bad_field", f"field 'chunks' names at most {watches.MAX_CHUNKS} chunks")
            chunks = {_index(v, f"chunks[{i}]") for i, v in enumerate(listed)}
        wait = web.field_of(body, "wait", (int, float))
        if not 0 <= wait <= watches.MAX_WAIT:
            raise web.problem(400, "bad_field", f"field 'wait' must be 0 to {watches.MAX_WAIT:g} seconds")
        ticket = self.state.watch(node=node, chunks=chunks, since=since, epoch=epoch, now=time.monotonic(), wait=wait)
        if ticket is not None:
            woken = asyncio.get_running_loop().create_future()
            self.waiting[ticket.id] = woken
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken, timeout=max(0.0, ticket.deadline - time.monotonic()))
            finally:
                self.waiting.pop(ticket.id, None)
                self.state.unwatch(ticket.id)
        view = self.state.view(node=node, since=since, epoch=epoch, now=time.monotonic())
        out = {"epoch": self.state.epoch, **_view(view, index_runs=body.get("index_runs") is True)}
        return aioweb.json_response(out, dumps=_encode)

    def wake(self) -> None:
        """Answer the watches the last change woke."""
        for ticket in self.state.watches.take_woken():
            woken = self.waiting.get(ticket)
            if woken is not None and not woken.done():
                woken.set_result(None)

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
        self.wake()
        return aioweb.json_response({"ok": True, "digest": self.state.digest})

    async def claim(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        count = web.integer(body, "count", low=1, high=1024)
        chunks = self.state.claim_origin(node=_name(body), count=count, now=time.monotonic())
        self.wake()
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
