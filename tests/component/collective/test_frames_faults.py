"""Faults on the wire: malformed frames, wrong token, stale epoch, a stalled or dying peer, abort().

A real engine (rank 0) faces a scripted fake neighbour built from the transport's own listener and
dialer; the fake sends whatever the fault calls for. Each fault must end the op with
CollectiveAborted naming the problem, leave the array untouched (nothing of a bad frame is ever
written into it), and leave the engine usable after set_ring with a new epoch.
"""

from __future__ import annotations

import enum
import socket
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from ringseed.collective import engine, listener, small, transport
from ringseed.protocol import frames
from tests.component.collective import _engine_ring

TOKEN = _engine_ring.TOKEN
LENGTH = 1 << 16  # float32, above small.SMALL_BYTES (the ring path); two peers: rank 0 first receives [0, LENGTH // 2)
SMALL_LENGTH = 256  # float32, the small-message path: one whole-buffer frame per step


class Fault(enum.Enum):
    BAD_MAGIC = "bad magic"
    BAD_VERSION = "unsupported version"
    OVERSIZE = "over the limit"
    WRONG_TAG = "op tag mismatch"
    WRONG_DTYPE = "dtype mismatch"
    WRONG_LENGTH = "byte count mismatch"
    TRUNCATED = "closed the connection"
    STALL_MID_FRAME = "stalled"


def first_frame_bytes(length: int) -> int:
    """What rank 0 of two first receives: half the buffer on the ring path, all of it on the small path."""
    return length * 4 if length * 4 <= small.SMALL_BYTES else length // 2 * 4


def bad_frame(fault: Fault, *, tag: int, length: int = LENGTH, sequence: int = 0) -> bytes:
    good = frames.Header(
        kind=frames.Kind.DATA, dtype=frames.DType.F32, tag=tag, sequence=sequence, nbytes=first_frame_bytes(length)
    )
    head = frames.encode_header(good)
    if fault is Fault.BAD_MAGIC:
        return b"EVIL" + head[4:]
    if fault is Fault.BAD_VERSION:
        return head[:4] + bytes([99]) + head[5:]
    if fault is Fault.OVERSIZE:
        return head[:-8] + struct.pack("<Q", 1 << 40)
    if fault is Fault.WRONG_TAG:
        return frames.encode_header(
            frames.Header(kind=good.kind, dtype=good.dtype, tag=tag + 1, sequence=sequence, nbytes=good.nbytes)
        )
    if fault is Fault.WRONG_DTYPE:
        return frames.encode_header(
            frames.Header(kind=good.kind, dtype=frames.DType.I32, tag=tag, sequence=sequence, nbytes=good.nbytes)
        )
    if fault is Fault.WRONG_LENGTH:
        return frames.encode_header(
            frames.Header(kind=good.kind, dtype=good.dtype, tag=tag, sequence=sequence, nbytes=16)
        )
    return head + b"\x01" * 100  # TRUNCATED / STALL_MID_FRAME: a header and part of the payload


class FakePeer:
    """The ring neighbour of a real engine, scripted by the test."""

    def __init__(self) -> None:
        self.accepted: list[socket.socket] = []
        self.listener = listener.Listener(host="127.0.0.1", port=0, token=TOKEN, io_timeout=5, on_link=self._keep)
        self.listener.start()
        self.address = engine.PeerAddress(peer_id="fake", host="127.0.0.1", port=self.listener.port)
        self.out: socket.socket | None = None

    def _keep(self, hello: frames.Hello, sock: socket.socket) -> None:
        self.accepted.append(sock)

    def dial(self, real: engine.PeerAddress, *, epoch: int) -> socket.socket:
        self.out = transport.dial(
            host=real.host,
            port=real.port,
            token=TOKEN,
            peer_id="fake",
            epoch=epoch,
            purpose=frames.Purpose.RING,
            channel=0,
            io_timeout=5,
        )
        return self.out

    def close(self) -> None:
        for s in [*self.accepted, *([self.out] if self.out else [])]:
            s.close()
        self.listener.close()


@pytest.fixture
def pair() -> Iterator[tuple[engine.RingEngine, FakePeer]]:
    real = engine.RingEngine(peer_id="real", token=TOKEN, io_timeout=1.5)
    fake = FakePeer()
    try:
        address = real.start()
        fake.dial(address, epoch=1)
        real.set_ring([address, fake.address], epoch=1, timeout=10)
        yield real, fake
    finally:
        real.close()
        fake.close()


@pytest.mark.parametrize("length", [LENGTH, SMALL_LENGTH], ids=["ring", "small"])
@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.name)
def test_malformed_or_stalled_frame_aborts_cleanly(
    pair: tuple[engine.RingEngine, FakePeer], fault: Fault, length: int
) -> None:
    real, fake = pair
    original = np.arange(length, dtype=np.float32)
    array = original.copy()
    future = real.all_reduce_async(array, op=engine.ReduceOp.SUM, tag=5)
    assert fake.out is not None
    fake.out.sendall(bad_frame(fault, tag=5, length=length))
    if fault is Fault.TRUNCATED:
        fake.out.close()
        fake.out = None
    start = time.monotonic()
    with pytest.raises(engine.CollectiveAborted, match=fault.value):
        future.result(timeout=30)
    assert time.monotonic() - start < 15, "the abort took far longer than the 1.5 s I/O timeout"
    np.testing.assert_array_equal(array, original)  # nothing of the bad frame was written
    with pytest.raises(engine.CollectiveAborted):  # the engine stays aborted until set_ring
        real.all_reduce(array, op=engine.ReduceOp.SUM, tag=6)
    recovered_ring_works(real)


