"""Chunks between cache agents: the peer server (``/v1/cache/chunks/{sha}``) and its client calls.

Owns the agent-to-agent wire format (docs/contracts.md, "Cache agent peer API"):
- ``PUT /v1/cache/chunks/{sha}`` with ``Content-Length``: a replica pushed by a writer's agent
  (or a persister, a repairer). The receiver reserves room (memory, else SSD), writes the body,
  hashes it and keeps it only if it matches ``sha``: 201 (or 200 when already held), 422
  ``corrupt`` on a mismatch, 507 ``cache_full`` (with the reason) when no room could be made.
- ``GET /v1/cache/chunks/{sha}``: a held chunk, sent with ``sendfile`` from whichever tier holds
  it (``X-Chunk-Sha256``); 404 ``not_held``; 429 ``busy`` when ``upload_slots`` are taken. A busy
  holder is a copy to ask again shortly (:class:`PeerBusy`), never a reason to read the source or
  the sink instead, until ``BUSY_PATIENCE_S`` has passed.
- ``HEAD /v1/cache/chunks/{sha}``: 200 when held (a pusher skips chunks the target has).
Bearer token, JSON errors and limits from ``ringseed.web``. The client side verifies nothing
itself: every chunk that enters a node is hashed by :class:`ringseed.cache.chunks.ChunkStore`.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import peerclient
from ringseed.cache import chunks
from ringseed.protocol import cacheobjects as objects

PIECE = 1 << 20
READ_LEASE_S = 60.0
BUSY_WAIT_S = 0.2  # a reader whose every holder is busy asks again after about this long (jittered)
BUSY_PATIENCE_S = 60.0  # ... and treats them as failed after this long


async def busy_pause(rng: random.Random) -> None:
    """The pause before asking busy holders again: an upload slot frees when a chunk is sent."""
    await asyncio.sleep(BUSY_WAIT_S * (0.5 + rng.random()))


class PeerError(Exception):
    """A peer did not deliver or accept a chunk; the message names the peer and why."""


class PeerBusy(PeerError):
    """The peer holds the chunk but its upload slots are taken (429): a copy to ask again, not a failed one."""


def _sha(request: aioweb.Request) -> str:
    try:
        return objects.check_sha256(request.match_info["sha"])
    except ValueError as exc:
        raise web.problem(400, "bad_sha", str(exc)) from exc


class PeerServer:
    """Handlers of the peer API over one agent's chunk store."""

    def __init__(self, store: chunks.ChunkStore, *, upload_slots: int, deadline: float) -> None:
        self.store = store
        self.upload_slots = upload_slots
        self.deadline = deadline
        self.uploads = 0
        self.uploaded_bytes = 0
        self.received_bytes = 0
        self.refused_busy = 0  # GETs answered 429

    def routes(self, app: aioweb.Application) -> None:
        app.router.add_put("/v1/cache/chunks/{sha}", self.put)
        app.router.add_get("/v1/cache/chunks/{sha}", self.get, allow_head=False)
        app.router.add_route("HEAD", "/v1/cache/chunks/{sha}", self.head)

    async def head(self, request: aioweb.Request) -> aioweb.Response:
        if not self.store.has(_sha(request)):
            raise web.problem(404, "not_held", "chunk is not held here")
        return aioweb.Response(status=200)

    async def put(self, request: aioweb.Request) -> aioweb.Response:
        sha = _sha(request)
        length = request.content_length
        if length is None or length <= 0:
            raise web.problem(411, "length_required", "a chunk push needs a positive Content-Length")
        if self.store.has(sha):
            await request.release()
            return aioweb.json_response({"sha256": sha, "held": True}, status=200)

        async def fill(fd: int) -> None:
            offset = 0
            async for piece in request.content.iter_chunked(PIECE):
                if offset + len(piece) > length:
                    raise PeerError("body longer than Content-Length")
                os.pwrite(fd, piece, offset)
                offset += len(piece)
            if offset != length:
                raise PeerError(f"body ended after {offset} of {length} bytes")

        try:
            await self.store.receive(sha=sha, length=length, fill=fill, deadline=time.monotonic() + self.deadline)
        except chunks.CacheFull as exc:
            raise web.problem(507, "cache_full", f"no room for the chunk: {exc}") from exc
        except chunks.CorruptChunk as exc:
            raise web.problem(422, "corrupt", str(exc)) from exc
        except PeerError as exc:
            raise web.problem(400, "bad_body", str(exc)) from exc
        self.received_bytes += length
        return aioweb.json_response({"sha256": sha, "held": True}, status=201)

    async def get(self, request: aioweb.Request) -> aioweb.StreamResponse:
        sha = _sha(request)
        if not self.store.has(sha) or not await self.store.verify_once(sha):
            raise web.problem(404, "not_held", f"chunk {sha[:12]} is not held here")
        if self.uploads >= self.upload_slots:
            self.refused_busy += 1
            raise web.problem(429, "busy", "upload slots are full; ask another holder", headers={"Retry-After": "1"})
        self.uploads += 1
        self.store.book.pin(sha)
        try:
            return await self._sendfile(request, sha, self.store.path(sha))
        finally:
            self.store.book.unpin(sha)
            self.uploads -= 1

    async def _sendfile(self, request: aioweb.Request, sha: str, path: Path) -> aioweb.StreamResponse:
        size = os.stat(path).st_size
        response = aioweb.StreamResponse(headers={"X-Chunk-Sha256": sha})
        response.content_type = "application/octet-stream"
        response.content_length = size
        await response.prepare(request)
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("peer went away")
        with open(path, "rb") as f:  # noqa: ASYNC230 - opening is cheap; the transfer is sendfile
            await asyncio.get_running_loop().sendfile(transport, f, 0, size)
        self.uploaded_bytes += size
        await response.write_eof()
        return response


