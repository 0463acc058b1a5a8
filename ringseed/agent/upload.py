"""Chunk bodies sent by worker threads, straight from the chunk to the connection's socket.

The send path of the agent. aiohttp writes a body through asyncio's transport, which sends what
the socket takes at once and copies the rest into its own buffer, then wakes the event loop for
every few hundred KiB the socket drains (and ``loop.sendfile`` does the same dance around each
``sendfile`` call). Here the handler keeps aiohttp for the request and the response head, then
lends the connection to a worker thread that writes the whole body itself: ``send`` from the
memory tier's buffer, ``sendfile`` from the staged files, waiting with ``poll`` when the socket is
full. No byte is copied in user space and the event loop is not woken per piece.

Rules:
- The body goes out only when the transport's buffer is empty (the head is on the wire) and
  the connection is a plain socket; otherwise :meth:`Uploads.send` returns None and the caller
  writes the body through aiohttp as before.
- While the thread writes, the transport does not read (``pause_reading``, restored after):
  nothing else touches the socket. The thread works on a duplicate of the socket's descriptor
  and closes it itself, so a descriptor number is never used after the loop let it go.
- A peer that takes nothing for ``stall`` seconds ends the upload (``TimeoutError``); a peer
  that went away ends it with the socket's error. Either way the connection is closed (the head
  is out, so a body cut short is how the peer learns). Cancelling the handler shuts the
  connection down, which ends the thread's write at once.
- At most ``threads`` bodies are written at once; more wait for a thread (the agent's upload
  slots bound them anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web as aioweb

STALL_S = 30.0


class Uploads:
    """Worker threads that write response bodies to their connections."""

    def __init__(self, *, threads: int, stall: float = STALL_S) -> None:
        self._executor = ThreadPoolExecutor(max(1, threads), thread_name_prefix="upload")
        self.stall = stall

    async def send(self, request: aioweb.Request, write: Callable[[socket.socket], int]) -> int | None:
        """Run ``write(sock)`` on a worker thread; its result (bytes sent), or None if the
        connection cannot be lent now (the caller sends the body itself)."""
        transport = request.transport
        raw = transport.get_extra_info("socket") if transport is not None else None
        if transport is None or raw is None or transport.is_closing() or transport.get_write_buffer_size():
            return None
        sock = socket.socket(fileno=os.dup(raw.fileno()))
        reading = transport.is_reading()
        if reading:
            transport.pause_reading()

        def run() -> int:
            with sock:
                return write(sock)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, run)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the thread's write fails now; it closes its socket
            raise
        except BaseException:
            transport.close()  # the head is out: a body cut short is the only way to say "failed"
            raise
        finally:
            if reading and not transport.is_closing():
                transport.resume_reading()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _wait_writable(poller: select.poll, stall: float) -> None:
    if not poller.poll(stall * 1000):
        raise TimeoutError(f"the peer took no bytes for {stall:g} s")


def send_view(sock: socket.socket, view: memoryview, *, stall: float = STALL_S) -> int:
    """Write all of ``view`` to the (non-blocking) socket; bytes sent."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    sent = 0
    while sent < len(view):
        try:
            sent += sock.send(view[sent:])
        except BlockingIOError:
            _wait_writable(poller, stall)
    return sent


def send_files(sock: socket.socket, slices: Sequence[tuple[Path, int, int]], *, stall: float = STALL_S) -> int:
    """``sendfile`` each ``(path, offset, length)`` slice in turn to the socket; bytes sent."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    total = 0
    for path, offset, length in slices:
        with open(path, "rb") as f:
            done = 0
            while done < length:
                try:
                    sent = os.sendfile(sock.fileno(), f.fileno(), offset + done, length - done)
                except BlockingIOError:
                    _wait_writable(poller, stall)
                    continue
                if sent == 0:
                    raise OSError(f"{path} ended at {offset + done}, before {offset + length}")
                done += sent
        total += length
    return total