BEHIND = [Fault.WRONG_TAG, Fault.WRONG_DTYPE, Fault.WRONG_LENGTH, Fault.BAD_MAGIC]


@pytest.mark.parametrize("fault", BEHIND, ids=lambda f: f.name)
def test_a_bad_header_behind_a_good_frame_is_checked_before_its_payload_lands(
    pair: tuple[engine.RingEngine, FakePeer], fault: Fault
) -> None:
    """The ring reads the next frame's header behind the current payload: a good reduce-scatter
    frame followed in the same write by a bad all-gather header and its payload ends the op naming
    the fault, and none of that payload reaches the array (the chunk it would fill is as it was)."""
    real, fake = pair
    half = LENGTH // 2
    original = np.arange(LENGTH, dtype=np.float32)
    array = original.copy()
    future = real.all_reduce_async(array, op=engine.ReduceOp.SUM, tag=5)
    first = frames.Header(kind=frames.Kind.DATA, dtype=frames.DType.F32, tag=5, sequence=0, nbytes=half * 4)
    second = bad_frame(fault, tag=5, sequence=1)  # the all-gather frame, with the fault
    assert fake.out is not None
    fake.out.sendall(frames.encode_header(first) + np.ones(half, np.float32).tobytes() + second[: frames.HEADER_BYTES])
    fake.out.sendall(np.full(half, 7.0, np.float32).tobytes())
    with pytest.raises(engine.CollectiveAborted, match=fault.value):
        future.result(timeout=30)
    np.testing.assert_array_equal(array[half:], original[half:])  # the all-gather chunk: nothing landed
    recovered_ring_works(real)


def recovered_ring_works(real: engine.RingEngine) -> None:
    """After a fault the same engine joins a fresh ring (new epoch) and computes correctly."""
    other = engine.RingEngine(peer_id="other", token=TOKEN, io_timeout=10)
    try:
        ring = [real.address, other.start()]
        _engine_ring.each([real, other], lambda e: e.set_ring(ring, epoch=2, timeout=10))
        arrays = [np.full(LENGTH, 1.5, np.float32), np.full(LENGTH, 2.0, np.float32)]
        _engine_ring.each([real, other], lambda e: e.all_reduce(arrays[e.rank], op=engine.ReduceOp.SUM, tag=9))
        for a in arrays:
            np.testing.assert_array_equal(a, np.full(LENGTH, 3.5, np.float32))
    finally:
        other.close()


def test_wrong_token_is_refused_and_the_listener_keeps_serving() -> None:
    real = engine.RingEngine(peer_id="real", token=TOKEN, io_timeout=5)
    try:
        address = real.start()
        with pytest.raises(frames.FrameError, match="wrong group token"):
            transport.dial(
                host=address.host,
                port=address.port,
                token="not-the-token",
                peer_id="intruder",
                epoch=1,
                purpose=frames.Purpose.RING,
                channel=0,
                io_timeout=5,
            )
        assert real.rejected_connections == 1
        impostor = engine.RingEngine(peer_id="impostor", token="not-the-token", io_timeout=5)
        try:
            ring = [address, impostor.start()]
            results = _engine_ring.outcomes([real, impostor], lambda e: e.set_ring(ring, epoch=1, timeout=3))
            assert all(isinstance(r, engine.CollectiveAborted) for r in results), results
        finally:
            impostor.close()
        recovered_ring_works(real)
    finally:
        real.close()


def test_stale_epoch_is_refused() -> None:
    with _engine_ring.ring(2, epoch=5) as peers:
        target = peers[0].address
        with pytest.raises(frames.FrameError, match="stale epoch 4"):
            transport.dial(
                host=target.host,
                port=target.port,
                token=TOKEN,
                peer_id="p1",
                epoch=4,
                purpose=frames.Purpose.RING,
                channel=0,
                io_timeout=5,
            )


def test_abort_from_another_thread_ends_the_op_fast_and_set_ring_clears_it() -> None:
    with _engine_ring.ring(2, io_timeout=60) as peers:
        array = np.ones(LENGTH, np.float32)
        future = peers[0].all_reduce_async(array, op=engine.ReduceOp.SUM, tag=1)  # the peer never joins
        _engine_ring.wait_started(future)
        start = time.monotonic()
        threading.Thread(target=peers[0].abort, args=("vote lost",)).start()
        with pytest.raises(engine.CollectiveAborted, match="vote lost"):
            future.result(timeout=30)
        assert time.monotonic() - start < 5
        ring = [p.address for p in peers]
        _engine_ring.each(peers, lambda e: e.set_ring(ring, epoch=2, timeout=10))
        arrays = [np.ones(LENGTH, np.float32), np.ones(LENGTH, np.float32)]
        _engine_ring.each(peers, lambda e: e.all_reduce(arrays[e.rank], op=engine.ReduceOp.SUM, tag=2))
        np.testing.assert_array_equal(arrays[1], np.full(LENGTH, 2, np.float32))


def test_peer_that_dies_mid_op_aborts_the_survivor() -> None:
    with _engine_ring.ring(3, io_timeout=60) as peers:
        arrays = [np.ones(4 << 20, np.float32) for _ in peers]
        futures = [e.all_reduce_async(arrays[e.rank], op=engine.ReduceOp.SUM, tag=1) for e in peers[:2]]
        _engine_ring.wait_started(*futures)
        peers[2].close()  # p2 never took part and now goes away
        for f in futures:
            with pytest.raises(engine.CollectiveAborted):
                f.result(timeout=30)
