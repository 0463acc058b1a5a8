"""Small messages: latency-bound collectives run on the calling thread, over the ring links.

What this module owns
- :func:`all_reduce`: below ``SMALL_BYTES`` a ring all-reduce's 2(N-1) steps, its segment
  pipeline and its I/O threads cost more than the bytes. Here each of N-1 steps forwards a
  whole buffer to the successor while receiving one from the predecessor (one loop, no
  thread), so after N-1 steps every rank holds every rank's buffer; each rank then reduces
  them in rank order 0, 1, ..., N-1, the same expression everywhere, so all ranks end
  bit-identical (also for MIN/MAX of signed zeros, where operand order matters).
- :func:`broadcast`: the root's buffer travels the ring once, each rank forwarding what it got.

Rules
- System calls are the cost here (each is also a chance for a busy machine to preempt us), so
  the links' descriptors are driven directly: they are non-blocking (``transport.configure``
  gives every ring socket a timeout, which CPython implements with ``O_NONBLOCK``), a frame
  goes out in one ``writev`` (header and payload, no copy) and comes in with ``readv`` into a
  scratch buffer of exactly the expected frame, so a step is usually one write and one read,
  plus one ``poll`` when the peer's frame has not arrived yet. Socket methods would ``poll``
  before every call.
- A frame is validated against the expectation (tag, step, dtype, byte count) before any of
  its payload is used; nothing reaches the caller's buffer before that (the scratch buffer
  holds at most one expected frame, so a bad header cannot make us read past it).
- Reductions run on the host (numpy); for a CUDA tensor the staged host buffer is the result
  (copied to the device by ``finish``), since at these sizes a kernel launch and two copies per
  step cost more than the reduction.
- Errors (``OSError``, ``TimeoutError`` after ``io_timeout`` without progress, ``FrameError``)
  propagate to the engine, which aborts the ring exactly as for the ring path.
"""

from __future__ import annotations

import os
import socket

import numpy as np

from ringseed.collective import ops, transport
from ringseed.protocol import frames

SMALL_BYTES = 128 << 10  # from bench/allreduce.py --small-bytes: the ring wins from 256 KiB at N = 2, 3


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
    fds = _descriptors(out, inp)
    # at step s this rank forwards rank (rank - s)'s buffer (its own first) and receives rank (rank - s - 1)'s
    by_rank: list[np.ndarray] = [array] * world
    by_rank[rank] = array.copy()
    sending = _bytes(by_rank[rank])
    for step in range(world - 1):
        head = _header(dtype=dtype, tag=tag, sequence=step, nbytes=array.nbytes)
        sending = _exchange(fds, send=[memoryview(head), sending], expect=head, nbytes=array.nbytes, io=io_timeout)
        by_rank[(rank - step - 1) % world] = np.frombuffer(sending, dtype=array.dtype)
    array[...] = by_rank[0]
    ops.combine_all(array, by_rank[1:], op=op, dtype=dtype)
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
    fds = _descriptors(out, inp)
    distance = (rank - root) % world
    head = _header(dtype=dtype, tag=tag, sequence=0, nbytes=array.nbytes)
    if distance > 0:
        _bytes(array)[:] = _exchange(fds, send=[], expect=head, nbytes=array.nbytes, io=io_timeout)
    if distance < world - 1:
        _exchange(fds, send=[memoryview(head), _bytes(array)], expect=None, nbytes=0, io=io_timeout)


def _descriptors(out: socket.socket, inp: socket.socket) -> tuple[int, int]:
    if out.gettimeout() is None or inp.gettimeout() is None:
        raise RuntimeError("ring links must be in timeout (non-blocking) mode; see transport.configure")
    return out.fileno(), inp.fileno()


def _header(*, dtype: frames.DType, tag: int, sequence: int, nbytes: int) -> bytes:
    return frames.encode_header(
        frames.Header(kind=frames.Kind.DATA, dtype=dtype, tag=tag, sequence=sequence, nbytes=nbytes)
    )


def _exchange(
    fds: tuple[int, int], *, send: list[memoryview], expect: bytes | None, nbytes: int, io: float
) -> memoryview:
    """Write ``send`` (a header and its payload) to the successor while reading one frame whose header
    must be ``expect`` and whose payload is ``nbytes`` from the predecessor; returns that payload."""
    out_fd, in_fd = fds
    frame = memoryview(bytearray(frames.HEADER_BYTES + nbytes if expect is not None else 0))
    got, checked = 0, expect is None
    while send or got < len(frame):
        progressed = False
        if send:
            try:
                send = transport.advance(send, os.writev(out_fd, send))
                progressed = True
            except BlockingIOError:
                pass
        if got < len(frame):
            try:
                n = os.readv(in_fd, [frame[got:]])
            except BlockingIOError:
                n = -1
            if n == 0:
                raise ConnectionError(f"peer closed the connection after {got} bytes of a {len(frame)}-byte frame")
            if n > 0:
                got += n
                progressed = True
            if not checked and got >= frames.HEADER_BYTES:
                assert expect is not None
                transport.check_header(frame[: frames.HEADER_BYTES], expect)
                checked = True
        if not progressed and not transport.wait(
            read=[in_fd] if got < len(frame) else [], write=[out_fd] if send else [], timeout=io
        ):
            raise TimeoutError(f"no progress for {io} s")
    return frame[frames.HEADER_BYTES :]


def _bytes(array: np.ndarray) -> memoryview:
    return array.data.cast("B")
