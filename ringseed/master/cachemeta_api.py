"""HTTP/JSON endpoints of the master's cache role (``ringseed master --role cache``).

Owns the wire format; the cache agents (``ringseed/cache/master_client.py``) and the other
master replica are its clients. Every endpoint needs the group's bearer token; bodies are
capped and checked; errors are JSON ``{"error", "reason"}``. On a follower every agent endpoint
answers 503 ``not_leader`` with ``X-Ringseed-Leader: <url>`` (docs/contracts.md).

Agent endpoints (leader):
- ``POST /v1/cache/register`` ``{node, url, session, group, chunks: [sha], free_bytes}`` ->
  ``{term, heartbeat_interval, offline_after, replicas, sink}``
- ``POST /v1/cache/heartbeat`` ``{node, added: [sha], dropped: [sha], free_bytes}`` ->
  ``{term, persist: [[path, version]], copy: [[path, version]], evictable_add, evictable_remove, drop}``
  (``copy``: checkpoints this node pulls a complete copy of, because a holder was lost)
- ``POST /v1/cache/place`` ``{node, count?, exclude?: [node]}`` -> ``{replicas: [{name, url}]}``
  (``count`` defaults to ``replicas - 1``)
- ``POST /v1/cache/commit`` ``{node, write_id, files: [{path, size, chunks: [[sha, len]]}],
  copies: [node]}`` -> ``{versions: [int], duplicate}``; ``copies`` are the nodes that hold
  every chunk now (they count as holders at once).
- ``POST /v1/cache/rename`` ``{src, dst}``; ``POST /v1/cache/delete`` ``{path, recursive}``
- ``POST /v1/cache/persisted`` ``{node, path, version}``
- ``GET /v1/cache/stat?path=P`` -> an object (``type: "file"``) or ``{type: "directory", path}``
- ``GET /v1/cache/list?path=P`` -> ``{files: [object], dirs: [path]}``
- ``GET /v1/cache/object?path=P&node=N`` -> the object plus ``sources``: per chunk the online
  holders ``[[name, url]]`` other than ``N``; ``settling``: seconds during which a new leader
  still expects agents to re-register (holders may be missing until then).
Dataset endpoints (``/v1/data/*``): :mod:`ringseed.master.cachedata`.
Replica endpoints: ``POST /v1/replica/follow`` ``{instance, url, seq, term}`` (on the leader),
``POST /v1/replica/snapshot`` ``{term, leader, leader_url, snapshot}`` and
``POST /v1/replica/append`` ``{term, leader, leader_url, entries: [[seq, entry]]}`` (on the
follower). ``GET /v1/status`` (both) and ``GET /metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web as aioweb

from ringseed import web
from ringseed.master import cachedata, cachemeta
from ringseed.master import election as locks
from ringseed.protocol import cachelog, cachenodes
from ringseed.protocol import cacheobjects as objects

Handler = Callable[[aioweb.Request], Awaitable[aioweb.StreamResponse]]
MASTER_KEY = aioweb.AppKey("cache_master", cachemeta.CacheMaster)
_ERRORS = (cachelog.MetaError, cachemeta.NotLeader, locks.LockError, ValueError)
MAX_LIST = 100_000


def create_app(*, token: str, lock: locks.Lock, settings: cachemeta.Settings) -> aioweb.Application:
    master = cachemeta.CacheMaster(token=token, lock=lock, settings=settings)
    app = web.make_app(token=token, max_body_bytes=cachemeta.SNAPSHOT_BODY_BYTES)
    app[MASTER_KEY] = master
    api = _Api(master)
    for path, handler in (
        ("/v1/cache/register", api.register),
        ("/v1/cache/heartbeat", api.heartbeat),
        ("/v1/cache/place", api.place),
        ("/v1/cache/commit", api.commit),
        ("/v1/cache/rename", api.rename),
        ("/v1/cache/delete", api.delete),
        ("/v1/cache/persisted", api.persisted),
        ("/v1/replica/follow", api.follow),
        ("/v1/replica/append", api.append),
    ):
        app.router.add_post(path, _guard(handler, limit=cachemeta.MAX_BODY_BYTES))
    app.router.add_post("/v1/replica/snapshot", _guard(api.snapshot, limit=cachemeta.SNAPSHOT_BODY_BYTES))
    app.router.add_get("/v1/cache/stat", _guard(api.stat))
    app.router.add_get("/v1/cache/list", _guard(api.listing))
    app.router.add_get("/v1/cache/object", _guard(api.object))
    app.router.add_get("/v1/status", _guard(api.status))
    app.router.add_get("/metrics", api.metrics.handler(api.refresh_metrics))
    api.data = cachedata.routes(app, master, _guard)
    app.cleanup_ctx.append(cachemeta.lifecycle(master))
    return app


def _guard(handler: Handler, *, limit: int = cachemeta.MAX_BODY_BYTES) -> Handler:
    async def guarded(request: aioweb.Request) -> aioweb.StreamResponse:
        if (request.content_length or 0) > limit:
            raise web.problem(413, "body_too_large", f"request body exceeds the limit of {limit} bytes")
        try:
            return await handler(request)
        except _ERRORS as exc:
            raise cachemeta.problem_for(exc) from exc

    return guarded


def _name(body: dict[str, Any], key: str = "node") -> str:
    value: str = web.field_of(body, key, str)
    if not 0 < len(value) <= 253:
        raise web.problem(400, "bad_field", f"field {key!r} must be 1 to 253 characters")
    return value


def _shas(body: dict[str, Any], key: str) -> list[str]:
    raw = web.field_of(body, key, list, required=False) or []
    for i, sha in enumerate(raw):
        objects.check_sha256(sha, what=f"{key}[{i}]")
    return list(raw)


def _count(body: dict[str, Any], key: str) -> int:
    value = web.field_of(body, key, int, required=False) or 0
    if value < 0:
        raise web.problem(400, "bad_field", f"field {key!r} must not be negative")
    return int(value)


def _path_query(request: aioweb.Request, *, directory: bool = False) -> str:
    raw = request.query.get("path", "")
    return objects.check_dir(raw) if directory else objects.check_path(raw)


class _Api:
    """Request handlers; each checks its body, then makes one call on the master."""

    def __init__(self, master: cachemeta.CacheMaster) -> None:
        self.master = master
        self.data = cachedata.DataState()
        self.metrics = web.Metrics()
        self.metrics.declare("cache_master_leading", "gauge", "1 on the leader")
        self.metrics.declare("cache_master_seq", "gauge", "metadata log position")
        self.metrics.declare("cache_master_objects", "gauge", "committed objects")
        self.metrics.declare("cache_master_nodes", "gauge", "registered cache agents")

    def refresh_metrics(self) -> None:
        m = self.master
        self.metrics.set("cache_master_leading", 1 if m.leading else 0)
        self.metrics.set("cache_master_seq", m.meta.seq)
        self.metrics.set("cache_master_objects", len(m.meta.objects))
        self.metrics.set("cache_master_nodes", len(m.nodes.nodes))

    @property
    def leader(self) -> cachemeta.CacheMaster:
        self.master.require_leader()
        return self.master

    async def register(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        m = self.leader
        self.data.current(m).flights.drop_claims(_name(body))  # a restarted agent reads nothing it claimed
        m.nodes.register(
            name=_name(body),
            url=web.field_of(body, "url", str),
            session=web.field_of(body, "session", str),
            group=web.field_of(body, "group", str, required=False) or "",
            chunks=_shas(body, "chunks"),
            free_bytes=_count(body, "free_bytes"),
            now=time.monotonic(),
        )
        return aioweb.json_response(
            {
                "term": m.term,
                "heartbeat_interval": m.settings.heartbeat_interval,
                "offline_after": m.settings.offline_after,
                "replicas": m.settings.replicas,
                "sink": m.settings.sink,
            }
        )

    async def heartbeat(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        m = self.leader
        data = self.data.current(m)
        data.count(_name(body), body.get("data"))
        duties = m.nodes.heartbeat(
            name=_name(body),
            now=time.monotonic(),
            added=_shas(body, "added"),
            dropped=_shas(body, "dropped"),
            free_bytes=_count(body, "free_bytes"),
            meta=m.meta,
            sink=m.settings.sink,
            keep=data.flights.referenced(),
            replicas=0 if m.settling() > 0 else m.settings.replicas,  # a new leader: holders known in full first
        )
        drop = [] if m.lost else duties.drop  # metadata incomplete: an "orphan" may be a lost object's
        return aioweb.json_response(
            {
                "term": m.term,
                "persist": [[p, v] for p, v in duties.persist],
                "copy": [[p, v] for p, v in duties.copy],
                "evictable_add": duties.evictable_add,
                "evictable_remove": duties.evictable_remove,
                "drop": drop,
            }
        )

    async def place(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        m = self.leader
        exclude = [str(n) for n in web.field_of(body, "exclude", list, required=False) or []]
        count = web.field_of(body, "count", int, required=False) or m.settings.replicas - 1
        try:
            chosen = m.nodes.place(writer=_name(body), count=count, exclude=exclude)
        except cachenodes.NotEnoughNodes as exc:
            if m.settling() > 0:  # a new leader: agents are still re-registering
                raise web.problem(503, "settling", f"{exc}; agents are still registering with this new leader") from exc
            raise
        return aioweb.json_response({"replicas": [{"name": n.name, "url": n.url} for n in chosen]})

    async def commit(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        node = _name(body)
        files = web.field_of(body, "files", list)
        if not all(isinstance(f, dict) for f in files):
            raise web.problem(400, "bad_field", "field 'files' must be a list of objects")
        write_id = web.field_of(body, "write_id", str)
        copies = [str(c) for c in web.field_of(body, "copies", list, required=False) or [node]]
        m = self.leader
        result = await m.write(
            lambda: m.meta.prepare_commit(write_id=write_id, writer=node, time=time.time(), files=files)
        )
        shas = [c[0] for f in files for c in f.get("chunks", [])]
        for name in copies:
            m.nodes.hold(name, shas)
        return aioweb.json_response(result)

    async def rename(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        src, dst = web.field_of(body, "src", str), web.field_of(body, "dst", str)
        m = self.leader
        return aioweb.json_response(await m.write(lambda: m.meta.prepare_rename(src=src, dst=dst)))

    async def delete(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        path = web.field_of(body, "path", str)
        recursive = bool(web.field_of(body, "recursive", bool, required=False))
        m = self.leader
        return aioweb.json_response(await m.write(lambda: m.meta.prepare_delete(path=path, recursive=recursive)))

    async def persisted(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        path = objects.check_path(web.field_of(body, "path", str))
        version = web.field_of(body, "version", int)
        m = self.leader
        return aioweb.json_response(await m.write(lambda: m.meta.prepare_persisted(path=path, version=version)))

    async def stat(self, request: aioweb.Request) -> aioweb.Response:
        path = _path_query(request, directory=True)
        m = self.leader
        if path and path in m.meta.objects:
            return aioweb.json_response(dict(m.meta.objects[path].to_dict(), type="file"))
        if path == "" or m.meta.is_dir(path):
            return aioweb.json_response({"type": "directory", "path": path})
        raise cachelog.NotFound(f"no file or directory {path!r}")

    async def listing(self, request: aioweb.Request) -> aioweb.Response:
        path = _path_query(request, directory=True)
        m = self.leader
        if path in m.meta.objects:
            return aioweb.json_response({"files": [m.meta.objects[path].to_dict()], "dirs": []})
        files, dirs = objects.listing(m.meta.objects, path)
        if not files and not dirs and path != "":
            raise cachelog.NotFound(f"no directory {path!r}")
        if len(files) + len(dirs) > MAX_LIST:
            raise web.problem(413, "too_many", f"{path!r} holds more than {MAX_LIST} entries")
        return aioweb.json_response({"files": [m.meta.objects[f].to_dict() for f in files], "dirs": dirs})

    async def object(self, request: aioweb.Request) -> aioweb.Response:
        path = _path_query(request)
        node = request.query.get("node", "")
        m = self.leader
        meta = m.meta.get(path)
        sources = [[[n.name, n.url] for n in m.nodes.holders_of(c.sha256, exclude=node)] for c in meta.chunks]
        return aioweb.json_response(dict(meta.to_dict(), type="file", sources=sources, settling=m.settling()))

    async def follow(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        m = self.leader
        m.add_follower(instance=web.field_of(body, "instance", str), url=web.field_of(body, "url", str))
        return aioweb.json_response({"ok": True, "term": m.term})

    async def snapshot(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        seq = self.master.accept_snapshot(
            term=web.field_of(body, "term", int),
            leader_url=web.field_of(body, "leader_url", str),
            snapshot=web.field_of(body, "snapshot", dict),
        )
        return aioweb.json_response({"seq": seq})

    async def append(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        seq = self.master.accept_entries(
            term=web.field_of(body, "term", int),
            leader_url=web.field_of(body, "leader_url", str),
            entries=web.field_of(body, "entries", list),
        )
        return aioweb.json_response({"seq": seq})

    async def status(self, request: aioweb.Request) -> aioweb.Response:
        status = self.master.status()
        if self.master.leading:
            status["data"] = self.data.current(self.master).status(self.master)
        return aioweb.json_response(status)
