"""Executes one ring :class:`schedule.Plan` over a rank's links (threads, blocking sockets).

What this module owns
- One sender loop and one receiver loop per connection (``connections_per_peer`` of each);
  segment ``k`` travels on connection ``k % C``. Senders ``sendmsg`` memoryviews of the
  array itself; receivers ``recv_into`` the array (copies) or a preallocated staging buffer
  (reductions), then combine with in-place numpy ufuncs, so sending, receiving and reducing
  overlap and large buffers are never copied by Python.
- Quantised transfer: reduce-scatter hops encode the sender's partial sum; the owner of a
  segment encodes its final value once into stored bytes, decodes them into its own array,
  and the all-gather forwards exactly those bytes, so all peers decode identical bytes.
- :class:`Reducer`, the seam through which a device (``tensors.py``) can do the combining on
  the GPU: it receives the host-side destination range and the received values.

Fault-tolerance contract
- Every received header is validated against the plan before its payload is read.
- Any exception in a loop (``FrameError``, timeout, EOF, socket error, and equally a reducer,
  quantizer or copy raising, or an I/O thread that cannot start) calls ``fail(reason)`` once,
  which must wake every socket of the op (the engine shuts the links down, so the neighbours'
  loops fail at once with EOF and abort theirs the same way); the other loops then stop, and
  :meth:`Run.execute` raises :class:`Failed` with the first reason, chained to the original
  exception. :meth:`Run.cancel` ends a run from outside (an engine abort). The array may be
  partly modified; restoring it is the caller's job.
"""

from __future__ import annotations

import dataclasses
import queue
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
        self.cond = threading.Condition()
        self.done = bytearray(len(job.plan.recvs))
        self.failed = False
        self.reason = ""
        self.cause: BaseException | None = None
        self._fail = fail
        self._loops_left = 0
        self.stored: list[np.ndarray | None] = [None] * job.plan.segments

    def cancel(self, reason: str) -> None:
        """Stop waiting loops (the caller wakes the sockets); the first reason wins."""
        with self.cond:
            if not self.failed:
                self.failed, self.reason = True, reason
            self.cond.notify_all()

    def mark(self, index: int) -> None:
        with self.cond:
            self.done[index] = 1
            self.cond.notify_all()

    def wait_for(self, index: int) -> None:
        with self.cond:
            while not self.done[index]:
                if self.failed:
                    raise Failed("aborted while waiting for a segment")
                self.cond.wait()

    def guard(self, loop: Callable[..., None], *args: object) -> None:
        """Run one loop; any exception becomes the run's failure (or a consequence of an earlier one)."""
        try:
            loop(self, *args)
        except Failed:
            pass  # the run already failed or was cancelled; the first reason is recorded
        except frames.FrameError as exc:
            self._report(f"malformed or unexpected frame: {exc}", exc)
        except TimeoutError as exc:
            self._report(f"peer stalled: no data for the I/O timeout (tag {self.job.tag})", exc)
        except OSError as exc:
            self._report(f"connection failed: {exc}", exc)
        except Exception as exc:  # a reducer, quantizer or copy raising (a CUDA error, a user reducer, a bug)
            self._report(f"{type(exc).__name__} in the ring runner (tag {self.job.tag}): {exc}", exc)

    def _report(self, reason: str, cause: BaseException) -> None:
        with self.cond:
            if self.failed:
                return  # a consequence of an earlier failure, not a cause
            self.failed, self.reason, self.cause = True, reason, cause
            self.cond.notify_all()
        self._fail(reason)

    def _expect(self, loops: int) -> None:
        with self.cond:
            self._loops_left = loops

    def _loop_done(self) -> None:
        with self.cond:
            self._loops_left -= 1
            self.cond.notify_all()

    def _wait_loops(self) -> None:
        with self.cond:
            while self._loops_left > 0:
                self.cond.wait()


class Crew:
    """The ring's I/O threads: one sender per outgoing link and one receiver per incoming link,
    started with the links and living as long as they do; each runs its part of every plan.

    Starting the threads with the links (not per operation) means an operation never needs a new
    thread: a process at its pids limit fails in ``set_ring`` with a clear error, never mid-op."""

    def __init__(self, *, outs: Sequence[socket.socket], ins: Sequence[socket.socket], name: str) -> None:
        loops = [(_send_loop, s, i, len(outs)) for i, s in enumerate(outs)]
        loops += [(_recv_loop, s, i, len(ins)) for i, s in enumerate(ins)]
        self._queues: list[queue.SimpleQueue[Run | None]] = []
        try:
            for k, args in enumerate(loops):
                jobs: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
                thread = threading.Thread(target=_serve, args=(jobs, *args), name=f"{name}-{k}", daemon=True)
                thread.start()
                self._queues.append(jobs)
        except BaseException:
            self.close()
            raise

    def execute(self, run: Run) -> None:
        """Run the plan to completion or raise Failed (after ``fail`` woke everything)."""
        run._expect(len(self._queues))
        for jobs in self._queues:
            jobs.put(run)
        run._wait_loops()
        if run.failed:
            raise Failed(run.reason or "aborted") from run.cause

    def close(self) -> None:
        """Let the threads exit once their current loop ends (the caller wakes the sockets); no wait."""
        for jobs in self._queues:
            jobs.put(None)


