"""Executes one ring :class:`schedule.Plan` over a rank's links, on the calling thread.

What this module owns
- :func:`execute`: one loop on the caller's thread drives every link of the op with
  non-blocking system calls: it writes the next ready frame to the successor (``writev`` of the
  header and a memoryview of the array itself, no copy) and reads from the predecessor
  (``readv`` into the array, for copies, or into a staging buffer, for reductions, which it then
  combines with in-place numpy ufuncs), and waits in one ``poll`` only when neither side can
  move. Segment ``k`` travels on connection ``k % C`` (``connections_per_peer``). There is no
  I/O thread and so no hand-off per segment: measured on a shared 2-core machine, the thread per
  link and direction cost more (context switches, the GIL passed back and forth) than sending
  and receiving in turn; the kernel does the copies either way.
- Quantised transfer: reduce-scatter hops encode the sender's partial sum; the owner of a
  segment encodes its final value once into stored bytes, decodes them into its own array,
  and the all-gather forwards exactly those bytes, so all peers decode identical bytes.
- :class:`Reducer`, the seam through which a device (``tensors.py``) can do the combining on
  the GPU: it receives the host-side destination range and the received values.

Rules
- Every received header is checked against the plan (kind, dtype, tag, sequence, byte count)
  before any of its payload is read: a header is read on its own, or, once the previous frame's
  payload is being read, into a second header buffer behind it (never past the plan's last
  frame on that link, which would take bytes of the next operation).
- The links must be in non-blocking (timeout) mode (``transport.configure``); no progress on
  any link for ``io_timeout`` is a stall.

Fault-tolerance contract
- Any exception (``FrameError``, a stall, EOF, a socket error, and equally a reducer, quantizer
  or copy raising) calls ``fail(reason)`` once, which must wake every socket of the op (the
  engine shuts the links down, so the neighbours' loops fail at once with EOF and abort theirs
  the same way), and :func:`execute` raises :class:`Failed` with the first reason, chained to
  the original exception. :meth:`Run.cancel` ends a run from outside (an engine abort, which
  also shuts the links down). The array may be partly modified; restoring it is the caller's job.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ringseed.collective import ops, quantize, schedule, transport
from ringseed.protocol import frames


class Failed(Exception):
    """The plan could not complete; the message is the first cause."""


class Reducer(Protocol):
    """Combines received values into the destination; the default works on the numpy array."""

    def combine(self, *, start: int, stop: int, src: np.ndarray, op: ops.ReduceOp) -> None: ...

    def divide(self, *, start: int, stop: int, divisor: int) -> None: ...


@dataclasses.dataclass(frozen=True)
class NumpyReducer:
    array: np.ndarray
    dtype: frames.DType

    def combine(self, *, start: int, stop: int, src: np.ndarray, op: ops.ReduceOp) -> None:
        ops.combine(self.array[start:stop], src, op=op, dtype=self.dtype)

    def divide(self, *, start: int, stop: int, divisor: int) -> None:
        ops.divide(self.array[start:stop], divisor=divisor, dtype=self.dtype)


@dataclasses.dataclass(frozen=True)
class Job:
    plan: schedule.Plan
    array: np.ndarray  # 1-D, C-contiguous, storage dtype of ``dtype``
    dtype: frames.DType
    op: ops.ReduceOp
    tag: int
    world: int
    quantize: str | None
    reducer: Reducer


class Run:
    """One plan in flight. :meth:`cancel` (any thread) and any local error end it promptly."""

    def __init__(self, job: Job, *, fail: Callable[[str], None]) -> None:
        self.job = job
        self._lock = threading.Lock()
        self.failed = False
        self.reason = ""
        self.cause: BaseException | None = None
        self._fail = fail
        self.stored: list[np.ndarray | None] = [None] * job.plan.segments

    def cancel(self, reason: str) -> None:
        """Make the loop stop (the caller also wakes the sockets); the first reason wins."""
        with self._lock:
            if not self.failed:
                self.failed, self.reason = True, reason

    def _report(self, reason: str, cause: BaseException) -> None:
        with self._lock:
            if self.failed:
                return  # a consequence of an earlier failure (or cancel), not a cause
            self.failed, self.reason, self.cause = True, reason, cause
        self._fail(reason)


def execute(run: Run, *, outs: Sequence[socket.socket], ins: Sequence[socket.socket], io_timeout: float) -> None:
    """Run the plan to completion on this thread, or raise Failed (after ``fail`` woke everything)."""
    tag = run.job.tag
    try:
        _drive(run, outs, ins, io_timeout)
    except Failed:
        pass  # cancelled: the reason is recorded
    except frames.FrameError as exc:
        run._report(f"malformed or unexpected frame: {exc}", exc)
    except TimeoutError as exc:
        run._report(f"peer stalled: no data for the I/O timeout (tag {tag})", exc)
    except OSError as exc:
        run._report(f"connection failed: {exc}", exc)
    except Exception as exc:  # a reducer, quantizer or copy raising (a CUDA error, a user reducer, a bug)
        run._report(f"{type(exc).__name__} in the ring runner (tag {tag}): {exc}", exc)
    if run.failed:
        raise Failed(run.reason or "aborted") from run.cause


def _drive(run: Run, outs: Sequence[socket.socket], ins: Sequence[socket.socket], io_timeout: float) -> None:
    plan, channels = run.job.plan, len(outs)
    if channels != len(ins) or any(s.gettimeout() is None for s in (*outs, *ins)):
        raise RuntimeError("ring links must come in pairs and be in timeout (non-blocking) mode")
    done = bytearray(len(plan.recvs))
    senders = [_Sender(run, outs[c].fileno(), plan.sends[c::channels], done) for c in range(channels)]
    receivers = [_Receiver(run, ins[c].fileno(), plan.recvs[c::channels], done) for c in range(channels)]
    while True:
        if run.failed:
            raise Failed("aborted")
        progressed = False
        for sender in senders:
            progressed = sender.step() or progressed
        for receiver in receivers:
            progressed = receiver.step() or progressed
        if progressed:
            continue
        readable = [r.fd for r in receivers if r.pending()]
        writable = [s.fd for s in senders if s.ready()]
        if not readable and not writable:
            if any(s.pending() for s in senders):  # waiting for a receive that is not pending: a plan bug
                raise RuntimeError("ring plan has a send waiting for a receive that never comes")
            return
        if not transport.wait(read=readable, write=writable, timeout=io_timeout):
            raise TimeoutError(f"no progress for {io_timeout} s")


class _Sender:
    """The frames of one outgoing link, in order; a frame goes out once its dependency is done."""

    def __init__(self, run: Run, fd: int, items: Sequence[schedule.Send], done: bytearray) -> None:
        self.run, self.fd, self.items, self.done = run, fd, items, done
        self.index = 0
        self.left: list[memoryview] = []  # what is left of the frame being written
        job = run.job
        self.wire = quantize.wire_dtype(job.quantize) if job.quantize else job.dtype
        self.scratch = np.empty(0, np.uint8)

    def pending(self) -> bool:
        return self.index < len(self.items)

    def ready(self) -> bool:
        """A frame can be written now (the next one's dependency is done, or one is half-written)."""
        if self.left:
            return True
        if self.index >= len(self.items):
            return False
        after = self.items[self.index].after
        return after is None or bool(self.done[after])

    def step(self) -> bool:
        """Write what the socket takes; True when bytes went out."""
        if not self.left:
            if not self.ready():
                return False
            self.left = self._frame(self.items[self.index])
        try:
            n = os.writev(self.fd, self.left)
        except BlockingIOError:
            return False
        self.left = transport.advance(self.left, n)
        if not self.left:
            self.index += 1
        return True

    def _frame(self, item: schedule.Send) -> list[memoryview]:
        job = self.run.job
        if job.quantize is None:
            payload = _bytes(job.array[item.start : item.stop])
        elif item.stored:
            payload = _bytes(_stored(self.run, item.seg))
        else:
            nbytes = quantize.encoded_nbytes(item.stop - item.start, job.quantize)
            self.scratch = _grow(self.scratch, nbytes)
            out = self.scratch[:nbytes]
            quantize.encode(job.array[item.start : item.stop], dtype=job.dtype, mode=job.quantize, out=out)
            payload = _bytes(out)
        header = frames.Header(
            kind=frames.Kind.DATA, dtype=self.wire, tag=job.tag, sequence=item.seq, nbytes=len(payload)
        )
        return [memoryview(frames.encode_header(header)), payload]


class _Receiver:
    """The frames of one incoming link, in order: header, check, payload, then combine or keep."""

    def __init__(self, run: Run, fd: int, items: Sequence[schedule.Recv], done: bytearray) -> None:
        self.run, self.fd, self.items, self.done = run, fd, items, done
        job = run.job
        self.wire = quantize.wire_dtype(job.quantize) if job.quantize else job.dtype
        self.index = 0
        self.head = memoryview(bytearray(frames.HEADER_BYTES))
        self.ahead = memoryview(bytearray(frames.HEADER_BYTES))  # the next frame's header, read behind a payload
        self.head_got = 0
        self.target: memoryview | None = None  # where the payload goes, set once its header is checked
        self.got = 0
        self.staging = np.empty(0, job.array.dtype)
        self.wire_buf = np.empty(0, np.uint8)

    def pending(self) -> bool:
        return self.index < len(self.items)

    def step(self) -> bool:
        """Read what has arrived; True when bytes came in."""
        if self.index >= len(self.items):
            return False
        if self.target is None:
            views = [self.head[self.head_got :]]
        else:
            views = [self.target[self.got :]]
            if self.index + 1 < len(self.items):
                views.append(self.ahead)
        try:
            n = os.readv(self.fd, views)
        except BlockingIOError:
            return False
        if n == 0:
            seq, tag = self.items[self.index].seq, self.run.job.tag
            raise ConnectionError(f"peer closed the connection in frame {seq} of operation tag {tag}")
        if self.target is None:
            self.head_got += n
        else:
            take = min(n, len(self.target) - self.got)
            self.got += take
            if self.got == len(self.target):
                self._complete(self.items[self.index])
                self.index += 1
                self.head, self.ahead = self.ahead, self.head
                self.head_got, self.target, self.got = n - take, None, 0
        if self.target is None and self.head_got == frames.HEADER_BYTES and self.index < len(self.items):
            self.target = self._check(self.items[self.index])
        return True

    def _nbytes(self, item: schedule.Recv) -> int:
        job = self.run.job
        count = item.stop - item.start
        return quantize.encoded_nbytes(count, job.quantize) if job.quantize else count * job.array.itemsize

    def _check(self, item: schedule.Recv) -> memoryview:
        """Check the header against the plan, then name where the payload goes."""
        job = self.run.job
        nbytes = self._nbytes(item)
        expected = frames.encode_header(
            frames.Header(kind=frames.Kind.DATA, dtype=self.wire, tag=job.tag, sequence=item.seq, nbytes=nbytes)
        )
        transport.check_header(self.head, expected)
        count = item.stop - item.start
        if job.quantize is not None:
            if not item.reduce:  # all-gather: these bytes are kept to be forwarded
                self.run.stored[item.seg] = np.empty(nbytes, np.uint8)
                return _bytes(_stored(self.run, item.seg))
            self.wire_buf = _grow(self.wire_buf, nbytes)
            return _bytes(self.wire_buf[:nbytes])
        if item.reduce:
            self.staging = _grow(self.staging, count)
            return _bytes(self.staging[:count])
        return _bytes(job.array[item.start : item.stop])

    def _complete(self, item: schedule.Recv) -> None:
        job, count = self.run.job, item.stop - item.start
        if job.quantize is not None:
            region = job.array[item.start : item.stop]
            if not item.reduce:
                quantize.decode(_stored(self.run, item.seg), dtype=job.dtype, mode=job.quantize, out=region)
            else:
                self.staging = _grow(self.staging, count)
                values = self.staging[:count]
                quantize.decode(self.wire_buf[: self._nbytes(item)], dtype=job.dtype, mode=job.quantize, out=values)
                _reduce(job, item, values)
                if item.final:  # the owner: encode once, decode the same bytes
                    stored = np.empty(self._nbytes(item), np.uint8)
                    quantize.encode(region, dtype=job.dtype, mode=job.quantize, out=stored)
                    self.run.stored[item.seg] = stored
                    quantize.decode(stored, dtype=job.dtype, mode=job.quantize, out=region)
        elif item.reduce:
            _reduce(job, item, self.staging[:count])
        self.done[item.seq] = 1


def _reduce(job: Job, item: schedule.Recv, values: np.ndarray) -> None:
    job.reducer.combine(start=item.start, stop=item.stop, src=values, op=job.op)
    if item.final and job.op is ops.ReduceOp.AVG:
        job.reducer.divide(start=item.start, stop=item.stop, divisor=job.world)


def _stored(run: Run, seg: int) -> np.ndarray:
    data = run.stored[seg]
    if data is None:
        raise RuntimeError(f"segment {seg} has no stored bytes (schedule bug)")
    return data


def _grow(buf: np.ndarray, count: int) -> np.ndarray:
    return buf if len(buf) >= count else np.empty(count, buf.dtype)


def _bytes(array: np.ndarray) -> memoryview:
    """A byte view of a contiguous array, no copy."""
    return array.data.cast("B")
