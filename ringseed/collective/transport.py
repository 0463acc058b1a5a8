"""TCP transport of the collective data plane: dialer, handshake, frames on sockets.

What this module owns
- :func:`dial`: connects, answers the challenge, checks the listener's proof of the token.
- :func:`probe`: one bandwidth measurement over a probe connection (served by ``listener.py``).
- Frame I/O: :func:`send_frame` (``sendmsg`` of header + memoryview, no copy) and
  :func:`recv_header` / :func:`recv_exact` (``recv_into`` preallocated buffers, no copy); for
  the loops that drive non-blocking descriptors themselves (``runner.py``, ``small.py``):
  :func:`advance` (the rest of a partly written frame) and :func:`check_header`.

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
import select
import socket
import time
from collections.abc import Sequence

from ringseed.protocol import frames

log = logging.getLogger(__name__)
_PROBE_PIECE = 1 << 20


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


def check_header(received: memoryview, expected: bytes) -> None:
    """Check a received header against the encoding of the expected one. A header has one encoding
    per value, so equal bytes are the whole check; a difference is decoded to name the field that
    differs (or what is malformed) in the FrameError."""
    if received == expected:
        return
    want = frames.decode_header(expected)
    frames.check_expected(
        frames.decode_header(received),
        kind=want.kind,
        tag=want.tag,
        sequence=want.sequence,
        dtype=want.dtype,
        nbytes=want.nbytes,
    )
    raise frames.FrameError(f"frame header differs from the expected one (tag {want.tag})")


def advance(views: list[memoryview], n: int) -> list[memoryview]:
    """What is left of ``views`` (one frame being written with ``writev``) after ``n`` bytes went out."""
    while views and n >= len(views[0]):
        n -= len(views[0])
        views = views[1:]
    if views and n:
        views = [views[0][n:], *views[1:]]
    return views


def wait(*, read: Sequence[int], write: Sequence[int], timeout: float) -> bool:
    """Block until a descriptor of ``read`` is readable or one of ``write`` writable (an error or a
    hang-up counts: the next call on it says which), at most ``timeout`` seconds; False if none.
    ``poll``, not ``select``: a busy process has descriptors above FD_SETSIZE (1024)."""
    poller = select.poll()
    events: dict[int, int] = {}
    for fd in read:
        events[fd] = events.get(fd, 0) | select.POLLIN
    for fd in write:
        events[fd] = events.get(fd, 0) | select.POLLOUT
    for fd, mask in events.items():
        poller.register(fd, mask)
    return bool(poller.poll(max(0, int(timeout * 1000))))


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


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_exact(sock, memoryview(buf))
    return bytes(buf)


def wake(sock: socket.socket) -> None:
    """Shut ``sock`` down so any thread blocked on it returns with an error (idempotent, no close)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