async def _pieces(path: Path, length: int) -> AsyncIterator[bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        offset = 0
        while offset < length:
            piece = os.pread(fd, min(PIECE, length - offset), offset)
            if not piece:
                raise PeerError(f"{path} ended at {offset} of {length} bytes")
            offset += len(piece)
            yield piece
    finally:
        os.close(fd)


async def push(
    http: aiohttp.ClientSession, *, url: str, token: str, sha: str, path: Path, length: int, limit_s: float = 120.0
) -> None:
    """Send chunk ``sha`` (the file ``path``) to the agent at ``url`` unless it holds it already."""
    target = f"{url.rstrip('/')}/v1/cache/chunks/{sha}"
    headers = {"Authorization": f"Bearer {token}"}
    limit = aiohttp.ClientTimeout(total=limit_s)
    try:
        async with http.head(target, headers=headers, timeout=limit) as response:
            if response.status == 200:
                return
        headers = dict(headers, **{"Content-Length": str(length), "Content-Type": "application/octet-stream"})
        async with http.put(target, data=_pieces(path, length), headers=headers, timeout=limit) as response:
            body = await response.text()
            if response.status not in (200, 201):
                raise PeerError(f"{url} refused chunk {sha[:12]}: HTTP {response.status}: {body[:300]}")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise PeerError(f"{url} unreachable while pushing chunk {sha[:12]}: {type(exc).__name__}: {exc}") from exc


def allocate(fd: int, length: int) -> None:
    """Give the file ``fd`` its ``length`` bytes of real space before it is mapped and written.

    A store through a mapping of a hole the file system cannot back (a full tmpfs or disk) is a
    SIGBUS that kills the agent; allocated first, it is :class:`chunks.CacheFull` here instead."""
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = f"no space for a {length}-byte chunk on its tier's file system: {exc.strerror}"
            raise chunks.CacheFull(why) from exc
        raise


async def fetch_into(client: peerclient.PeerClient, *, url: str, sha: str, length: int, fd: int,
                     limit_s: float = 120.0) -> str:  # fmt: skip
    """Receive chunk ``sha`` from the agent at ``url`` into the file ``fd``; returns the SHA-256 of what came.

    The file is allocated (:func:`allocate`) and mapped, and the body lands in the mapping with ``recv_into``
    on the client's worker thread (:meth:`ringseed.agent.peerclient.PeerClient.fetch_mapped`, the
    agent's way of receiving into staging too), hashed piece by piece as it arrives: no
    Python-level copy and no second pass over the chunk to verify it.
    """
    if length <= 0:
        return hashlib.sha256(b"").hexdigest()
    allocate(fd, length)
    reply = await client.fetch_mapped(
        url.rstrip("/"), f"/v1/cache/chunks/{sha}", fd=fd, offset=0, length=length, deadline=time.monotonic() + limit_s
    )
    if reply.status == 429:
        raise PeerBusy(f"{url} is busy (upload slots taken) for chunk {sha[:12]}")
    if reply.status != 200:
        raise PeerError(
            f"{url} did not serve chunk {sha[:12]}: " + (f"HTTP {reply.status}" if reply.status else reply.error)
        )
    if not reply.complete or reply.digest is None:
        raise PeerError(f"{url} sent {reply.received} of {length} bytes for chunk {sha[:12]}: {reply.error}")
    return reply.digest
