"""The ring engine: one peer's data plane for all-reduce, broadcast, all-gather and reduce-scatter.

What this module owns
- A listener for ring and probe connections, and ``connections_per_peer`` outgoing TCP
  connections to the ring successor plus as many incoming from the predecessor, all proven
  by the group token and stamped with the ring ``epoch`` (see ``protocol/frames.py``).
- An op queue (``sequencer.py``): collectives run one at a time, in the order they were
  submitted, on a dedicated thread; ``*_async`` methods return a ``concurrent.futures.Future``
  so several operations can be in flight. The blocking methods, and ``*_async(run_here=True)``
  for a caller that waits at once, run the operation on the caller's thread instead, without
  waking the engine's thread (no hand-off on a small message's critical path). Every frame
  carries the op's ``tag``, so peers that submit operations in a different order fail loudly
  instead of mixing data.

Numerics (see ``ops.py``): every peer ends bit-identical; integer SUM/PROD wrap; AVG is for
floating dtypes; quantised transfer (``"int8"``, ``"fp16"``, ``"bf16"``) only for floating dtypes.

Fault-tolerance contract
- A neighbour that dies, closes, stalls longer than ``io_timeout`` (mid-frame or between
  frames), sends a malformed or unexpected frame, any exception inside the operation (a
  reducer or quantizer raising, a CUDA error, a copy failing), or an ``abort(reason)`` from any
  thread: the in-flight operation raises :class:`CollectiveAborted` with the reason (chained to
  the original exception), every ring link is shut down, so the neighbours' operations fail
  at once with EOF rather than at their I/O timeout, and all queued operations fail the same
  way. The caller's array may be partly modified; the caller restores it (``Communicator`` does) and then calls
  :meth:`RingEngine.set_ring` with a new epoch, which reconnects and clears the abort.
- Connections carrying an older epoch than the engine's are refused at the handshake, so a
  straggler from a previous ring can never feed frames into a new one.
- :meth:`RingEngine.set_ring` waits for its neighbours at most ``timeout``, but an ``abort``
  during the wait ends it at once (CollectiveAborted), and so does a refused connection to the
  successor: its listener is bound before it joins and open until it closes, so a refusal means
  the peer is gone.
- :meth:`RingEngine.close` never blocks on an operation: it aborts it and waits at most
  ``CLOSE_WAIT`` for it to unwind (and for the direct links' reader threads to end). An engine
  still open when the interpreter exits is closed by an ``atexit`` hook, before the interpreter
  finalizes: the engine's threads are daemons, and one that is still completing an operation
  (its callbacks: torch's ``Future.set_result``, a copy-back) inside C++ that released the GIL
  would be killed when it takes the GIL back, which aborts the process ("terminate called
  without an active exception"). An operation starts no thread: it runs on the engine's op
  thread (started in :meth:`start`) or the caller's, which drives the ring's links itself
  (``runner.py``), so a process at its pids limit can still run collectives.
- This engine gives no fault tolerance by itself (no retry, no membership): that is the
  control part's job (``communicator.py``).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ringseed.collective import listener, mesh, ops, quantize, runner, schedule, sequencer, small, transport
from ringseed.protocol import frames

log = logging.getLogger(__name__)
ReduceOp = ops.ReduceOp
CLOSE_WAIT = 5.0  # seconds close() waits for an aborted operation to unwind
_OPEN: weakref.WeakSet[RingEngine] = weakref.WeakSet()  # started and not closed: closed at exit


class CollectiveAborted(Exception):
    """The operation was aborted; the array may be partly modified and must be restored by the caller."""


@dataclasses.dataclass(frozen=True)
class PeerAddress:
    peer_id: str
    host: str
    port: int


class RingEngine:
    """One peer of a ring; thread-safe; blocking methods wrap the ``*_async`` ones."""

    def __init__(
        self,
        *,
        peer_id: str,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        connections_per_peer: int = 1,
        io_timeout: float = 30.0,
    ) -> None:
        if connections_per_peer < 1:
            raise ValueError("connections_per_peer must be at least 1")
        self.peer_id = peer_id
        self._token = token
        self._host, self._port = host, port
        self._channels = connections_per_peer
        self._io_timeout = io_timeout
        self._lock = threading.Condition()
        self._epoch = -1
        self._incoming: dict[tuple[str, int, frames.Purpose, int], socket.socket] = {}
        self._outs: list[socket.socket] = []
        self._ins: list[socket.socket] = []
        self._ring: tuple[PeerAddress, ...] = ()
        self._rank = 0
        self._abort: str | None = None
        self._listener: listener.Listener | None = None
        self._running: runner.Run | None = None
        self._inflight: set[concurrent.futures.Future[None]] = set()
        self._mesh: mesh.Mesh | None = None
        self._ops: sequencer.Sequencer | None = None

    # ----- lifecycle -------------------------------------------------------------------------

    def start(self) -> PeerAddress:
        """Bind and accept in the background; returns the address other peers dial."""
        self._listener = listener.Listener(
            host=self._host, port=self._port, token=self._token, io_timeout=self._io_timeout, on_link=self._on_link
        )
        try:
            self._listener.start()
            self._ops = sequencer.Sequencer(name=f"ringseed-op-{self.peer_id}")  # never started mid-operation
        except BaseException:
            self._listener.close()
            raise
        _OPEN.add(self)
        return self.address

    @property
    def address(self) -> PeerAddress:
        """The address given by :meth:`start` (raises before it)."""
        if self._listener is None:
            raise RuntimeError("start() the engine first")
        return PeerAddress(peer_id=self.peer_id, host=self._host, port=self._listener.port)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return max(1, len(self._ring))

    @property
    def rejected_connections(self) -> int:
        return self._listener.rejected if self._listener else 0

    def set_ring(self, ring: Sequence[PeerAddress], *, epoch: int, timeout: float = 30.0) -> None:
        """Adopt ``ring`` (rank order) under ``epoch``: reconnect both neighbours, clear a previous abort."""
        ids = [p.peer_id for p in ring]
        if self.peer_id not in ids or len(set(ids)) != len(ids):
            raise ValueError(f"ring must list {self.peer_id!r} once and have unique peer ids, got {ids}")
        with self._lock:
            if epoch <= self._epoch:
                raise ValueError(f"epoch {epoch} is not newer than the current epoch {self._epoch}")
            self._epoch = epoch
            self._drop_links()
            self._incoming = {k: s for k, s in self._incoming.items() if k[1] >= epoch or _close(s)}
            self._ring, self._rank, self._abort = tuple(ring), ids.index(self.peer_id), None
        if len(ring) > 1:
            self._connect(timeout=timeout)

    def abort(self, reason: str) -> None:
        """Thread-safe: the in-flight and queued operations raise CollectiveAborted(reason) promptly."""
        self._stop(reason, quiet=False)

    def _stop(self, reason: str, *, quiet: bool) -> None:
        with self._lock:
            if self._abort is None:
                self._abort = reason
                if not quiet:
                    log.warning("Aborted collective on %s: %s", self.peer_id, reason)
            for sock in self._outs + self._ins:
                transport.wake(sock)
            running, direct = self._running, self._mesh
            self._lock.notify_all()
        if running is not None:
            running.cancel(reason)
        if direct is not None:
            direct.abort(reason)

    def close(self) -> None:
        """Abort what is in flight, stop listening and drop every link; returns within about
        ``CLOSE_WAIT`` even if an operation is stuck in code that never returns (a hung reducer)."""
        _OPEN.discard(self)
        self._stop("engine closed", quiet=True)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            inflight = list(self._inflight)
        deadline = time.monotonic() + CLOSE_WAIT
        if self._ops is not None:
            self._ops.shutdown()
        _, stuck = concurrent.futures.wait(inflight, timeout=CLOSE_WAIT)
        # an operation run inline (all_reduce_here) has no future: wait for the sequencer instead
        unwound = self._ops is None or self._ops.wait_idle(max(0.0, deadline - time.monotonic()))
        if stuck or not unwound:
            log.warning("Closed %s with an operation still running (stuck in a reducer?)", self.peer_id)
        with self._lock:
            self._drop_links()
            for sock in self._incoming.values():
                sock.close()
            self._incoming.clear()
            direct = self._mesh
            if direct is not None:
                direct.close()
        if direct is not None:  # its readers may be completing a receive (callbacks): let them end
            direct.join(max(0.0, deadline - time.monotonic()))

    # ----- collectives -----------------------------------------------------------------------

    def all_reduce(
        self,
        array: np.ndarray,
        *,
        op: ops.ReduceOp,
        tag: int,
        quantize: str | None = None,
        bfloat16: bool = False,
        reducer: runner.Reducer | None = None,
    ) -> None:
        """In place on a 1-D C-contiguous array; every peer ends bit-identical."""
        if quantize is None and self.all_reduce_here(array, op=op, tag=tag, bfloat16=bfloat16, reducer=reducer):
            return
        self.all_reduce_async(
            array, op=op, tag=tag, quantize=quantize, bfloat16=bfloat16, reducer=reducer, run_here=True
        ).result()

    def all_reduce_here(
        self,
        array: np.ndarray,
        *,
        op: ops.ReduceOp,
        tag: int,
        bfloat16: bool = False,
        reducer: runner.Reducer | None = None,
    ) -> bool:
        """An all-reduce for a caller that waits: when nothing is queued or running, it runs now on
        this thread (no future, no hand-off) and True is returned; otherwise False and nothing was
        done (use the other methods). Raises like :meth:`all_reduce`. At most ``small.SMALL_BYTES``
        the reduction runs on the host (numpy) whatever the caller's reducer."""
        if self._ops is None:
            return False
        return self._ops.run_inline(self._all_reduce_op(array, op=op, tag=tag, bfloat16=bfloat16, reducer=reducer))

    def all_reduce_async(
        self,
        array: np.ndarray,
        *,
        op: ops.ReduceOp,
        tag: int,
        quantize: str | None = None,
        bfloat16: bool = False,
        reducer: runner.Reducer | None = None,
        run_here: bool = False,
    ) -> concurrent.futures.Future[None]:
        """``run_here``: the caller waits at once, so the operation runs on its thread now
        (after whatever is queued ahead of it), with no hand-off to the engine's thread."""
        execute = self._all_reduce_op(array, op=op, tag=tag, quantize=quantize, bfloat16=bfloat16, reducer=reducer)
        return self._enqueue(execute, run_here=run_here)

    def _all_reduce_op(
        self,
        array: np.ndarray,
        *,
        op: ops.ReduceOp,
        tag: int,
        quantize: str | None = None,
        bfloat16: bool = False,
        reducer: runner.Reducer | None = None,
    ) -> Callable[[], None]:
        dtype = _check_array(array, bfloat16=bfloat16)
        ops.check_op(op, dtype)
        if quantize is not None:
            _check_quantize(quantize, dtype)

        def plan(rank: int, world: int) -> schedule.Plan:
            seg = schedule.segment_elems(length=len(array), world=world, itemsize=array.itemsize)
            return schedule.all_reduce(length=len(array), rank=rank, world=world, seg_elems=seg)

        def inline(out: socket.socket, inp: socket.socket, rank: int, world: int) -> None:
            small.all_reduce(
                array,
                out=out,
                inp=inp,
                rank=rank,
                world=world,
                op=op,
                dtype=dtype,
                tag=tag,
                io_timeout=self._io_timeout,
            )

        return self._operation(
            plan,
            array=array,
            dtype=dtype,
            op=op,
            tag=tag,
            quantize=quantize,
            reducer=reducer,
            inline=inline if quantize is None else None,
        )

    def reduce_scatter(
        self, array: np.ndarray, out: np.ndarray, *, op: ops.ReduceOp, tag: int, bfloat16: bool = False
    ) -> None:
        self.reduce_scatter_async(array, out, op=op, tag=tag, bfloat16=bfloat16, run_here=True).result()

    def reduce_scatter_async(
        self,
        array: np.ndarray,
        out: np.ndarray,
        *,
        op: ops.ReduceOp,
        tag: int,
        bfloat16: bool = False,
        run_here: bool = False,
    ) -> concurrent.futures.Future[None]:
        """``array`` (world * n elements) is reduced and block ``rank`` lands in ``out`` (n elements).

        ``array`` is scratch space: it is left partly reduced."""
        dtype = _check_array(array, bfloat16=bfloat16)
        ops.check_op(op, dtype)
        if len(array) != len(out) * self.world_size:
            raise ValueError(f"reduce_scatter needs len(array) == world * len(out), got {len(array)}, {len(out)}")
        block = len(out)

        def plan(rank: int, world: int) -> schedule.Plan:
            seg = schedule.segment_elems(length=len(array), world=world, itemsize=array.itemsize)
            return schedule.reduce_scatter(length=len(array), rank=rank, world=world, seg_elems=seg)

        def copy_out(rank: int) -> None:
            out[...] = array[rank * block : (rank + 1) * block]

        return self._enqueue(
            self._operation(
                plan,
                array=array,
                dtype=dtype,
                op=op,
                tag=tag,
                after=copy_out,
            ),
            run_here=run_here,
        )

    def broadcast(self, array: np.ndarray, *, root: int, tag: int, bfloat16: bool = False) -> None:
        self.broadcast_async(array, root=root, tag=tag, bfloat16=bfloat16, run_here=True).result()

    def broadcast_async(
        self, array: np.ndarray, *, root: int, tag: int, bfloat16: bool = False, run_here: bool = False
    ) -> concurrent.futures.Future[None]:
        dtype = _check_array(array, bfloat16=bfloat16)
        if not 0 <= root < self.world_size:
            raise ValueError(f"root {root} is outside the ring of {self.world_size}")

        def plan(rank: int, world: int) -> schedule.Plan:
            seg = schedule.segment_elems(length=len(array), world=1, itemsize=array.itemsize)
            return schedule.broadcast(length=len(array), rank=rank, world=world, root=root, seg_elems=seg)

        def inline(out: socket.socket, inp: socket.socket, rank: int, world: int) -> None:
            small.broadcast(
                array,
                out=out,
                inp=inp,
                rank=rank,
                world=world,
                root=root,
                dtype=dtype,
                tag=tag,
                io_timeout=self._io_timeout,
            )

        return self._enqueue(
            self._operation(
                plan,
                array=array,
                dtype=dtype,
                tag=tag,
                inline=inline,
            ),
            run_here=run_here,
        )

    def all_gather(self, array: np.ndarray, out: np.ndarray, *, tag: int, bfloat16: bool = False) -> None:
        self.all_gather_async(array, out, tag=tag, bfloat16=bfloat16, run_here=True).result()

    def all_gather_async(
        self, array: np.ndarray, out: np.ndarray, *, tag: int, bfloat16: bool = False, run_here: bool = False
    ) -> concurrent.futures.Future[None]:
        """``out`` (world * len(array), same dtype) receives every rank's ``array`` in rank order."""
        dtype = _check_array(array, bfloat16=bfloat16)
        if _check_array(out, bfloat16=bfloat16) is not dtype or len(out) != len(array) * self.world_size:
            raise ValueError(f"all_gather needs out of {len(array) * self.world_size} elements of {array.dtype}")
        block = len(array)

        def plan(rank: int, world: int) -> schedule.Plan:
            out[rank * block : (rank + 1) * block] = array
            seg = schedule.segment_elems(length=block, world=1, itemsize=array.itemsize)
            return schedule.all_gather(block=block, rank=rank, world=world, seg_elems=seg)

        return self._enqueue(
            self._operation(
                plan,
                array=out,
                dtype=dtype,
                tag=tag,
            ),
            run_here=run_here,
        )

    def barrier(self, *, tag: int) -> None:
        """Returns once every peer has entered the barrier (a one-element all-reduce)."""
        self.all_reduce(np.zeros(1, np.int32), op=ops.ReduceOp.SUM, tag=tag)

    def measure_bandwidth(self, targets: Sequence[PeerAddress], *, nbytes: int = 8 << 20) -> dict[str, float]:
        """peer_id -> bytes/s, by sending ``nbytes`` to each target's listener; failures are left out."""
        result: dict[str, float] = {}
        for target in targets:
            try:
                sock = transport.dial(
                    host=target.host,
                    port=target.port,
                    token=self._token,
                    peer_id=self.peer_id,
                    epoch=0,
                    purpose=frames.Purpose.PROBE,
                    channel=0,
                    io_timeout=self._io_timeout,
                )
                with sock:
                    result[target.peer_id] = transport.probe(sock=sock, nbytes=min(nbytes, frames.MAX_FRAME_BYTES))
            except (OSError, frames.FrameError) as exc:
                log.warning("Could not measure bandwidth to %s: %s", target.peer_id, exc)
        return result

    def submit(self, fn: Callable[[], None], *, tag: int, run_here: bool = False) -> concurrent.futures.Future[None]:
        """Queue ``fn`` among the collectives (in order, one at a time, e.g. an operation on the
        mesh); any exception in it aborts the engine like a failed collective does."""

        def execute() -> None:
            with self._lock:
                if self._abort is not None:
                    raise CollectiveAborted(self._abort)
            self._guarded(fn, tag=tag)

        return self._enqueue(execute, run_here=run_here)

    def help(self, future: concurrent.futures.Future[Any]) -> None:
        """Run queued operations on this thread until ``future`` is done or another thread runs them."""
        if self._ops is not None:
            self._ops.help(future)

    @property
    def direct(self) -> mesh.Mesh:
        """The direct links of :meth:`connect_mesh` (raises before it)."""
        if self._mesh is None:
            raise CollectiveAborted("no direct links: call connect_mesh first")
        return self._mesh

    def connect_mesh(self, *, timeout: float = 30.0) -> mesh.Mesh:
        """Open a direct link to every other rank of the current ring, for point-to-point messages."""
        with self._lock:
            ring, rank, epoch = self._ring, self._rank, self._epoch
        deadline = time.monotonic() + timeout
        others = [r for r in range(len(ring)) if r != rank]
        outs: dict[int, socket.socket] = {}
        try:
            for r in others:
                outs[r] = self._dial(ring[r], channel=0, deadline=deadline, purpose=frames.Purpose.DIRECT)
            keys = [(ring[r].peer_id, epoch, frames.Purpose.DIRECT, 0) for r in others]
            ins = dict(zip(others, self._await_incoming(keys, deadline=deadline, timeout=timeout), strict=True))
            direct = mesh.Mesh(rank=rank, outs=outs, ins=ins, io_timeout=self._io_timeout)
        except BaseException:
            for sock in outs.values():
                sock.close()
            raise
        with self._lock:
            old, self._mesh = self._mesh, direct
        if old is not None:
            old.close()
        return direct

    # ----- internals -------------------------------------------------------------------------

    def _guarded(self, fn: Callable[[], None], *, tag: int) -> None:
        """Run ``fn``; any exception aborts the engine (so the peers do not wait) and becomes CollectiveAborted."""
        try:
            fn()
        except CollectiveAborted:
            raise
        except runner.Failed as exc:
            raise CollectiveAborted(self._abort or str(exc)) from exc.__cause__
        except mesh.MeshError as exc:
            self.abort(str(exc))
            raise CollectiveAborted(self._abort or str(exc)) from exc
        except (OSError, frames.FrameError) as exc:
            reason = _link_failure(exc, tag=tag)
            self.abort(reason)
            raise CollectiveAborted(self._abort or reason) from exc
        except Exception as exc:  # a reducer, a copy, a plan: the peers must not wait for us
            reason = f"{type(exc).__name__} in operation tag {tag}: {exc}"
            self.abort(reason)
            raise CollectiveAborted(self._abort or reason) from exc

    def _enqueue(self, execute: Callable[[], None], *, run_here: bool) -> concurrent.futures.Future[None]:
        if self._ops is None:
            raise RuntimeError("start() the engine first")
        future = self._ops.submit(execute, wake=not run_here)
        with self._lock:
            self._inflight.add(future)
        future.add_done_callback(self._retire)
        if run_here:
            self._ops.help(future)
        return future

    def _operation(
        self,
        plan: Callable[[int, int], schedule.Plan],
        *,
        array: np.ndarray,
        dtype: frames.DType,
        tag: int,
        op: ops.ReduceOp = ops.ReduceOp.SUM,
        quantize: str | None = None,
        reducer: runner.Reducer | None = None,
        after: Callable[[int], None] | None = None,
        inline: Callable[[socket.socket, socket.socket, int, int], None] | None = None,
    ) -> Callable[[], None]:
        """One operation, to run in order: the ring ``plan``, or for a small buffer ``inline``
        (out, in, rank, world)."""
        use_inline = inline is not None and array.nbytes <= small.SMALL_BYTES

        def execute() -> None:
            rank, world, links, every = self._ring_now()
            if world == 1:
                if after is not None:
                    after(rank)
                return

            assert links is not None

            def body() -> None:
                if use_inline:
                    assert inline is not None and links is not None
                    inline(*links, rank, world)
                    return
                job = runner.Job(
                    plan=plan(rank, world),
                    array=array,
                    dtype=dtype,
                    op=op,
                    tag=tag,
                    world=world,
                    quantize=quantize,
                    reducer=reducer or runner.NumpyReducer(array, dtype),
                )
                self._execute(runner.Run(job, fail=self.abort), every)
                if after is not None:
                    after(rank)

            self._guarded(body, tag=tag)

        return execute

    def _ring_now(self) -> tuple[int, int, tuple[socket.socket, socket.socket] | None, _Links]:
        """rank, world, (successor link, predecessor link) of channel 0 and every channel's links, set
        when world > 1; raises CollectiveAborted when aborted or without a ring."""
        with self._lock:
            if self._abort is not None:
                raise CollectiveAborted(self._abort)
            rank, world, every = self._rank, self.world_size, _Links(outs=tuple(self._outs), ins=tuple(self._ins))
            links = (self._outs[0], self._ins[0]) if self._outs else None
        if world > 1 and links is None:
            raise CollectiveAborted("no ring: call set_ring first")
        return rank, world, links, every

    def _retire(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._inflight.discard(future)

    def _execute(self, run: runner.Run, links: _Links) -> None:
        """Run one plan on this thread; an abort from any thread cancels it while it is registered here."""
        with self._lock:
            self._running = run
            if self._abort is not None:
                run.cancel(self._abort)
        try:
            runner.execute(run, outs=links.outs, ins=links.ins, io_timeout=self._io_timeout)
        finally:
            with self._lock:
                self._running = None

    def _on_link(self, hello: frames.Hello, sock: socket.socket) -> str | None:
        with self._lock:
            if hello.epoch < self._epoch:
                return f"stale epoch {hello.epoch}, current is {self._epoch}"
            if hello.purpose is frames.Purpose.RING and hello.channel >= self._channels:
                return f"channel {hello.channel} out of range (connections_per_peer={self._channels})"
            key = (hello.peer_id, hello.epoch, hello.purpose, hello.channel)
            old = self._incoming.pop(key, None)
            if old is not None:
                old.close()
            self._incoming[key] = sock
            self._lock.notify_all()
        return None

    def _connect(self, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        nxt = self._ring[(self._rank + 1) % len(self._ring)]
        prev = self._ring[(self._rank - 1) % len(self._ring)]
        outs = [self._dial(nxt, channel=c, deadline=deadline) for c in range(self._channels)]
        keys = [(prev.peer_id, self._epoch, frames.Purpose.RING, c) for c in range(self._channels)]
        try:
            ins = self._await_incoming(keys, deadline=deadline, timeout=timeout)
        except BaseException:
            for s in outs:
                s.close()
            raise
        with self._lock:
            self._outs, self._ins = outs, ins

    def _await_incoming(
        self, keys: list[tuple[str, int, frames.Purpose, int]], *, deadline: float, timeout: float
    ) -> list[socket.socket]:
        """The sockets the listener keeps under ``keys``, once all arrived; abort or deadline raise."""
        with self._lock:
            while not all(k in self._incoming for k in keys):
                left = deadline - time.monotonic()
                if self._abort is not None:
                    raise CollectiveAborted(self._abort)
                if left <= 0:
                    missing = sorted({k[0] for k in keys if k not in self._incoming})
                    raise CollectiveAborted(f"{missing} did not connect in {timeout} s (epoch {self._epoch})")
                self._lock.wait(min(left, 0.5))
            return [self._incoming.pop(k) for k in keys]

    def _dial(
        self, peer: PeerAddress, *, channel: int, deadline: float, purpose: frames.Purpose = frames.Purpose.RING
    ) -> socket.socket:
        while True:
            try:
                return transport.dial(
                    host=peer.host,
                    port=peer.port,
                    token=self._token,
                    peer_id=self.peer_id,
                    epoch=self._epoch,
                    purpose=purpose,
                    channel=channel,
                    io_timeout=self._io_timeout,
                )
            except frames.FrameError as exc:
                raise CollectiveAborted(f"handshake with {peer.peer_id!r} failed: {exc}") from exc
            except ConnectionRefusedError as exc:  # nothing listens there any more: the peer is gone
                raise CollectiveAborted(f"{peer.peer_id!r} refused the ring connection: {exc}") from exc
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise CollectiveAborted(f"could not connect to {peer.peer_id!r}: {exc}") from exc
                with self._lock:
                    if self._abort is not None:
                        raise CollectiveAborted(self._abort) from exc
                    self._lock.wait(0.05)

    def _drop_links(self) -> None:
        for sock in self._outs + self._ins:
            transport.wake(sock)
            sock.close()
        self._outs, self._ins = [], []


@dataclasses.dataclass(frozen=True)
class _Links:
    outs: tuple[socket.socket, ...]  # to the successor, one per channel
    ins: tuple[socket.socket, ...]  # from the predecessor


@atexit.register
def _close_open_engines() -> None:
    """Runs before the interpreter finalizes (see the module's fault-tolerance contract)."""
    for open_engine in list(_OPEN):
        open_engine.close()


def _check_array(array: np.ndarray, *, bfloat16: bool) -> frames.DType:
    if array.ndim != 1 or not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("the engine works on writeable 1-D C-contiguous arrays")
    return ops.wire_dtype(array, bfloat16=bfloat16)


def _check_quantize(mode: str, dtype: frames.DType) -> None:
    quantize.check_mode(mode, dtype)


def _link_failure(exc: BaseException, *, tag: int) -> str:
    if isinstance(exc, frames.FrameError):
        return f"malformed or unexpected frame: {exc}"
    if isinstance(exc, TimeoutError):
        return f"peer stalled: no data for the I/O timeout (tag {tag})"
    return f"connection failed: {exc}"


def _close(sock: socket.socket) -> bool:
    sock.close()
    return False
