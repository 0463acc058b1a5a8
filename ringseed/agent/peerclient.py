"""Chunk downloads from peers: ``GET /v1/chunks/{index}`` straight into a chunk buffer, hashed as it lands.

The receive path of the agent, where every byte of a model passes. aiohttp's client reads a
response in 256 KiB ``bytes`` objects through a stream reader (one allocation, one copy and a
few Python calls per piece, and the heap churn that comes with them); here a worker thread
speaks HTTP/1.1 over a plain blocking socket and receives the body with ``recv_into`` and
``MSG_WAITALL`` into the caller's buffer, a few MiB per system call, and feeds each piece to
SHA-256 as soon as it is there (hashlib releases the GIL; the kernel keeps receiving into the
socket buffer meanwhile). The caller gets the body's length and digest: no second pass over it.

Rules:
- One request per call; the reply is a :class:`Reply` (status, bytes received, digest), never an
  exception for what a peer does: a refused connection, a reset, a timeout or a body cut short
  is ``Reply(status=0 or the status, complete=False)``; the caller decides what it means.
- A 200 must carry ``Content-Length``. A body declared longer than the buffer is not read
  (``too_long``: the peer sends something other than the chunk); shorter is incomplete.
- Timeouts: ``connect_timeout`` to connect; ``read_timeout`` without a byte; ``deadline`` (a
  ``time.monotonic()`` value, or None for streams whose pace the origin sets) for the whole call.
- Connections are kept alive, at most ``idle_per_peer`` idle ones per peer. A kept connection
  the peer closed meanwhile (no reply byte at all) is retried once on a new one.
- Cancelling :meth:`PeerClient.get` shuts the socket down, so the worker thread returns at once;
  the buffer stays referenced by the thread until then (see ``buffers``: it is not reused early).
- :meth:`PeerClient.fetch_mapped` receives into a region of a file through a mapping of it (the
  staging file, the cache's chunk file): no copy after the receive. It returns, cancelled or not,
  only once the worker thread is done with the mapping, and unmaps it; ``on_abort`` lets the
  file's owner break the call off from any thread (the socket is shut down).
- Calls run on ``threads`` worker threads of their own (the agent's download slots), not on the
  event loop's default executor, so downloads never wait behind disk writes or hashing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import mmap
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

PIECE = 2 << 20  # bytes per recv_into (MSG_WAITALL) and per hash update
HEAD_LIMIT = 16 << 10  # status line and headers
SMALL_BODY = 64 << 10  # error bodies read (and dropped) to keep the connection


@dataclass(frozen=True)
class Reply:
    """What one GET brought: ``status`` 0 when no status line arrived."""

    status: int
    received: int = 0  # body bytes written into the buffer
    complete: bool = False  # the whole declared body arrived
    digest: str | None = None  # SHA-256 hex of the body, when complete
    too_long: bool = False  # a 200 declared more bytes than the chunk has
    error: str = ""  # why it is incomplete (for the log)


def chunk_path(index: int, query: Mapping[str, str] | None = None) -> str:
    """The agent's chunk endpoint: ``/v1/chunks/{index}?{query}``."""
    return f"/v1/chunks/{index}" + (f"?{urlencode(query)}" if query else "")


class _Aborted(Exception):
    pass


