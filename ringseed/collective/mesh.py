"""Point-to-point messages between any two peers: one direct link per ordered pair, tag matching.

What this module owns
- :class:`Mesh`: for every other rank, one outgoing direct link (this peer dialed it, only this
  peer writes it) and one incoming (that peer dialed us, only we read it). One reader thread per
  incoming link, started with the mesh and living with it, always drains its link: a message
  lands in the receive posted for its ``(source, tag)``, straight into the caller's buffer, or,
  when none is posted yet, in a buffer kept until one is. Because every link is always drained,
  a send never waits on what the receiver does, so no order of sends and receives deadlocks.
- Messages of one ``(source, tag)`` are matched in the order they were sent; different tags are
  independent. A receive may name no source (:meth:`Mesh.post` with ``src=None``): it takes the
  first message of its tag from anyone.

Fault-tolerance contract
- A link that fails (EOF, stall past ``io_timeout``, malformed frame) or :meth:`Mesh.abort`
  fails every posted and every later receive with :class:`MeshError` naming the cause; sends
  on a failed mesh raise it too. The caller's buffer of a failed receive may be partly written.
- A message whose size differs from the posted buffer fails that receive (and the mesh: the
  peers disagree on the program) instead of writing past or short of the buffer.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import socket
import threading
import time
from collections.abc import Mapping

from ringseed.collective import transport
from ringseed.protocol import frames


class MeshError(Exception):
    """A direct link failed or the mesh was aborted; the message names the cause."""


@dataclasses.dataclass(eq=False)
class Receive:
    """A posted receive: complete once ``done`` is set (check ``error`` then)."""

    src: int | None
    tag: int
    buffer: memoryview | None  # None: take the message at whatever size it has
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    future: concurrent.futures.Future[int] = dataclasses.field(default_factory=concurrent.futures.Future)
    source: int = -1
    data: bytes | bytearray | None = None
    error: str | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Block until complete; returns the source rank; raises MeshError or TimeoutError."""
        if not self.done.wait(timeout):
            raise TimeoutError(f"no message with tag {self.tag} from {_who(self.src)} within {timeout} s")
        if self.error is not None:
            raise MeshError(self.error)
        return self.source


