"""Small messages: latency-bound collectives run on the calling thread, over the ring links.

What this module owns
- :func:`all_reduce`: below ``SMALL_BYTES`` a ring all-reduce's 2(N-1) steps, its segment
  pipeline and its I/O threads cost more than the bytes. Here each of N-1 steps forwards a
  whole buffer to the successor while receiving one from the predecessor (one ``select`` loop,
  no thread), so after N-1 steps every rank holds every rank's buffer; each rank then reduces
  them in rank order 0, 1, ..., N-1, the same expression everywhere, so all ranks end
  bit-identical (also for MIN/MAX of signed zeros, where operand order matters).
- :func:`broadcast`: the root's buffer travels the ring once, each rank forwarding what it got.

Rules
- Frames are validated against the expectation (tag, step, dtype, byte count) before their
  payload is read, exactly as on the ring path.
- Reductions run on the host (numpy); for a CUDA tensor the staged host buffer is the result
  (copied to the device by ``finish``), since at these sizes a kernel launch and two copies per
  step cost more than the reduction.
- Errors (``OSError``, ``TimeoutError`` after ``io_timeout`` without progress, ``FrameError``)
  propagate to the engine, which aborts the ring exactly as for the ring path.
"""

from __future__ import annotations

import select
import socket

import numpy as np

from ringseed.collective import ops
from ringseed.protocol import frames

SMALL_BYTES = 64 << 10  # chosen from bench/allreduce.py's size sweep (see BENCHMARKS.md)


def all_reduce(
    array: np.ndarray,
    *,
    out: socket.socket,
    inp: socket.socket,
    rank: int,
    world: int,
    op: ops.ReduceOp,
    dtype: frames.DType,
    tag: int,
    io_timeout: float,
) -> None:
    """In place; ``array`` is 1-D contiguous storage of ``dtype``."""
    buffers: list[np.ndarray | None] = [None] * world
    buffers[rank] = array.copy()
    for step in range(world - 1):
        outgoing = buffers[(rank - step) % world]
        incoming = np.empty_like(array)
        assert outgoing is not None
        _exchange(
            out=out,
            inp=inp,
            send=_frame(outgoing, dtype=dtype, tag=tag, step=step),
            recv=_bytes(incoming),
            expect=dict(tag=tag, sequence=step, dtype=dtype, nbytes=array.nbytes),
            io_timeout=io_timeout,
        )
        buffers[(rank - step - 1) % world] = incoming
    first = buffers[0]
    assert first is not None
    array[...] = first
    for other in buffers[1:]:
        assert other is not None
        ops.combine(array, other, op=op, dtype=dtype)
    if op is ops.ReduceOp.AVG:
        ops.divide(array, divisor=world, dtype=dtype)


def broadcast(
    array: np.ndarray,
    *,
    out: socket.socket,
    inp: socket.socket,
    rank: int,
    world: int,
    root: int,
    dtype: frames.DType,
    tag: int,
    io_timeout: float,
) -> None:
    distance = (rank - root) % world
    if distance > 0:
        _exchange(
            out=out,
            inp=inp,
            send=b"",
            recv=_bytes(array),
            expect=dict(tag=tag, sequence=0, dtype=dtype, nbytes=array.nbytes),
            io_timeout=io_timeout,
        )
    if distance < world - 1:
        _exchange(
            out=out,
            inp=inp,
            send=_frame(array, dtype=dtype, tag=tag, step=0),
            recv=memoryview(b""),
            expect=None,
            io_timeout=io_timeout,
        )


def _frame(array: np.ndarray, *, dtype: frames.DType, tag: int, step: int) -> bytes:
    header = frames.Header(kind=frames.Kind.DATA, dtype=dtype, tag=tag, sequence=step, nbytes=array.nbytes)
    return frames.encode_header(header) + array.tobytes()


def _exchange(
    *,
    out: socket.socket,
    inp: socket.socket,
    send: bytes,
    recv: memoryview,
    expect: dict[str, object] | None,
    io_timeout: float,
) -> None:
    """Send ``send`` on ``out`` while receiving one frame into ``recv`` from ``inp``, one thread."""
    head = bytearray(frames.HEADER_BYTES)
    sent, got, total = 0, 0, (frames.HEADER_BYTES + len(recv)) if expect is not None else 0
    while sent < len(send) or got < total:
        readable, writable, _ = select.select(
            [inp] if got < total else [], [out] if sent < len(send) else [], [], io_timeout
        )
        if not readable and not writable:
            raise TimeoutError(f"no progress for {io_timeout} s")
        if writable:
            sent += out.send(send[sent:])
        if readable:
            got += _receive(inp, head, recv, got, expect)


def _receive(inp: socket.socket, head: bytearray, recv: memoryview, got: int, expect: dict[str, object] | None) -> int:
    if got < frames.HEADER_BYTES:
        n = inp.recv_into(memoryview(head)[got:])
        if n == 0:
            raise ConnectionError(f"peer closed the connection after {got} header bytes")
        if got + n == frames.HEADER_BYTES:
            assert expect is not None
            frames.check_expected(frames.decode_header(head), kind=frames.Kind.DATA, **expect)  # type: ignore[arg-type]
        return n
    n = inp.recv_into(recv[got - frames.HEADER_BYTES :])
    if n == 0:
        raise ConnectionError(f"peer closed the connection after {got - frames.HEADER_BYTES} of {len(recv)} bytes")
    return n


def _bytes(array: np.ndarray) -> memoryview:
    return array.data.cast("B")