class _Call:
    """One call's socket, so the event loop can shut it down when the call is cancelled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.aborted = False

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            if self.aborted:
                raise _Aborted
            self._sock = sock

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)


class _Broken(Exception):
    """The connection failed; ``fresh``: nothing of a reply arrived (a stale kept connection)."""

    def __init__(self, message: str, *, fresh: bool) -> None:
        super().__init__(message)
        self.fresh = fresh


class PeerClient:
    """Chunk GETs with keep-alive connections, run on ``threads`` worker threads."""

    def __init__(self, *, token: str, threads: int, idle_per_peer: int = 2, connect_timeout: float = 3.0) -> None:
        self._token = token
        self._executor = ThreadPoolExecutor(max(1, threads), thread_name_prefix="peer-get")
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()
        self.idle_per_peer = idle_per_peer
        self.connect_timeout = connect_timeout

    async def get(
        self,
        url: str,
        index: int,
        *,
        into: memoryview,
        query: Mapping[str, str] | None = None,
        read_timeout: float = 30.0,
        deadline: float | None = None,
    ) -> Reply:
        """``GET {url}/v1/chunks/{index}?{query}`` into ``into``; see the module rules."""
        return await self.fetch(url, chunk_path(index, query), into=into, read_timeout=read_timeout, deadline=deadline)

    async def fetch(
        self, url: str, path: str, *, into: memoryview, read_timeout: float = 30.0, deadline: float | None = None
    ) -> Reply:
        """``GET {url}{path}`` into ``into`` (any chunk-serving endpoint: the cache's peer API too)."""
        return await self._fetch(url, path, into=into, read_timeout=read_timeout, deadline=deadline)

    async def fetch_mapped(
        self,
        url: str,
        path: str,
        *,
        fd: int,
        offset: int,
        length: int,
        read_timeout: float = 30.0,
        deadline: float | None = None,
        on_abort: Callable[[Callable[[], None]], None] | None = None,
    ) -> Reply:
        """``GET {url}{path}`` into ``length`` bytes of the file ``fd`` at ``offset`` (already sized
        and allocated: a write through a mapping beyond the file's end or on a full disk is a
        SIGBUS), through a mapping that is gone when this returns, cancelled or not."""
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        area = mmap.mmap(fd, offset + length - start, offset=start)
        whole = memoryview(area)
        view = whole[offset - start : offset - start + length]
        try:
            return await self._fetch(
                url, path, into=view, read_timeout=read_timeout, deadline=deadline, settle=True, on_abort=on_abort
            )
        finally:
            view.release()
            whole.release()
            with contextlib.suppress(BufferError):  # nothing else holds it; unmapped when the last view goes
                area.close()

    async def _fetch(
        self,
        url: str,
        path: str,
        *,
        into: memoryview,
        read_timeout: float,
        deadline: float | None,
        settle: bool = False,
        on_abort: Callable[[Callable[[], None]], None] | None = None,
    ) -> Reply:
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            return Reply(status=0, error=f"peer URL {url!r} has no host:port")
        call = _Call()
        if on_abort is not None:
            on_abort(call.abort)
        job = (call, parts.hostname, parts.port, path, into, read_timeout, deadline)
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._get, *job)
        try:
            return await (asyncio.shield(future) if settle else future)
        except asyncio.CancelledError:
            call.abort()  # a call still queued never starts; a running one returns at once
            if settle:
                await _settled(future)
            raise

    async def run(self, job: Callable[[], bool]) -> bool:
        """``job()`` on one of the download threads (work that belongs to a download, such as
        allocating its region of staging: never behind the default executor's queue)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for socks in idle.values():
            for sock in socks:
                sock.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- worker thread ---------------------------------------------------------------------

    def _get(
        self,
        call: _Call,
        host: str,
        port: int,
        path: str,
        into: memoryview,
        read_timeout: float,
        deadline: float | None,
    ) -> Reply:
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {self._token}\r\n"
            "Accept-Encoding: identity\r\n\r\n"
        ).encode("latin-1")
        for attempt in (1, 2):
            try:
                sock, kept = self._connection(host, port)
            except OSError as exc:
                return Reply(status=0, error=f"connect: {exc}")
            try:
                call.attach(sock)
                reply, reusable = _exchange(sock, request, into, read_timeout=read_timeout, deadline=deadline)
            except _Aborted:
                sock.close()
                return Reply(status=0, error="cancelled")
            except _Broken as exc:
                sock.close()
                if kept and exc.fresh and attempt == 1 and not call.aborted:
                    continue  # the peer closed the kept connection while it was idle
                return Reply(status=0, error=str(exc))
            if reusable and not call.aborted:
                self._keep(host, port, sock)
            else:
                sock.close()
            return reply
        raise AssertionError("unreachable")

    def _connection(self, host: str, port: int) -> tuple[socket.socket, bool]:
        with self._lock:
            idle = self._idle.get((host, port))
            if idle:
                return idle.pop(), True
        sock = socket.create_connection((host, port), timeout=self.connect_timeout)
        sock.settimeout(None)  # blocking; SO_RCVTIMEO bounds each receive
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, False

    def _keep(self, host: str, port: int, sock: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault((host, port), [])
            if len(idle) < self.idle_per_peer:
                idle.append(sock)
                return
        sock.close()


async def _settled(future: asyncio.Future[Reply]) -> None:
    """Wait until ``future`` is done, even through cancellations (its thread was told to stop and
    returns at once; the caller must not unmap the memory it writes into before that)."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([future])


