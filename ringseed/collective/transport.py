"""TCP transport of the collective data plane: listener, dialer, handshake, frames on sockets.

What this module owns
- :class:`Listener`: binds, accepts in a background thread and runs the handshake of each
  connection on its own short-lived thread, so a slow or hostile dialer never blocks others.
  A connection that fails the handshake (bad magic, wrong token, stale epoch, malformed
  message, silence past ``io_timeout``) is answered with a reason where possible, logged and
  closed; the listener keeps serving.
- :func:`dial`: connects, answers the challenge, checks the listener's proof of the token.
- Frame I/O: :func:`send_frame` (``sendmsg`` of header + memoryview, no copy) and
  :func:`recv_header` / :func:`recv_exact` (``recv_into`` preallocated buffers, no copy).

Fault-tolerance contract
- Every ring socket has ``TCP_NODELAY`` and a timeout of ``io_timeout``: a peer that stalls
  (mid-frame or between frames) for longer raises ``TimeoutError``; EOF mid-frame raises
  ``ConnectionError``; a malformed header raises ``frames.FrameError``. The engine turns all
  of these into ``CollectiveAborted`` and closes the link. Nothing here retries.
- Socket buffer sizes are left to Linux autotuning (no SO_SNDBUF / SO_RCVBUF).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from ringseed.protocol import frames

log = logging.getLogger(__name__)
_PROBE_PIECE = 1 << 20

RingHandler = Callable[[frames.Hello, socket.socket], str | None]  # returns a reject reason or None


def configure(sock: socket.socket, *, io_timeout: float) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(io_timeout)


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` completely from ``sock``; EOF before that is a ConnectionError."""
    got, total = 0, len(view)
    while got < total:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"peer closed the connection after {got} of {total} bytes")
        got += n


def recv_header(sock: socket.socket, buf: bytearray) -> frames.Header:
    recv_exact(sock, memoryview(buf))
    return frames.decode_header(buf)


def send_frame(sock: socket.socket, header: frames.Header, payload: memoryview) -> None:
    """Send header and payload with one ``sendmsg`` where the kernel takes it all."""
    head = frames.encode_header(header)
    sent = sock.sendmsg([head, payload])
    if sent < len(head):
        sock.sendall(head[sent:])
        sent = len(head)
    if sent - len(head) < len(payload):
        sock.sendall(payload[sent - len(head) :])


def dial(
    *,
    host: str,
    port: int,
    token: str,
    peer_id: str,
    epoch: int,
    purpose: frames.Purpose,
    channel: int,
    io_timeout: float,
) -> socket.socket:
    """Connect and complete the handshake; raise FrameError/OSError on failure (socket closed)."""
    sock = socket.create_connection((host, port), timeout=io_timeout)
    try:
        configure(sock, io_timeout=io_timeout)
        challenge = _read(sock, frames.CHALLENGE_BYTES)
        nonce = os.urandom(frames.NONCE_BYTES)
        sock.sendall(
            frames.make_hello(
                token=token,
                challenge=frames.decode_challenge(challenge),
                peer_id=peer_id,
                epoch=epoch,
                purpose=purpose,
                channel=channel,
                nonce=nonce,
            )
        )
        status, mac, reason_len = frames.decode_reply_fixed(_read(sock, frames.REPLY_FIXED_BYTES))
        reason = _read(sock, reason_len) if reason_len else b""
        frames.check_reply(token=token, hello_nonce=nonce, status=status, mac=mac, reason=reason)
    except BaseException:
        sock.close()
        raise
    return sock


