"""The agent's peer chunk server: ``GET /v1/chunks/{index}`` for verified chunks, and ``/metrics``.

Rules:
- Only verified chunks are served (the agent's ``held`` map); anything else is 404 ``not_held``.
  The index is ASCII digits only (else 400 ``bad_index``). ``?revision=<id>`` names the
  revision the asker holds: a node holding another one answers 409 ``revision_mismatch`` (its
  chunk ``i`` is another chunk). A ``Range`` header is ignored: chunks are sent and verified whole.
- A held chunk's body is written inside the handler (so the upload slot stays taken until it is
  out) by a worker thread (:mod:`ringseed.agent.upload`): from the memory tier with ``send``,
  else from the staged file slices with ``sendfile``, one slice after another. Where the
  connection cannot be lent to a thread, aiohttp writes it (memory: in pieces, each once the
  transport's buffer is empty; staged: ``loop.sendfile``). A chunk whose disk write
  has not finished is pinned in the memory tier; should it be missing there, it is answered
  429 (never sendfile over a file region that may still have holes).
- ``GET /v1/chunks/{index}?stream=1`` on the origin-duty agent, for a chunk it is still pulling:
  the bytes are sent as they arrive from the origin (``ringseed.agent.stream``), unverified; the
  receiver verifies the whole chunk against the tracker's hash before using it. At most
  ``max_streams`` at once, and a new one only while the running ones keep up with the fill
  (else 429). A pull that fails cuts its streams short. Without ``stream=1`` such a chunk is 404.
- Uploads are bounded (``max_uploads``: a number, or a callable asked per request, so the agent
  can serve fewer peers while it is on origin duty); a busy server answers 429 with ``Retry-After`` and the
  client asks another holder.
- Bearer token, JSON errors and body limits come from ``ringseed.web``.
- Control (with ``control``): ``GET /v1/status`` (the node's revision, problem, checks) and
  ``POST /v1/verify`` (hash every held chunk from disk now: 202 ``{"started": true}``, or
  ``false`` while one runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import cache, store, stream, upload

log = logging.getLogger(__name__)
SEND_PIECE = 1 << 20  # bytes per write of a memory-tier chunk
_INDEX = re.compile(r"[0-9]{1,10}")


class ChunkSource(Protocol):
    """What the server needs from the agent."""

    @property
    def held(self) -> Mapping[int, str]: ...

    memory: cache.MemoryTier
    store: store.Store
    inflight: dict[int, stream.Inflight]
    active_uploads: int
    active_streams: int
    uploaded_bytes: int
    refused_uploads: int  # requests answered 429 (upload or stream slots full)


class Control(Protocol):
    """The agent's control surface (status and on-demand checks)."""

    def status(self) -> dict[str, Any]: ...

    def start_verify(self) -> bool: ...


def _revision_of(source: ChunkSource) -> str | None:
    revision = getattr(source, "revision", None)
    return getattr(revision, "id", None)


def create_app(
    *,
    token: str,
    source: ChunkSource,
    max_uploads: int | Callable[[], int],
    metrics: web.Metrics,
    max_streams: int = 0,
    refresh_metrics: Callable[[], None],
    control: Control | None = None,
    upload_threads: int = 4,
    upload_stall: float = upload.STALL_S,
) -> aioweb.Application:
    app = web.make_app(token=token, max_body_bytes=64 << 10)
    app.router.add_get("/metrics", metrics.handler(refresh_metrics))
    uploads = upload.Uploads(threads=upload_threads, stall=upload_stall)
    server = _ChunkServer(source, max_uploads=max_uploads, max_streams=max_streams, uploads=uploads)
    app.router.add_get("/v1/chunks/{index}", server.get_chunk)
    if control is not None:

        async def status(request: aioweb.Request) -> aioweb.Response:
            return aioweb.json_response(control.status())

        async def verify(request: aioweb.Request) -> aioweb.Response:
            return aioweb.json_response({"started": control.start_verify()}, status=202)

        app.router.add_get("/v1/status", status)
        app.router.add_post("/v1/verify", verify)

    async def close_uploads(_: aioweb.Application) -> None:
        uploads.close()

    app.on_cleanup.append(close_uploads)
    return app


def _busy(reason: str = "upload slots are full; ask another holder") -> aioweb.Response:
    return aioweb.json_response(
        {"error": "busy", "reason": reason},
        status=429,
        headers={"Retry-After": "1"},
    )


@contextlib.contextmanager
def _unbuffered(transport: asyncio.BaseTransport | None) -> Iterator[None]:
    """Inside, a write returns (after its drain) only once the transport's buffer is empty again.

    asyncio's socket transport sends what the socket takes at once and copies the rest into its
    own buffer; with the default high-water mark (64 KiB) the next piece then goes through that
    buffer too, so nearly every byte of a chunk was copied once more. Writing each piece into an
    empty buffer lets the socket take more of it straight from the chunk.
    """
    if not isinstance(transport, asyncio.WriteTransport) or transport.is_closing():
        yield
        return
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0)
    try:
        yield
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)