def _set_timeout(sock: socket.socket, read_timeout: float, deadline: float | None) -> None:
    wait = read_timeout if deadline is None else min(read_timeout, deadline - time.monotonic())
    if wait <= 0:
        raise _Broken("deadline passed", fresh=False)
    seconds = int(wait)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", seconds, int((wait - seconds) * 1e6)))


def _recv_into(sock: socket.socket, view: memoryview, *, read_timeout: float, deadline: float | None) -> int:
    """Fill as much of ``view`` as arrives before a timeout or the end; 0 at end of stream."""
    _set_timeout(sock, read_timeout, deadline)
    try:
        return sock.recv_into(view, len(view), socket.MSG_WAITALL)
    except BlockingIOError as exc:
        raise _Broken(f"no data for {read_timeout:.0f} s", fresh=False) from exc
    except OSError as exc:
        raise _Broken(f"receive: {exc}", fresh=False) from exc


def _exchange(
    sock: socket.socket, request: bytes, into: memoryview, *, read_timeout: float, deadline: float | None
) -> tuple[Reply, bool]:
    """Send ``request``, read the reply into ``into``; (reply, whether the connection is reusable)."""
    try:
        sock.sendall(request)
    except OSError as exc:
        raise _Broken(f"send: {exc}", fresh=True) from exc
    status, headers, rest = _read_head(sock, read_timeout=read_timeout, deadline=deadline)
    keep = headers.get("connection", "").lower() != "close"
    length = headers.get("content-length", "")
    if not length.isdigit() or "transfer-encoding" in headers:
        return Reply(status=status, error="reply without a usable Content-Length"), False
    declared = int(length)
    if status != 200:
        drained = declared <= SMALL_BODY and _drain(sock, declared - len(rest), read_timeout, deadline)
        return Reply(status=status), keep and drained
    if declared > len(into):
        return Reply(status=status, too_long=True, error=f"body of {declared} bytes for a smaller chunk"), False
    return _read_body(sock, into[:declared], rest, read_timeout=read_timeout, deadline=deadline), keep


def _read_head(
    sock: socket.socket, *, read_timeout: float, deadline: float | None
) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-case headers, the body bytes that came with them)."""
    head = bytearray()
    while b"\r\n\r\n" not in head:
        if len(head) > HEAD_LIMIT:
            raise _Broken("reply head too large", fresh=False)
        _set_timeout(sock, read_timeout, deadline)
        try:
            piece = sock.recv(HEAD_LIMIT)
        except BlockingIOError as exc:
            raise _Broken(f"no reply for {read_timeout:.0f} s", fresh=not head) from exc
        except OSError as exc:
            raise _Broken(f"receive: {exc}", fresh=not head) from exc
        if not piece:
            raise _Broken("connection closed before a reply", fresh=not head)
        head += piece
    raw, _, rest = bytes(head).partition(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    fields = lines[0].split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not fields[1].isdigit():
        raise _Broken(f"not an HTTP/1.1 reply: {lines[0][:80]!r}", fresh=False)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(fields[1]), headers, rest


def _drain(sock: socket.socket, left: int, read_timeout: float, deadline: float | None) -> bool:
    scratch = memoryview(bytearray(max(0, left)))
    while left > 0:
        got = _recv_into(sock, scratch[:left], read_timeout=read_timeout, deadline=deadline)
        if got == 0:
            return False
        left -= got
    return True


def _read_body(
    sock: socket.socket, body: memoryview, rest: bytes, *, read_timeout: float, deadline: float | None
) -> Reply:
    """Receive ``len(body)`` bytes (``rest`` first) into ``body``, hashing each piece as it lands."""
    hasher = hashlib.sha256()
    filled = min(len(rest), len(body))
    body[:filled] = rest[:filled]
    hasher.update(body[:filled])
    while filled < len(body):
        try:
            got = _recv_into(sock, body[filled : filled + PIECE], read_timeout=read_timeout, deadline=deadline)
        except _Broken as exc:
            return Reply(status=200, received=filled, error=str(exc))
        if got == 0:
            return Reply(status=200, received=filled, error="body cut short")
        hasher.update(body[filled : filled + got])
        filled += got
    return Reply(status=200, received=filled, complete=True, digest=hasher.hexdigest())
