"""The peer chunk client on loopback: against the agent's real chunk server, and against scripted
faulty peers (stale kept connections, short and over-long bodies, silence, cancellation)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import buffers, cache, peerclient, server, store
from ringseed.protocol import manifest, revision
from tests.waiting import eventually

MiB = 1 << 20
CHUNK = 3 * MiB + 17


class _Source:
    def __init__(self, staging: store.Store, held: dict[int, str]) -> None:
        self.store = staging
        self.held = held
        self.memory = cache.MemoryTier(8 * MiB)
        self.inflight: dict[int, object] = {}
        self.active_uploads = 0
        self.active_streams = 0
        self.uploaded_bytes = 0
        self.refused_uploads = 0


async def test_chunks_arrive_whole_and_hashed_from_memory_and_disk_over_one_kept_connection(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK)
    layout = manifest.Layout.build([("m.bin", len(data), 0o644)], chunk_size=CHUNK)
    staging = store.Store(tmp_path / "cache")
    staging.open(revision.Revision(layout=layout))
    hashes = {}
    for index in range(layout.chunk_count):
        start, end = layout.chunk_span(index)
        staging.write_chunk(index, data[start:end])
        hashes[index] = manifest.chunk_sha256(data[start:end])
    source = _Source(staging, hashes)
    source.memory.put(0, data[:CHUNK])  # chunk 0 from memory, chunk 1 with sendfile
    connections: list[object] = []

    @aioweb.middleware
    async def track(request: aioweb.Request, handler: Callable[..., object]) -> object:
        connections.append(request.transport)
        return await handler(request)  # type: ignore[misc]

    metrics = web.Metrics()
    app = server.create_app(token="t", source=source, max_uploads=2, metrics=metrics, refresh_metrics=lambda: None)
    app.middlewares.append(track)
    runner = aioweb.AppRunner(app)
    await runner.setup()
    site = aioweb.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = peerclient.PeerClient(token="t", threads=2)
    pool = buffers.Pool(capacity=CHUNK, limit=2)
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        for index in (0, 1, 0):
            into = pool.take(CHUNK)
            reply = await client.get(url, index, into=into, deadline=None)
            assert reply == peerclient.Reply(status=200, received=CHUNK, complete=True, digest=hashes[index])
            start, end = layout.chunk_span(index)
            assert bytes(into) == data[start:end]
        missing = await client.get(url, 5, into=pool.take(CHUNK))
        assert missing.status == 404 and not missing.complete
        stranger = peerclient.PeerClient(token="nope", threads=1)
        assert (await stranger.get(url, 0, into=pool.take(CHUNK))).status == 401
        stranger.close()
        assert len(set(map(id, connections))) == 1  # every request but the wrong token's on one connection
    finally:
        client.close()
        await runner.cleanup()
        staging.close()


# -- scripted peers --------------------------------------------------------------------------------

Script = Callable[[socket.socket, int], bool]  # (connection, request number) -> keep the connection


class _Peer:
    """A loopback peer answering each request with the next script; counts connections."""

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.connections = 0
        self.requests = 0
        self.asked = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                self.connections += 1
                threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    piece = conn.recv(4096)
                    if not piece:
                        return
                    head += piece
                number, self.requests = self.requests, self.requests + 1
                self.asked.set()
                if not self.scripts[min(number, len(self.scripts) - 1)](conn, number):
                    return

    def close(self) -> None:
        self.listener.close()


def _ok(body: bytes, *, declared: int | None = None, close: bool = False) -> Script:
    def script(conn: socket.socket, number: int) -> bool:
        length = len(body) if declared is None else declared
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n".encode() + body)
        return not close

    return script


def _busy(conn: socket.socket, number: int) -> bool:
    body = b'{"error": "busy"}'
    conn.sendall(f"HTTP/1.1 429 Too Many Requests\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return True


def _silent(conn: socket.socket, number: int) -> bool:
    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {CHUNK}\r\n\r\n".encode())
    conn.recv(1)  # blocks until the client goes away
    return False


@pytest.fixture
def peers() -> Iterator[Callable[[list[Script]], _Peer]]:
    made: list[_Peer] = []

    def make(scripts: list[Script]) -> _Peer:
        made.append(_Peer(scripts))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


async def test_a_kept_connection_the_peer_closed_is_retried_on_a_new_one(
    peers: Callable[[list[Script]], _Peer],
) -> None:
    body = os.urandom(CHUNK)
    peer = peers([_ok(body, close=True)])  # answers, then closes what the client keeps
    client = peerclient.PeerClient(token="t", threads=1)
    try:
        for _ in range(2):
            reply = await client.get(peer.url, 0, into=memoryview(bytearray(CHUNK)))
            assert reply.complete and reply.digest == hashlib.sha256(body).hexdigest()
        assert peer.connections == 2
    finally:
        client.close()


async def test_busy_answers_keep_the_connection(peers: Callable[[list[Script]], _Peer]) -> None:
    body = os.urandom(CHUNK)
    peer = peers([_busy, _ok(body)])
    client = peerclient.PeerClient(token="t", threads=1)
    try:
        assert (await client.get(peer.url, 0, into=memoryview(bytearray(CHUNK)))).status == 429
        assert (await client.get(peer.url, 0, into=memoryview(bytearray(CHUNK)))).complete
        assert peer.connections == 1
    finally:
        client.close()


async def test_short_long_and_unframed_bodies_are_never_complete(peers: Callable[[list[Script]], _Peer]) -> None:
    body = os.urandom(CHUNK)

    def unframed(conn: socket.socket, number: int) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        return False

    short = peers([_ok(body[: CHUNK // 2], declared=CHUNK, close=True)])
    long = peers([_ok(body + b"extra")])
    chunked = peers([unframed])
    client = peerclient.PeerClient(token="t", threads=1)
    try:
        cut = await client.get(short.url, 0, into=memoryview(bytearray(CHUNK)))
        assert (cut.status, cut.received, cut.complete, cut.digest) == (200, CHUNK // 2, False, None)
        over = await client.get(long.url, 0, into=memoryview(bytearray(CHUNK)))
        assert over.too_long and not over.complete and over.received == 0
        odd = await client.get(chunked.url, 0, into=memoryview(bytearray(CHUNK)))
        assert odd.status == 200 and not odd.complete and "Content-Length" in odd.error
    finally:
        client.close()


async def test_silence_ends_after_the_read_timeout_and_refused_connections_are_status_0(
    peers: Callable[[list[Script]], _Peer],
) -> None:
    peer = peers([_silent])
    client = peerclient.PeerClient(token="t", threads=1)
    try:
        reply = await client.get(peer.url, 0, into=memoryview(bytearray(CHUNK)), read_timeout=0.3)
        assert reply.status == 200 and not reply.complete and "no data" in reply.error
        with socket.create_server(("127.0.0.1", 0)) as closed:
            port = closed.getsockname()[1]
        refused = await client.get(f"http://127.0.0.1:{port}", 0, into=memoryview(bytearray(CHUNK)))
        assert refused.status == 0 and "connect" in refused.error
    finally:
        client.close()


async def test_cancelling_a_download_frees_its_thread_and_buffer(peers: Callable[[list[Script]], _Peer]) -> None:
    body = os.urandom(CHUNK)
    peer = peers([_silent, _ok(body)])
    client = peerclient.PeerClient(token="t", threads=1)  # one thread: the next call needs it back
    pool = buffers.Pool(capacity=CHUNK, limit=1)
    try:
        stalled = asyncio.create_task(client.get(peer.url, 0, into=pool.take(CHUNK), read_timeout=60))
        assert await asyncio.to_thread(peer.asked.wait, 30)
        stalled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stalled
        del stalled
        reply = await client.get(peer.url, 0, into=memoryview(bytearray(CHUNK)))
        assert reply.complete and reply.digest == hashlib.sha256(body).hexdigest()
        assert pool.free() == 1  # the cancelled download's thread let go of its buffer
    finally:
        client.close()


async def test_an_upload_to_a_peer_that_stops_reading_ends_and_frees_its_slot(tmp_path: Path) -> None:
    data = os.urandom(16 * MiB)
    layout = manifest.Layout.build([("m.bin", len(data), 0o644)], chunk_size=len(data))
    staging = store.Store(tmp_path / "cache")
    staging.open(revision.Revision(layout=layout))
    staging.write_chunk(0, data)
    source = _Source(staging, {0: manifest.chunk_sha256(data)})
    app = server.create_app(
        token="t", source=source, max_uploads=1, metrics=web.Metrics(), refresh_metrics=lambda: None, upload_stall=0.3
    )
    runner = aioweb.AppRunner(app)
    await runner.setup()
    site = aioweb.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        for memory in (False, True):  # sendfile from staging, then send from the memory tier
            if memory:
                source.memory.put(0, data)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /v1/chunks/0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n")
            await eventually(lambda: source.active_uploads == 1, what="the upload to start")  # we read nothing
            await eventually(lambda: source.active_uploads == 0, what="the stalled upload to end")
            received = 0
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(1 << 20):
                    received += len(chunk)
            assert 0 < received < len(data)  # cut short: the server closed the connection
            writer.close()
    finally:
        await runner.cleanup()
        staging.close()