class Listener:
    """Accepts ring and probe connections for one engine."""

    def __init__(self, *, host: str, port: int, token: str, io_timeout: float, on_ring: RingHandler) -> None:
        self._token = token
        self._io_timeout = io_timeout
        self._on_ring = on_ring
        self._sock = socket.create_server((host, port), backlog=64)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="ringseed-accept", daemon=True)
        self.rejected = 0  # handshakes refused so far (for tests and metrics)
        self._count_lock = threading.Lock()

    @property
    def port(self) -> int:
        port: int = self._sock.getsockname()[1]
        return port

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.01)
                continue
            threading.Thread(target=self._handshake, args=(conn,), name="ringseed-handshake", daemon=True).start()

    def _handshake(self, conn: socket.socket) -> None:
        keep = False
        try:
            configure(conn, io_timeout=self._io_timeout)
            hello = self._read_hello(conn)
            keep = self._dispatch(hello, conn)
        except (frames.FrameError, OSError) as exc:
            log.warning("Refused a collective connection: %s", exc)
        finally:
            if not keep:
                conn.close()

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        """Count the refusal first (so a dialer that sees the reason also sees the count), then answer."""
        with self._count_lock:
            self.rejected += 1
        _try_send(conn, frames.make_reply(token=self._token, hello_nonce=b"", reject_reason=reason))

    def _read_hello(self, conn: socket.socket) -> frames.Hello:
        challenge = os.urandom(frames.NONCE_BYTES)
        conn.sendall(frames.encode_challenge(challenge))
        try:
            fixed = _read(conn, frames.HELLO_FIXED_BYTES)
            _, _, _, _, _, id_len = frames.decode_hello_fixed(fixed)
            return frames.verify_hello(
                token=self._token, challenge=challenge, fixed=fixed, peer_id_bytes=_read(conn, id_len)
            )
        except (frames.FrameError, OSError) as exc:
            self._refuse(conn, str(exc))
            raise

    def _dispatch(self, hello: frames.Hello, conn: socket.socket) -> bool:
        if hello.purpose is frames.Purpose.PROBE:
            conn.sendall(frames.make_reply(token=self._token, hello_nonce=hello.nonce))
            _serve_probe(conn)
            return False
        reason = self._on_ring(hello, conn)
        if reason is not None:
            self._refuse(conn, reason)
            raise frames.FrameError(f"connection from {hello.peer_id!r} refused: {reason}")
        _try_send(conn, frames.make_reply(token=self._token, hello_nonce=hello.nonce))
        return True


def probe(*, sock: socket.socket, nbytes: int) -> float:
    """Send ``nbytes`` of probe data and wait for the ack; returns bytes per second."""
    payload = memoryview(bytearray(min(nbytes, _PROBE_PIECE)))
    start = time.perf_counter()
    sock.sendall(
        frames.encode_header(
            frames.Header(kind=frames.Kind.PROBE, dtype=frames.DType.U8, tag=0, sequence=0, nbytes=nbytes)
        )
    )
    left = nbytes
    while left:
        sock.sendall(payload[: min(left, len(payload))])
        left -= min(left, len(payload))
    ack = recv_header(sock, bytearray(frames.HEADER_BYTES))
    frames.check_expected(ack, kind=frames.Kind.PROBE_ACK, tag=0, sequence=0, dtype=frames.DType.U8, nbytes=0)
    return nbytes / max(time.perf_counter() - start, 1e-9)


def _serve_probe(conn: socket.socket) -> None:
    header = recv_header(conn, bytearray(frames.HEADER_BYTES))
    if header.kind is not frames.Kind.PROBE:
        raise frames.FrameError(f"probe connection sent a {header.kind.name} frame")
    scratch = memoryview(bytearray(_PROBE_PIECE))
    left = header.nbytes
    while left:
        step = min(left, len(scratch))
        recv_exact(conn, scratch[:step])
        left -= step
    conn.sendall(
        frames.encode_header(
            frames.Header(kind=frames.Kind.PROBE_ACK, dtype=frames.DType.U8, tag=0, sequence=0, nbytes=0)
        )
    )


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_exact(sock, memoryview(buf))
    return bytes(buf)


def _try_send(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(data)


def wake(sock: socket.socket) -> None:
    """Shut ``sock`` down so any thread blocked on it returns with an error (idempotent, no close)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