class Mesh:
    """Direct links of one peer to every other rank of a fixed world."""

    def __init__(
        self, *, rank: int, outs: Mapping[int, socket.socket], ins: Mapping[int, socket.socket], io_timeout: float
    ) -> None:
        self.rank = rank
        self._io_timeout = io_timeout
        self._outs = dict(outs)
        self._ins = dict(ins)
        self._send_locks = {r: threading.Lock() for r in self._outs}
        self._lock = threading.Lock()
        self._posted: dict[tuple[int | None, int], collections.deque[Receive]] = collections.defaultdict(
            collections.deque
        )
        self._early: dict[tuple[int, int], collections.deque[bytearray]] = collections.defaultdict(collections.deque)
        self._error: str | None = None
        self._threads: list[threading.Thread] = []
        try:
            for src, sock in self._ins.items():
                thread = threading.Thread(target=self._read, args=(src, sock), name=f"ringseed-mesh-{rank}<{src}")
                thread.daemon = True
                thread.start()
                self._threads.append(thread)
        except BaseException:
            self.abort("could not start the mesh's reader threads")
            raise

    # ----- sending ---------------------------------------------------------------------------

    def send(self, dst: int, *, tag: int, payload: memoryview) -> None:
        """Write one message to ``dst`` (blocking until the kernel took it; the reader drains it)."""
        self._check()
        if dst not in self._outs:
            raise ValueError(f"no direct link to rank {dst} (this is rank {self.rank})")
        header = frames.Header(
            kind=frames.Kind.MESSAGE, dtype=frames.DType.U8, tag=tag, sequence=self.rank, nbytes=len(payload)
        )
        try:
            with self._send_locks[dst]:
                transport.send_frame(self._outs[dst], header, payload)
        except OSError as exc:
            self.abort(f"direct link to rank {dst} failed: {exc}")
            raise MeshError(self._error or str(exc)) from exc

    # ----- receiving -------------------------------------------------------------------------

    def post(self, *, src: int | None, tag: int, buffer: memoryview | None) -> Receive:
        """Post a receive of the next message with ``tag`` from ``src`` (any source when None)."""
        receive = Receive(src=src, tag=tag, buffer=buffer)
        with self._lock:
            if self._error is not None:
                self._finish(receive, error=self._error)
                return receive
            early = self._take_early(src, tag)
            if early is None:
                self._posted[(src, tag)].append(receive)
                return receive
        source, data = early
        self._deliver(receive, source=source, data=data)
        return receive

    def recv(self, *, src: int | None, tag: int, buffer: memoryview | None, timeout: float | None = None) -> Receive:
        receive = self.post(src=src, tag=tag, buffer=buffer)
        receive.wait(timeout)
        return receive

    def cancel(self, receive: Receive) -> bool:
        """Withdraw a posted receive that has not matched yet (a timed-out wait); True if withdrawn."""
        with self._lock:
            queue = self._posted.get((receive.src, receive.tag))
            if queue is not None and receive in queue:
                queue.remove(receive)
                return True
        return False

    def abort(self, reason: str) -> None:
        """Fail every posted and later receive and send; wake the reader threads (idempotent)."""
        with self._lock:
            if self._error is None:
                self._error = reason
            waiting = [r for queue in self._posted.values() for r in queue]
            self._posted.clear()
        for receive in waiting:
            self._finish(receive, error=reason)
        for sock in [*self._outs.values(), *self._ins.values()]:
            transport.wake(sock)

    def close(self) -> None:
        self.abort("mesh closed")
        for sock in [*self._outs.values(), *self._ins.values()]:
            sock.close()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the reader threads to end (after :meth:`close`); True if they did."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    # ----- internals ---------------------------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise MeshError(self._error)

    def _take_early(self, src: int | None, tag: int) -> tuple[int, bytearray] | None:
        sources = [src] if src is not None else sorted({s for s, t in self._early if t == tag})
        for source in sources:
            queue = self._early.get((source, tag))
            if queue:
                data = queue.popleft()
                if not queue:
                    del self._early[(source, tag)]
                return source, data
        return None

    def _match(self, source: int, tag: int) -> Receive | None:
        """The receive this message goes to: the oldest posted for its source, else for any source."""
        for key in ((source, tag), (None, tag)):
            queue = self._posted.get(key)
            if queue:
                receive = queue.popleft()
                if not queue:
                    del self._posted[key]
                return receive
        return None

    def _read(self, src: int, sock: socket.socket) -> None:
        head = bytearray(frames.HEADER_BYTES)
        try:
            while True:
                sock.settimeout(None)  # idle between messages for as long as the program likes
                header = transport.recv_header(sock, head)
                sock.settimeout(self._io_timeout)  # but a message, once begun, must keep flowing
                if header.kind is not frames.Kind.MESSAGE or header.sequence != src:
                    raise frames.FrameError(
                        f"rank {src} sent a {header.kind.name} frame claiming rank {header.sequence}"
                    )
                with self._lock:
                    receive = self._match(src, header.tag)
                if receive is None:
                    data = bytearray(header.nbytes)
                    transport.recv_exact(sock, memoryview(data))
                    self._stash(src, header.tag, data)
                elif receive.buffer is None or len(receive.buffer) == header.nbytes:
                    self._fill(receive, sock, source=src, nbytes=header.nbytes)
                else:
                    raise frames.FrameError(
                        f"rank {src} sent {header.nbytes} bytes with tag {header.tag}, "
                        f"the receive expects {len(receive.buffer)}"
                    )
        except (OSError, frames.FrameError, ValueError) as exc:
            reason = "peer stalled past the I/O timeout" if isinstance(exc, TimeoutError) else str(exc)
            self.abort(f"direct link from rank {src} failed: {reason}")

    def _stash(self, src: int, tag: int, data: bytearray) -> None:
        with self._lock:
            receive = self._match(src, tag)  # posted while the payload was arriving
            if receive is None:
                self._early[(src, tag)].append(data)
                return
        self._deliver(receive, source=src, data=data)

    def _fill(self, receive: Receive, sock: socket.socket, *, source: int, nbytes: int) -> None:
        if receive.buffer is None:
            data = bytearray(nbytes)
            transport.recv_exact(sock, memoryview(data))
            receive.data = data
        else:
            transport.recv_exact(sock, receive.buffer)
        self._finish(receive, source=source)

    def _deliver(self, receive: Receive, *, source: int, data: bytearray) -> None:
        if receive.buffer is None:
            receive.data = data
        elif len(receive.buffer) != len(data):
            self._finish(
                receive,
                error=f"rank {source} sent {len(data)} bytes with tag {receive.tag}, "
                f"the receive expects {len(receive.buffer)}",
            )
            return
        else:
            receive.buffer[:] = data
        self._finish(receive, source=source)

    @staticmethod
    def _finish(receive: Receive, *, source: int = -1, error: str | None = None) -> None:
        receive.source, receive.error = source, error
        receive.done.set()
        if error is None:
            receive.future.set_result(source)
        else:
            receive.future.set_exception(MeshError(error))


def _who(src: int | None) -> str:
    return "any rank" if src is None else f"rank {src}"


def deadline_left(deadline: float | None) -> float | None:
    """Seconds left until a ``time.monotonic()`` deadline (None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