class _ChunkServer:
    def __init__(
        self, source: ChunkSource, *, max_uploads: int | Callable[[], int], max_streams: int, uploads: upload.Uploads
    ) -> None:
        self.source = source
        self.uploads = uploads
        self.max_streams = max_streams
        self.max_uploads = max_uploads if callable(max_uploads) else (lambda: max_uploads)

    async def get_chunk(self, request: aioweb.Request) -> aioweb.StreamResponse:
        raw = request.match_info["index"]
        if not _INDEX.fullmatch(raw):
            raise web.problem(400, "bad_index", "chunk index must be a non-negative integer (ASCII digits)")
        index = int(raw)
        asked = request.query.get("revision")
        if asked is not None and asked != _revision_of(self.source):
            raise web.problem(409, "revision_mismatch", "this node holds another revision of the source")
        if index not in self.source.held:
            inflight = self.source.inflight.get(index) if request.query.get("stream") == "1" else None
            if inflight is None:
                raise web.problem(404, "not_held", f"chunk {index} is not held (verified) here")
            return await self._stream(request, inflight)
        if self.source.active_uploads >= self.max_uploads():
            self.source.refused_uploads += 1
            return _busy()
        self.source.active_uploads += 1
        try:
            return await self._send(request, index)
        finally:
            self.source.active_uploads -= 1

    async def _stream(self, request: aioweb.Request, inflight: stream.Inflight) -> aioweb.StreamResponse:
        if self.source.active_streams >= self.max_streams or not inflight.keeping_up():
            self.source.refused_uploads += 1
            return _busy("stream slots are full or the uplink is saturated; fetch the chunk once it is held")
        self.source.active_streams += 1
        stream_id = inflight.open_stream()
        try:
            response = aioweb.StreamResponse(headers={"X-Chunk-Stream": "1"})
            response.content_type = "application/octet-stream"
            response.content_length = inflight.length
            await response.prepare(request)
            view, sent = memoryview(inflight.buffer), 0
            while sent < inflight.length:
                if inflight.filled <= sent:
                    await inflight.wait_beyond(sent)
                    if inflight.failed and inflight.filled <= sent:
                        # Headers are out: the only way to say "failed" is to cut the body short.
                        log.info("Origin pull of chunk %d failed; cutting its stream short", inflight.index)
                        if request.transport is not None:
                            request.transport.close()
                        return response
                    continue
                end = min(inflight.filled, sent + SEND_PIECE)
                piece = view[sent:end]
                with _unbuffered(request.transport):
                    await response.write(piece)
                sent = end
                inflight.sent[stream_id] = sent
                self.source.uploaded_bytes += len(piece)
            await response.write_eof()
            return response
        finally:
            inflight.close_stream(stream_id)
            self.source.active_streams -= 1

    async def _send(self, request: aioweb.Request, index: int) -> aioweb.StreamResponse:
        data = self.source.memory.get(index)
        if data is None and index in self.source.memory.pinned:  # its disk write is still in flight
            self.source.refused_uploads += 1
            return _busy()
        headers = {"X-Chunk-Sha256": self.source.held[index]}
        if data is not None:
            return await self._send_memory(request, data, headers)
        return await self._sendfile(request, index, headers)

    async def _send_memory(
        self, request: aioweb.Request, data: cache.Data, headers: dict[str, str]
    ) -> aioweb.StreamResponse:
        # Written here, with back-pressure, so the upload slot is held until the body is out (a
        # plain Response would be written after the handler returned its slot).
        response = aioweb.StreamResponse(headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = len(data)
        await response.prepare(request)
        view = memoryview(data)
        stall = self.uploads.stall
        sent = await self.uploads.send(request, lambda sock: upload.send_view(sock, view, stall=stall))
        if sent is not None:
            self.source.uploaded_bytes += sent
        else:
            with _unbuffered(request.transport):
                for start in range(0, len(data), SEND_PIECE):
                    piece = view[start : start + SEND_PIECE]
                    await response.write(piece)
                    self.source.uploaded_bytes += len(piece)
        await response.write_eof()
        return response

    async def _sendfile(self, request: aioweb.Request, index: int, headers: dict[str, str]) -> aioweb.StreamResponse:
        slices = self.source.store.file_slices(index)
        response = aioweb.StreamResponse(headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = sum(length for _, _, length in slices)
        await response.prepare(request)
        stall = self.uploads.stall
        sent = await self.uploads.send(request, lambda sock: upload.send_files(sock, slices, stall=stall))
        if sent is not None:
            self.source.uploaded_bytes += sent
        else:
            transport = request.transport
            loop = asyncio.get_running_loop()
            for path, offset, length in slices:
                if transport is None or transport.is_closing():
                    raise ConnectionResetError("peer went away")
                with open(path, "rb") as f:  # noqa: ASYNC230 - opening is cheap; the transfer is sendfile
                    await loop.sendfile(transport, f, offset, length)
                self.source.uploaded_bytes += length
        await response.write_eof()
        return response
