"""The collective data plane's listener: one selector thread, bounded handshakes, no thread per connection.

What this module owns
- :class:`Listener`: binds, accepts, and runs every handshake and every bandwidth probe on one
  thread, over non-blocking sockets in a ``selectors`` loop. A dialer that has not proven the
  group token within ``handshake_timeout`` is closed. At most ``max_pending`` handshakes are in
  progress; a connection that arrives at a full table evicts the oldest one (a dialer holding
  the token answers the challenge within one round trip, so the oldest is the likeliest idle),
  so a flood of idle or garbage connections cannot keep an honest peer out.
- A data connection (ring or direct) that passes the handshake is handed to ``on_link`` in
  blocking mode with ``io_timeout`` and answered WELCOME, or REJECT with the reason ``on_link``
  returns. A probe connection is served here: its bytes are read and discarded, then acked.

Rules
- The loop outlives any failure. An error from ``accept`` (EMFILE, ENFILE, ENOBUFS, ENOMEM, ...)
  pauses accepting for a moment; an error in one connection (a malformed message, ``on_link``
  raising) closes that connection only; anything else is counted, logged and the loop goes on.
- Nothing here starts a thread after :meth:`Listener.start`, so a process at its pids limit
  keeps accepting and its peers keep connecting.
- An unauthenticated connection costs a debug line and a counter (:class:`Stats`), never a
  warning or a traceback: anyone who can reach the port can make them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable

from ringseed.collective import transport
from ringseed.protocol import frames

log = logging.getLogger(__name__)

LinkHandler = Callable[[frames.Hello, socket.socket], str | None]  # returns a reject reason or None
ACCEPT_PAUSE = 0.05  # seconds without accepting after accept() failed (EMFILE and friends)
_ACCEPT_BURST = 64  # accepts per loop turn, so handshakes in progress are served too
_PROBE_PIECE = 1 << 20
_IDLE_TURN = 1.0  # the loop re-checks deadlines at least this often


@dataclasses.dataclass(frozen=True)
class Stats:
    """What the listener refused so far (for tests and metrics)."""

    refused: int  # failed handshakes: malformed, wrong token, refused by ``on_link``
    expired: int  # no complete handshake within ``handshake_timeout``
    evicted: int  # dropped to make room at a full pending table
    accept_errors: int  # accept() failures (EMFILE, ...), each followed by a pause
    loop_errors: int  # unexpected errors the loop survived


class _Phase(enum.Enum):
    HELLO = 1  # reading HELLO's fixed part
    PEER_ID = 2  # reading the peer id
    PROBE_HEADER = 3  # authenticated probe: reading its header
    PROBE_BODY = 4  # discarding the probe bytes
    CLOSING = 5  # flushing the last reply, then close


@dataclasses.dataclass(eq=False)
class _Conn:
    sock: socket.socket
    deadline: float
    challenge: bytes
    phase: _Phase = _Phase.HELLO
    need: int = frames.HELLO_FIXED_BYTES
    buf: bytearray = dataclasses.field(default_factory=bytearray)
    out: bytes = b""
    fixed: bytes = b""
    left: int = 0  # probe bytes still to discard
    authenticated: bool = False


class Listener:
    """Accepts ring, direct and probe connections for one engine."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        token: str,
        io_timeout: float,
        on_link: LinkHandler,
        handshake_timeout: float | None = None,
        max_pending: int = 64,
        backlog: int = 128,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self._token = token
        self._io_timeout = io_timeout
        self._handshake_timeout = handshake_timeout if handshake_timeout is not None else min(io_timeout, 10.0)
        self._on_link = on_link
        self._max_pending = max_pending
        self._sock = socket.create_server((host, port), backlog=backlog)
        self._sock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._conns: dict[socket.socket, _Conn] = {}  # insertion order: oldest first
        self._accepting = True
        self._resume_at = 0.0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ringseed-listener", daemon=True)
        self._scratch = memoryview(bytearray(_PROBE_PIECE))
        self._counts = {f.name: 0 for f in dataclasses.fields(Stats)}
        self._count_lock = threading.Lock()

    @property
    def port(self) -> int:
        port: int = self._sock.getsockname()[1]
        return port

    @property
    def stats(self) -> Stats:
        with self._count_lock:
            return Stats(**self._counts)

    @property
    def rejected(self) -> int:
        """Handshakes refused so far (a shorthand for ``stats.refused``)."""
        return self.stats.refused

    @property
    def pending(self) -> int:
        """Connections currently in the handshake or probe phase (read from any thread: approximate)."""
        return len(self._conns)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop accepting and close every connection still in the handshake (idempotent)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if not self._thread.is_alive():  # never started, or finished: nobody else touches the sockets
            self._close_all()

    # ----- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self._turn()
            except Exception as exc:  # the loop must outlive anything; one connection's fault is handled below
                self._count("loop_errors")
                log.warning("Collective listener recovered from %s: %s", type(exc).__name__, exc)
                self._closed.wait(ACCEPT_PAUSE)
        self._close_all()

    def _turn(self) -> None:
        for key, events in self._sel.select(self._next_timeout()):
            if key.data is None:
                self._accept()
            elif key.data is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            else:
                self._serve(key.data, events)
        now = time.monotonic()
        self._expire(now)
        if not self._accepting and now >= self._resume_at and not self._closed.is_set():
            self._sel.register(self._sock, selectors.EVENT_READ, None)
            self._accepting = True

    def _next_timeout(self) -> float:
        now = time.monotonic()
        due = [c.deadline for c in self._conns.values()]
        if not self._accepting:
            due.append(self._resume_at)
        return max(0.0, min([now + _IDLE_TURN, *due]) - now)

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BURST):
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:  # the dialer gave up before we got to it
                    continue
                self._count("accept_errors")
                log.debug("Collective listener could not accept (%s); pausing %.2f s", exc, ACCEPT_PAUSE)
                self._pause_accepting()
                return
            self._admit(conn)

    def _pause_accepting(self) -> None:
        if self._accepting:
            self._sel.unregister(self._sock)
            self._accepting = False
        self._resume_at = time.monotonic() + ACCEPT_PAUSE

    def _admit(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if sum(not c.authenticated for c in self._conns.values()) >= self._max_pending:
                oldest = next(c for c in self._conns.values() if not c.authenticated)
                self._count("evicted")
                log.debug("Collective listener full: dropped the oldest pending handshake")
                self._drop(oldest)
            challenge = os.urandom(frames.NONCE_BYTES)
            conn = _Conn(sock=sock, deadline=time.monotonic() + self._handshake_timeout, challenge=challenge)
            conn.out = frames.encode_challenge(challenge)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        except Exception as exc:
            self._conns.pop(sock, None)
            sock.close()
            self._count("loop_errors")
            log.warning("Collective listener dropped a new connection: %s: %s", type(exc).__name__, exc)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._count("expired")
            what = "probe" if conn.authenticated else "handshake"
            log.debug("Collective connection closed: no complete %s in time", what)
            self._drop(conn)

    # ----- one connection ------------------------------------------------------------------

    def _serve(self, conn: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                self._flush(conn)
            if events & selectors.EVENT_READ and conn.sock in self._conns:
                self._receive(conn)
        except (frames.FrameError, OSError, ValueError) as exc:
            self._refuse(conn, str(exc))
        except Exception as exc:  # on_link or a bug: this connection only
            self._count("loop_errors")
            log.warning("Collective connection dropped after %s: %s", type(exc).__name__, exc)
            self._drop(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn.out:
            conn.out = conn.out[conn.sock.send(conn.out) :]
        if not conn.out:
            if conn.phase is _Phase.CLOSING:
                self._drop(conn)
            else:
                self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _receive(self, conn: _Conn) -> None:
        if conn.phase is _Phase.PROBE_BODY:
            n = conn.sock.recv_into(self._scratch, min(conn.left, len(self._scratch)))
            if n == 0:
                raise ConnectionError(f"probe ended {conn.left} bytes early")
            conn.left -= n
            conn.deadline = time.monotonic() + self._io_timeout
            if conn.left == 0:
                self._reply(conn, _probe_ack(), closing=True)
            return
        if conn.phase is _Phase.CLOSING:
            if not conn.sock.recv(4096):
                self._drop(conn)
            return
        data = conn.sock.recv(conn.need - len(conn.buf))
        if not data:
            raise ConnectionError(f"peer closed the connection during the handshake ({conn.phase.name})")
        conn.buf += data
        if len(conn.buf) == conn.need:
            message, conn.buf = bytes(conn.buf), bytearray()
            self._advance(conn, message)

    def _advance(self, conn: _Conn, message: bytes) -> None:
        if conn.phase is _Phase.HELLO:
            conn.fixed, conn.phase = message, _Phase.PEER_ID
            conn.need = frames.decode_hello_fixed(message)[5]
        elif conn.phase is _Phase.PEER_ID:
            hello = frames.verify_hello(
                token=self._token, challenge=conn.challenge, fixed=conn.fixed, peer_id_bytes=message
            )
            if hello.purpose is frames.Purpose.PROBE:
                conn.authenticated, conn.phase, conn.need = True, _Phase.PROBE_HEADER, frames.HEADER_BYTES
                conn.deadline = time.monotonic() + self._io_timeout
                self._reply(conn, frames.make_reply(token=self._token, hello_nonce=hello.nonce), closing=False)
            else:
                self._hand_over(conn, hello)
        elif conn.phase is _Phase.PROBE_HEADER:
            header = frames.decode_header(message)
            if header.kind is not frames.Kind.PROBE:
                raise frames.FrameError(f"probe connection sent a {header.kind.name} frame")
            conn.phase, conn.left = _Phase.PROBE_BODY, header.nbytes
            if conn.left == 0:
                self._reply(conn, _probe_ack(), closing=True)

    def _hand_over(self, conn: _Conn, hello: frames.Hello) -> None:
        """An authenticated data connection leaves the loop: ``on_link`` keeps it or names why not."""
        self._forget(conn)
        sock = conn.sock
        try:
            sock.setblocking(True)
            transport.configure(sock, io_timeout=self._io_timeout)
            reason = self._on_link(hello, sock)
        except BaseException:
            sock.close()
            raise
        if reason is not None:
            self._count("refused")
            log.warning("Refused a collective connection from %r: %s", hello.peer_id, reason)
            _try_send(sock, frames.make_reply(token=self._token, hello_nonce=b"", reject_reason=reason))
            sock.close()
            return
        _try_send(sock, frames.make_reply(token=self._token, hello_nonce=hello.nonce))

    def _reply(self, conn: _Conn, data: bytes, *, closing: bool) -> None:
        conn.out += data
        if closing:
            conn.phase = _Phase.CLOSING
        self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _refuse(self, conn: _Conn, reason: str) -> None:
        """Count first (a dialer that sees the reason also sees the count), then answer if possible and close."""
        self._count("refused")
        log.debug("Refused a collective connection: %s", reason)
        if not conn.authenticated:
            with contextlib.suppress(OSError):
                conn.sock.send(frames.make_reply(token=self._token, hello_nonce=b"", reject_reason=reason))
        self._drop(conn)

    def _forget(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)

    def _drop(self, conn: _Conn) -> None:
        self._forget(conn)
        conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        with contextlib.suppress(OSError):
            self._sel.close()
        for sock in (self._sock, self._wake_r, self._wake_w):
            sock.close()

    def _count(self, name: str) -> None:
        with self._count_lock:
            self._counts[name] += 1


def _probe_ack() -> bytes:
    return frames.encode_header(
        frames.Header(kind=frames.Kind.PROBE_ACK, dtype=frames.DType.U8, tag=0, sequence=0, nbytes=0)
    )


def _try_send(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(data)