def _serve(jobs: queue.SimpleQueue[Run | None], loop: Callable[..., None], *args: object) -> None:
    while (run := jobs.get()) is not None:
        try:
            run.guard(loop, *args)
        finally:
            run._loop_done()


def _send_loop(state: Run, sock: socket.socket, channel: int, channels: int) -> None:
    job = state.job
    wire = quantize.wire_dtype(job.quantize) if job.quantize else job.dtype
    scratch = np.empty(0, np.uint8)
    for item in job.plan.sends[channel::channels]:
        if item.after is not None:
            state.wait_for(item.after)
        if state.failed:
            raise Failed("aborted")
        if job.quantize is None:
            payload = _bytes(job.array[item.start : item.stop])
        elif item.stored:
            payload = _bytes(_stored(state, item.seg))
        else:
            scratch = _grow(scratch, quantize.encoded_nbytes(item.stop - item.start, job.quantize))
            out = scratch[: quantize.encoded_nbytes(item.stop - item.start, job.quantize)]
            quantize.encode(job.array[item.start : item.stop], dtype=job.dtype, mode=job.quantize, out=out)
            payload = _bytes(out)
        header = frames.Header(kind=frames.Kind.DATA, dtype=wire, tag=job.tag, sequence=item.seq, nbytes=len(payload))
        transport.send_frame(sock, header, payload)


def _recv_loop(state: Run, sock: socket.socket, channel: int, channels: int) -> None:
    job = state.job
    head = bytearray(frames.HEADER_BYTES)
    staging = np.empty(0, job.array.dtype)
    wire = np.empty(0, np.uint8)
    for item in job.plan.recvs[channel::channels]:
        count = item.stop - item.start
        nbytes = quantize.encoded_nbytes(count, job.quantize) if job.quantize else count * job.array.itemsize
        header = transport.recv_header(sock, head)
        frames.check_expected(
            header,
            kind=frames.Kind.DATA,
            tag=job.tag,
            sequence=item.seq,
            nbytes=nbytes,
            dtype=quantize.wire_dtype(job.quantize) if job.quantize else job.dtype,
        )
        if job.quantize is not None:
            wire = _grow(wire, nbytes)
            staging = _grow(staging, count)
            _recv_quantized(state, sock, item, wire[:nbytes], staging[:count])
        elif item.reduce:
            staging = _grow(staging, count)
            transport.recv_exact(sock, _bytes(staging[:count]))
            _reduce(state, item, staging[:count])
        else:
            transport.recv_exact(sock, _bytes(job.array[item.start : item.stop]))
        state.mark(item.seq)


def _reduce(state: Run, item: schedule.Recv, values: np.ndarray) -> None:
    job = state.job
    job.reducer.combine(start=item.start, stop=item.stop, src=values, op=job.op)
    if item.final and job.op is ops.ReduceOp.AVG:
        job.reducer.divide(start=item.start, stop=item.stop, divisor=job.world)


def _recv_quantized(state: Run, sock: socket.socket, item: schedule.Recv, wire: np.ndarray, values: np.ndarray) -> None:
    job = state.job
    assert job.quantize is not None
    region = job.array[item.start : item.stop]
    if not item.reduce:  # all-gather: keep the bytes to forward them
        stored = np.empty(len(wire), np.uint8)
        transport.recv_exact(sock, _bytes(stored))
        state.stored[item.seg] = stored
        quantize.decode(stored, dtype=job.dtype, mode=job.quantize, out=region)
        return
    transport.recv_exact(sock, _bytes(wire))
    quantize.decode(wire, dtype=job.dtype, mode=job.quantize, out=values)
    _reduce(state, item, values)
    if item.final:  # the owner: encode once, decode the same bytes
        stored = np.empty(len(wire), np.uint8)
        quantize.encode(region, dtype=job.dtype, mode=job.quantize, out=stored)
        state.stored[item.seg] = stored
        quantize.decode(stored, dtype=job.dtype, mode=job.quantize, out=region)


def _stored(state: Run, seg: int) -> np.ndarray:
    data = state.stored[seg]
    if data is None:
        raise RuntimeError(f"segment {seg} has no stored bytes (schedule bug)")
    return data


def _grow(buf: np.ndarray, count: int) -> np.ndarray:
    return buf if len(buf) >= count else np.empty(count, buf.dtype)


def _bytes(array: np.ndarray) -> memoryview:
    """A byte view of a contiguous array, no copy."""
    return array.data.cast("B")
