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
- Any error (``FrameError``, timeout, EOF, socket error) calls ``fail(reason)`` once, which
  must wake every socket of the op (the engine shuts the links down); the other loops then
  stop, and :func:`run` raises :class:`Failed` with the first reason. The array may be partly
  modified; restoring it is the caller's job.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
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


class _State:
    def __init__(self, job: Job, fail: Callable[[str], None]) -> None:
        self.job = job
        self.cond = threading.Condition()
        self.done = bytearray(len(job.plan.recvs))
        self.failed = False
        self._fail = fail
        self.stored: list[np.ndarray | None] = [None] * job.plan.segments

    def mark(self, index: int) -> None:
        with self.cond:
            self.done[index] = 1
            self.cond.notify_all()

    def wait_for(self, index: int) -> None:
        with self.cond:
            while not self.done[index]:
                if self.failed:
                    raise Failed("aborted while waiting for a segment")
                self.cond.wait(0.5)

    def fail(self, reason: str) -> None:
        with self.cond:
            first = not self.failed
            self.failed = True
            self.cond.notify_all()
        if first:
            self._fail(reason)


def run(
    job: Job,
    *,
    outs: Sequence[socket.socket],
    ins: Sequence[socket.socket],
    pool: concurrent.futures.ThreadPoolExecutor,
    fail: Callable[[str], None],
) -> None:
    """Run ``job`` to completion or raise Failed (after ``fail`` woke everything)."""
    state = _State(job, fail)
    futures = [pool.submit(_guard, state, _send_loop, state, outs[i], i, len(outs)) for i in range(len(outs))]
    futures += [pool.submit(_guard, state, _recv_loop, state, ins[i], i, len(ins)) for i in range(len(ins))]
    errors = [f.result() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None or state.failed:
        raise Failed(first or "aborted")


def _guard(state: _State, loop: Callable[..., None], *args: object) -> str | None:
    try:
        loop(*args)
    except Failed as exc:
        return str(exc)
    except frames.FrameError as exc:
        return _report(state, f"malformed or unexpected frame: {exc}")
    except TimeoutError:
        return _report(state, f"peer stalled: no data for the I/O timeout (tag {state.job.tag})")
    except OSError as exc:
        return _report(state, f"connection failed: {exc}")
    return None


def _report(state: _State, reason: str) -> str:
    if state.failed:
        return "aborted"  # a consequence of an earlier failure, not a cause
    state.fail(reason)
    return reason


def _send_loop(state: _State, sock: socket.socket, channel: int, channels: int) -> None:
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


def _recv_loop(state: _State, sock: socket.socket, channel: int, channels: int) -> None:
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


def _reduce(state: _State, item: schedule.Recv, values: np.ndarray) -> None:
    job = state.job
    job.reducer.combine(start=item.start, stop=item.stop, src=values, op=job.op)
    if item.final and job.op is ops.ReduceOp.AVG:
        job.reducer.divide(start=item.start, stop=item.stop, divisor=job.world)


def _recv_quantized(
    state: _State, sock: socket.socket, item: schedule.Recv, wire: np.ndarray, values: np.ndarray
) -> None:
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


def _stored(state: _State, seg: int) -> np.ndarray:
    data = state.stored[seg]
    if data is None:
        raise Failed(f"segment {seg} has no stored bytes (schedule bug)")
    return data


def _grow(buf: np.ndarray, count: int) -> np.ndarray:
    return buf if len(buf) >= count else np.empty(count, buf.dtype)


def _bytes(array: np.ndarray) -> memoryview:
    """A byte view of a contiguous array, no copy."""
    return array.data.cast("B")
