"""The cache agent's local API: what the SDK (``ringseed.fs``) and the FUSE mount on this node call.

Owns the wire format between a training process and its node's agent (docs/contracts.md, "Cache
local API"). It is served on a Unix socket (``--socket``) shared with the group's pods; bytes
never cross it: writers fill tmpfs buffers the agent allocated (``buffers/``) and readers read
chunk files straight from the tiers, so the socket carries only small JSON requests.

Endpoints (bearer token; errors ``{"error", "reason"}``):
- ``GET /v1/local/info`` -> ``{node, group, chunk_size, replicas, sink, data_sources: [name], list_ttl}``
- ``POST /v1/local/writes`` ``{path}`` -> ``{write_id, chunk_size, buffers}`` (path checked,
  replicas placed; ``buffers`` is the buffer directory)
- ``POST /v1/local/writes/{id}/buffer`` -> ``{name, path, size}``: a buffer to fill (waits while
  the cache is full; 507 ``cache_full`` after the deadline)
- ``POST /v1/local/writes/{id}/chunk`` ``{index, buffer, length, next?}`` -> ``{next?: buffer}``:
  the buffer holds chunk ``index`` (``length`` bytes) and belongs to the agent from now on
- ``POST /v1/local/writes/{id}/finish`` ``{size, commit}`` -> when every chunk is held here and
  on the replicas: with ``commit`` the file is recorded and ``{path, version, size, copies}``
  returned (the acknowledgement); without, ``{pending: true}`` until ``/v1/local/commit``
- ``POST /v1/local/commit`` ``{write_ids}`` -> ``{files: [{path, version}]}``: finished writes of
  one transaction recorded together (all visible at once)
- ``DELETE /v1/local/writes/{id}``: abort
- ``GET /v1/local/stat?path=P``, ``GET /v1/local/list?path=P``, ``POST /v1/local/rename``
  ``{src, dst}``, ``POST /v1/local/delete`` ``{path, recursive}``: the master's answers, passed on
- ``POST /v1/local/open`` ``{path}`` -> ``{path, version, size, chunks}``
- ``POST /v1/local/read`` ``{path, version, indices}`` -> ``{files: [{index, file, length}]}``:
  the chunks are local and verified, and each file stays in place for the read lease
- Datasets (``data/<name>/...``; the SDK computes files, sizes and listings from the revision):
  ``GET /v1/local/data/revision?source=NAME`` -> ``{source, id, revision: Revision.to_dict(), ttl,
  lease, hold}``; ``POST /v1/local/data/chunks`` ``{source, revision, chunks: [index], release?:
  [[revision, index]]}`` -> ``{files: [{chunk, file, length}]}``: local, verified, leased until
  released or ``lease`` seconds (409 ``changed`` when the revision is gone). A reader keeps at most
  ``hold`` chunk files leased and releases the ones it let go with its next request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web as aioweb

from ringseed import web
from ringseed.cache import chunks, data, master_client, reads, writes
from ringseed.protocol import cacheobjects as objects

if TYPE_CHECKING:
    from ringseed.cache.service import CacheAgent

Handler = Callable[[aioweb.Request], Awaitable[aioweb.StreamResponse]]
MAX_READ_INDICES = 256
OPEN_CACHE = 1024
_WRITE_STATUS = {
    "cache_full": 507,
    "not_enough_nodes": 409,
    "unknown_write": 404,
    "replica_failed": 503,
    "master_unavailable": 503,
    "write_failed": 503,
    "conflict": 409,
}
_DATA_STATUS = {"not_found": 404, "changed": 409, "unavailable": 503, "cache_full": 507, "bad_index": 400}
_READ_STATUS = {"not_found": 404, "unavailable": 503, "master_unavailable": 503, "cache_full": 507, "changed": 409}


def create_app(agent: CacheAgent) -> aioweb.Application:
    app = web.make_app(token=agent.config.token, max_body_bytes=4 << 20)
    api = LocalApi(agent)
    app.router.add_get("/v1/local/info", _guard(api.info))
    app.router.add_post("/v1/local/writes", _guard(api.open_write))
    app.router.add_post("/v1/local/writes/{id}/buffer", _guard(api.buffer))
    app.router.add_post("/v1/local/writes/{id}/chunk", _guard(api.chunk))
    app.router.add_post("/v1/local/writes/{id}/finish", _guard(api.finish))
    app.router.add_delete("/v1/local/writes/{id}", _guard(api.abort))
    app.router.add_post("/v1/local/commit", _guard(api.commit))
    app.router.add_get("/v1/local/stat", _guard(api.stat))
    app.router.add_get("/v1/local/list", _guard(api.listing))
    app.router.add_post("/v1/local/rename", _guard(api.rename))
    app.router.add_post("/v1/local/delete", _guard(api.delete))
    app.router.add_post("/v1/local/open", _guard(api.open_read))
    app.router.add_post("/v1/local/read", _guard(api.read))
    app.router.add_get("/v1/local/data/revision", _guard(api.data_revision))
    app.router.add_post("/v1/local/data/chunks", _guard(api.data_chunks))
    return app


def _guard(handler: Handler) -> Handler:
    async def guarded(request: aioweb.Request) -> aioweb.StreamResponse:
        try:
            return await handler(request)
        except objects.PathError as exc:
            raise web.problem(400, "bad_path", str(exc)) from exc
        except writes.WriteError as exc:
            raise web.problem(_WRITE_STATUS.get(exc.code, 400), exc.code, str(exc)) from exc
        except reads.ReadError as exc:
            raise web.problem(_READ_STATUS.get(exc.code, 400), exc.code, str(exc)) from exc
        except master_client.Refused as exc:
            raise web.problem(exc.status, exc.error or "refused", exc.reason) from exc
        except master_client.Unavailable as exc:
            raise web.problem(503, "master_unavailable", str(exc)) from exc
        except data.DataError as exc:
            raise web.problem(_DATA_STATUS.get(exc.code, 400), exc.code, str(exc)) from exc

    return guarded


def _buffer_answer(agent: CacheAgent, name: str, size: int) -> dict[str, Any]:
    return {"name": name, "path": str(agent.store.buffers_dir / name), "size": size}


class LocalApi:
    def __init__(self, agent: CacheAgent) -> None:
        self.agent = agent
        self.opened: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()

    async def info(self, request: aioweb.Request) -> aioweb.Response:
        c = self.agent.config
        return aioweb.json_response(
            {
                "node": c.node_name,
                "group": c.group,
                "chunk_size": c.chunk_size,
                "replicas": self.agent.replicas,
                "sink": c.sink,
                "data_sources": sorted(c.data_sources),
                "list_ttl": c.list_ttl,
            }
        )

    async def open_write(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        session = await self.agent.writes.open(web.field_of(body, "path", str))
        return aioweb.json_response(
            {
                "write_id": session.id,
                "chunk_size": self.agent.config.chunk_size,
                "buffers": str(self.agent.store.buffers_dir / "."),
            }
        )

    async def buffer(self, request: aioweb.Request) -> aioweb.Response:
        session = self.agent.writes.get(request.match_info["id"])
        name, size = await self.agent.writes.buffer(session)
        return aioweb.json_response(_buffer_answer(self.agent, name, size))

    async def chunk(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        session = self.agent.writes.get(request.match_info["id"])
        if session.failed:
            raise writes.WriteError("replica_failed", session.failed)
        self.agent.writes.submit(
            session,
            index=web.field_of(body, "index", int),
            buffer=web.field_of(body, "buffer", str),
            length=web.field_of(body, "length", int),
        )
        answer: dict[str, Any] = {}
        if web.field_of(body, "next", bool, required=False):
            name, size = await self.agent.writes.buffer(session)
            answer["next"] = _buffer_answer(self.agent, name, size)
        return aioweb.json_response(answer)

    async def finish(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        write_id = request.match_info["id"]
        session = self.agent.writes.get(write_id)
        size = web.field_of(body, "size", int)
        try:
            entry, copies = await self.agent.writes.finish(session, size=size)
        except writes.WriteError:
            self.agent.writes.abort(session)
            raise
        if not web.field_of(body, "commit", bool, required=False):
            return aioweb.json_response({"pending": True})
        result = await self.agent.writes.commit(write_id, [entry], copies)
        self.agent.writes.close(session)
        return aioweb.json_response(
            {"path": entry["path"], "version": result["versions"][0], "size": size, "copies": copies}
        )

    async def commit(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        ids = web.field_of(body, "write_ids", list)
        sessions = [self.agent.writes.get(str(i)) for i in ids]
        missing = [s.id for s in sessions if s.done is None]
        if missing or not sessions:
            raise writes.WriteError("not_finished", f"writes {missing} are not finished (call finish first)")
        files = [s.done[0] for s in sessions if s.done is not None]
        copies = sorted(set.intersection(*(set(s.done[1]) for s in sessions if s.done is not None)))
        result = await self.agent.writes.commit("+".join(sorted(str(i) for i in ids))[:128], files, copies)
        for session in sessions:
            self.agent.writes.close(session)
        return aioweb.json_response(
            {"files": [{"path": f["path"], "version": v} for f, v in zip(files, result["versions"], strict=True)]}
        )

    async def abort(self, request: aioweb.Request) -> aioweb.Response:
        session = self.agent.writes.sessions.get(request.match_info["id"])
        if session is not None:
            self.agent.writes.abort(session)
        return aioweb.json_response({"ok": True})

    async def stat(self, request: aioweb.Request) -> aioweb.Response:
        return aioweb.json_response(await self.agent.master.stat(objects.check_dir(request.query.get("path", ""))))

    async def listing(self, request: aioweb.Request) -> aioweb.Response:
        return aioweb.json_response(await self.agent.master.listing(objects.check_dir(request.query.get("path", ""))))

    async def rename(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        src, dst = web.field_of(body, "src", str), web.field_of(body, "dst", str)
        return aioweb.json_response(await self.agent.master.rename(src=src, dst=dst))

    async def delete(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        recursive = bool(web.field_of(body, "recursive", bool, required=False))
        return aioweb.json_response(
            await self.agent.master.delete(path=web.field_of(body, "path", str), recursive=recursive)
        )

    async def data_revision(self, request: aioweb.Request) -> aioweb.Response:
        dataset = self.agent.datasets.get(request.query.get("source", ""))
        current = await dataset.revision()
        return aioweb.json_response(
            {
                "source": dataset.name,
                "id": current.id,
                "revision": current.revision.to_dict(),
                "ttl": self.agent.config.list_ttl,
                "lease": self.agent.config.read_lease,
                "hold": self.hold(),
            }
        )

    def hold(self) -> int:
        """How many chunk files one reader may keep leased: a quarter of the memory tier, at least one."""
        book = self.agent.store.book
        return max(1, book.limit(chunks.MEMORY) // max(1, self.agent.config.chunk_size) // 4)

    async def data_chunks(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        dataset = self.agent.datasets.get(web.field_of(body, "source", str))
        rev_id = web.field_of(body, "revision", str)
        indices = web.field_of(body, "chunks", list)
        if len(indices) > MAX_READ_INDICES or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
            raise web.problem(400, "bad_indices", f"chunks must be up to {MAX_READ_INDICES} chunk numbers")
        for old_rev, old_chunk in web.field_of(body, "release", list, required=False) or []:
            sha = dataset.known_hash(str(old_rev), int(old_chunk))
            if sha is not None:
                self.agent.store.book.unlease(sha)
                self.agent.store.changed.set()
        files = await asyncio.gather(*(self._data_chunk(dataset, rev_id, i) for i in indices))
        return aioweb.json_response({"files": files})

    async def _data_chunk(self, dataset: data.Dataset, rev_id: str, index: int) -> dict[str, Any]:
        while True:
            sha = await dataset.chunk(rev_id, index)
            with contextlib.suppress(KeyError):  # evicted between the fetch and now: fetch again
                path = self.agent.store.lease(sha, seconds=self.agent.config.read_lease)
                return {"chunk": index, "file": str(path), "length": self.agent.store.book.entries[sha].size}

    async def open_read(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        meta = await self.agent.reads.describe(web.field_of(body, "path", str))
        self._remember(meta)
        return aioweb.json_response({k: meta[k] for k in ("path", "version", "size", "chunks", "persisted")})

    def _remember(self, meta: dict[str, Any]) -> None:
        self.opened[(meta["path"], int(meta["version"]))] = meta
        self.opened.move_to_end((meta["path"], int(meta["version"])))
        while len(self.opened) > OPEN_CACHE:
            self.opened.popitem(last=False)

    async def read(self, request: aioweb.Request) -> aioweb.Response:
        body = await web.read_json(request)
        path = objects.check_path(web.field_of(body, "path", str))
        version = web.field_of(body, "version", int)
        indices = web.field_of(body, "indices", list)
        meta = self.opened.get((path, version))
        if meta is None:
            meta = await self.agent.reads.describe(path)
            if int(meta["version"]) != version:
                raise reads.ReadError("changed", f"{path!r} was rewritten (version {meta['version']}); open it again")
            self._remember(meta)
        if len(indices) > MAX_READ_INDICES or not all(
            isinstance(i, int) and 0 <= i < len(meta["chunks"]) for i in indices
        ):
            raise web.problem(400, "bad_indices", f"indices must be up to {MAX_READ_INDICES} chunk numbers of {path!r}")
        files = await asyncio.gather(*(self._local(meta, index) for index in indices))
        return aioweb.json_response({"files": files})

    async def _local(self, meta: dict[str, Any], index: int) -> dict[str, Any]:
        """Chunk ``index`` made local and leased: no await between the check and the lease."""
        sha, length = meta["chunks"][index]
        while True:
            await self.agent.reads.ensure(meta, index)
            with contextlib.suppress(KeyError):  # evicted between the fetch and now: fetch again
                path = self.agent.store.lease(sha, seconds=self.agent.config.read_lease)
                return {"index": index, "file": str(path), "length": length}
