"""The user-facing collective API (PCCL style): membership through the coordinator, data
through the ring engine, and the fault-tolerance contract that ties them together.

Owns one peer's view of the group: connect (register, wait to be accepted), run collectives in
call order on a worker thread (``Work.wait()``), accept newcomers, sync shared state, and
re-measure the ring. Numpy arrays only (torch goes through ``collective/tensors.py``).

Fault-tolerance contract:
- Every collective first votes on the coordinator (``/v1/collective/begin``); it runs only when
  every accepted peer voted, under the tag, epoch and ring the vote returned. When that epoch is
  new, the engine's ring is rebuilt first (``set_ring``), by every participant alike.
- Each participant reports its outcome (``/v1/collective/end``) and waits for the tag's single
  verdict. A local failure (a neighbour's socket closed, a stall) is reported and aborts the tag
  for everybody; a peer the failure detector removes aborts it too, and the heartbeat thread
  pushes that abort into the engine at once (``engine.abort``), so nobody waits for a socket
  timeout.
- On an abort verdict the buffer (``all_reduce``'s array, ``broadcast``'s array, ``all_gather``'s
  ``out``) is restored to its value before the call, bit for bit, and ``Work.wait()`` raises
  :class:`~ringseed.collective.engine.CollectiveAborted`. Any other way a call can raise (the
  coordinator unreachable, ``close()`` during the call) restores the buffer too: when
  ``Work.wait()`` raises, the buffer is as before the call. Any exception inside the ring
  operation itself (a reducer raising, a CUDA error) aborts it on every peer at once. The caller retries
  (``retry.all_reduce_with_retry``); the retry runs with the survivors. Even a peer whose own
  part finished cleanly restores and retries, so every peer always holds the same result.
- A peer the coordinator removed gets :class:`PeerRemoved` from every later call; it must close
  and connect again as a newcomer. ``close()`` never blocks on an operation in flight: that
  operation raises CollectiveAborted (buffer restored).
- Every peer must call the same collectives, ``accept_new_peers`` and ``sync_shared_state`` in the
  same order; a newcomer's first call after ``connect`` is ``sync_shared_state``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ringseed.collective import control, engine, ops, runner, state

log = logging.getLogger(__name__)
T = TypeVar("T")
ReduceOp = ops.ReduceOp


class PeerRemoved(engine.CollectiveAborted):
    """The coordinator removed this peer; it must connect again."""


class Work:
    """A handle on one queued operation."""

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self._future = future

    def wait(self, timeout: float | None = None) -> None:
        """Block until done; raises ``CollectiveAborted`` (buffer restored) on an abort."""
        self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()


class Communicator:
    """One peer of a fault-tolerant training group."""

    def __init__(
        self,
        *,
        coordinator_url: str,
        token: str,
        peer_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        connections_per_peer: int = 1,
        io_timeout: float = 30.0,
        hold: float = 10.0,
        probe_bytes: int = 4 << 20,
    ) -> None:
        self.peer_id = peer_id
        self._client = control.Client(url=coordinator_url, token=token)
        self._engine = engine.RingEngine(
            peer_id=peer_id,
            token=token,
            host=host,
            port=port,
            connections_per_peer=connections_per_peer,
            io_timeout=io_timeout,
        )
        self._hold, self._probe_bytes, self._io_timeout = hold, probe_bytes, io_timeout
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"ringseed-comm-{peer_id}")
        self._lock = threading.Lock()
        self._tag: int | None = None
        self._aborted: set[int] = set()
        self._removed: str | None = None
        self._heartbeat: control.Heartbeat | None = None
        self._epoch = -1
        self._ring: tuple[engine.PeerAddress, ...] = ()
        self._closing = threading.Event()
        self._last: concurrent.futures.Future[Any] | None = None
        self.heartbeat_timeout = 10.0

    # -- membership ----------------------------------------------------------------------

    def connect(self, *, timeout: float = 300.0) -> None:
        """Register, keep heartbeating, and return once the group accepted this peer."""
        address = self._engine.start()
        body = {"peer_id": self.peer_id, "host": address.host, "port": address.port}
        answer = self._client.call("POST", "/v1/join", body)
        self.heartbeat_timeout = float(answer["heartbeat_timeout"])
        self._heartbeat = control.Heartbeat(
            client=self._client,
            peer_id=self.peer_id,
            interval=float(answer["heartbeat_interval"]),
            abort_seq=int(answer["abort_seq"]),
            on_aborts=self._on_aborts,
            on_removed=self._on_removed,
        )
        self._heartbeat.start()
        waited = 0.0
        while answer["status"] != "Accepted":
            if answer["status"] == "Removed" or waited >= timeout:
                raise TimeoutError(f"{self.peer_id} was not accepted into the group within {timeout} s")
            hold = min(self._hold, timeout - waited)
            answer = self._client.call("POST", "/v1/join", body, hold=hold)
            waited += hold
        self._ring = _addresses(answer["ring"])

    @property
    def rank(self) -> int:
        ids = [p.peer_id for p in self._ring]
        return ids.index(self.peer_id) if self.peer_id in ids else 0

    @property
    def world_size(self) -> int:
        return max(1, len(self._ring))

    @property
    def ring(self) -> list[str]:
        """Peer ids in ring (rank) order, as of the last operation."""
        return [p.peer_id for p in self._ring]

    def accept_new_peers(self) -> list[str]:
        """Vote (with every accepted peer) to accept the peers waiting to join; returns them."""
        return self._queue(lambda: self._round("/v1/vote/accept", {})["accepted"])

    def update_topology(self) -> list[str]:
        """Measure bandwidth to every peer and let the coordinator pick the ring; returns it."""
        return self._queue(self._measure)

    def sync_shared_state(self, shared: state.SharedState) -> int:
        """Make ``shared`` identical on every peer (see ``state.py``); returns the new revision."""
        return self._queue(lambda: self._sync(shared))

    def close(self) -> None:
        """Leave the group and stop; an operation in flight ends in CollectiveAborted with its buffer
        restored. Returns within about ``engine.CLOSE_WAIT`` whatever the operation was waiting for."""
        self._closing.set()
        if self._heartbeat is not None:
            self._heartbeat.stop(wait=False)
        try:
            self._client.call("POST", "/v1/leave", {"peer_id": self.peer_id})
        except (control.CoordinatorError, OSError) as exc:
            log.debug("Leave of %s not acknowledged: %s", self.peer_id, exc)
        self._engine.abort("communicator closed")
        self._client.close()  # wakes the op thread's long polls (votes, verdicts)
        if self._heartbeat is not None:
            self._heartbeat.stop()
        with self._lock:
            last = self._last
        self._worker.shutdown(wait=False, cancel_futures=True)
        if last is not None and not concurrent.futures.wait([last], timeout=engine.CLOSE_WAIT).done:
            log.warning("Closed %s with an operation still running", self.peer_id)
        self._engine.close()
        self._client.close_thread_connection()

    # -- collectives ---------------------------------------------------------------------

    def all_reduce(
        self,
        array: np.ndarray,
        *,
        op: ops.ReduceOp = ReduceOp.SUM,
        quantize: str | None = None,
        bfloat16: bool = False,
        reducer: runner.Reducer | None = None,
    ) -> Work:
        """In-place all-reduce of a 1-D C-contiguous array. ``bfloat16``: ``array`` is uint16
        storage of bfloat16 values (numpy has no bfloat16). ``reducer`` combines the received
        segments on the ring path (e.g. on a GPU; small buffers are reduced on the host)."""

        def body(tag: int) -> None:
            self._engine.all_reduce(array, op=op, tag=tag, quantize=quantize, bfloat16=bfloat16, reducer=reducer)

        return self._submit(name="all_reduce", protect=array, body=body)

    def broadcast(self, array: np.ndarray, *, root: int) -> Work:
        """``root`` is a rank of the ring the operation runs on (see ``ring`` after it)."""

        def body(tag: int) -> None:
            self._engine.broadcast(array, root=root, tag=tag)

        return self._submit(name="broadcast", protect=array, body=body)

    def all_gather(self, array: np.ndarray, out: np.ndarray) -> Work:
        """``out`` must hold ``world_size * len(array)`` elements of the ring the op runs on."""

        def body(tag: int) -> None:
            self._engine.all_gather(array, out, tag=tag)

        return self._submit(name="all_gather", protect=out, body=body)

    def _submit(self, *, name: str, protect: np.ndarray, body: Callable[[int], None]) -> Work:
        return Work(self._enqueue(lambda: self._run_op(name=name, protect=protect, body=body)))

    def _queue(self, job: Callable[[], T]) -> T:
        return self._enqueue(job).result()

    def _enqueue(self, job: Callable[[], T]) -> concurrent.futures.Future[T]:
        with self._lock:
            future = self._last = self._worker.submit(job)
        return future

    def _run_op(self, *, name: str, protect: np.ndarray, body: Callable[[int], None]) -> None:
        """Vote, run, and report; whenever this raises, ``protect`` is as it was before the call."""
        self._check_removed()
        backup = protect.copy()
        try:
            self._vote_run_report(name=name, protect=protect, backup=backup, body=body)
        except engine.CollectiveAborted as exc:
            if self._closing.is_set():  # close() leaves the group: "removed" is then its own doing
                np.copyto(protect, backup)
                raise engine.CollectiveAborted(f"{name} on {self.peer_id} ended by close(): {exc}") from exc
            raise
        except BaseException as exc:  # no verdict (coordinator gone, close()): the op did not happen
            np.copyto(protect, backup)
            if self._closing.is_set():
                raise engine.CollectiveAborted(f"{name} on {self.peer_id} ended by close()") from exc
            raise

    def _vote_run_report(
        self, *, name: str, protect: np.ndarray, backup: np.ndarray, body: Callable[[int], None]
    ) -> None:
        begun = self._round("/v1/collective/begin", {"op": name, "nbytes": int(protect.nbytes)})
        tag = int(begun["tag"])
        failure: BaseException | None = None
        with self._lock:
            self._tag = tag
        try:
            self._adopt(epoch=int(begun["epoch"]), ring=_addresses(begun["ring"]))
            with self._lock:
                if tag in self._aborted:
                    raise engine.CollectiveAborted(f"tag {tag} was aborted by the coordinator")
            body(tag)
        except Exception as exc:
            failure = exc
        finally:
            with self._lock:
                self._tag = None
        verdict = self._end(tag, failure)
        if verdict["verdict"] != "complete":
            np.copyto(protect, backup)
            if failure is not None and not isinstance(failure, engine.CollectiveAborted):
                raise failure
            self._check_removed()
            raise engine.CollectiveAborted(f"{name} tag {tag} aborted: {verdict['reason']}")

    def _adopt(self, *, epoch: int, ring: tuple[engine.PeerAddress, ...]) -> None:
        if epoch == self._epoch:
            return
        self._epoch, self._ring = epoch, ring
        self._engine.set_ring(ring, epoch=epoch, timeout=max(self.heartbeat_timeout + 5.0, 10.0))

    def _end(self, tag: int, failure: BaseException | None) -> dict[str, Any]:
        body = {"peer_id": self.peer_id, "tag": tag, "ok": failure is None, "reason": str(failure or "")}
        while True:
            answer = self._client.call("POST", "/v1/collective/end", body, hold=self._hold)
            if answer["verdict"] is not None:
                return answer

    def _round(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        self._check_removed()
        try:
            return self._client.round(path, peer_id=self.peer_id, payload=payload, hold=self._hold)
        except control.Removed as exc:
            self._on_removed(exc.reason)
            raise PeerRemoved(f"{self.peer_id} was removed from the group: {exc.reason}") from exc

    # -- heartbeat callbacks (heartbeat thread) ------------------------------------------

    def _on_aborts(self, tags: list[int]) -> None:
        with self._lock:
            self._aborted.update(tags)
            if len(self._aborted) > 1024:
                self._aborted = set(sorted(self._aborted)[-256:])
            current = self._tag
        if current is not None and current in tags:
            self._engine.abort(f"the coordinator aborted tag {current}")

    def _on_removed(self, reason: str) -> None:
        with self._lock:
            self._removed = reason
        self._engine.abort(f"removed from the group: {reason}")

    def _check_removed(self) -> None:
        with self._lock:
            reason = self._removed
        if reason is not None:
            raise PeerRemoved(f"{self.peer_id} was removed from the group: {reason}")

    # -- topology and state --------------------------------------------------------------

    def _measure(self) -> list[str]:
        topo = self._client.call("GET", "/v1/topology")
        if topo["optimize"]:
            targets = [p for p in _addresses(topo["ring"]) if p.peer_id != self.peer_id]
            row = self._engine.measure_bandwidth(targets, nbytes=self._probe_bytes)
            topo = self._round("/v1/bandwidth", {"row": row})
        return [a["peer_id"] for a in topo["ring"]]

    def _sync(self, shared: state.SharedState) -> int:
        plan = self._round("/v1/state/sync", {"revision": shared.revision, "hashes": shared.hashes()})
        if plan["error"]:
            raise state.StateSyncError(plan["error"])
        for name in plan["fetch"]:
            flat = shared.flat(name)
            self._run_op(name="broadcast", protect=flat, body=self._from_source(flat, str(plan["source"])))
            got = state.digest(shared.tensors[name])
            if got != plan["hashes"][name]:
                raise state.StateSyncError(f"tensor {name!r} hash {got} after sync, expected {plan['hashes'][name]}")
        shared.revision = int(plan["revision"])
        return shared.revision

    def _from_source(self, flat: np.ndarray, source: str) -> Callable[[int], None]:
        def body(tag: int) -> None:
            if source not in self.ring:
                raise engine.CollectiveAborted(f"state source {source} left the group")
            self._engine.broadcast(flat, root=self.ring.index(source), tag=tag)

        return body


def _addresses(ring: list[dict[str, Any]]) -> tuple[engine.PeerAddress, ...]:
    return tuple(engine.PeerAddress(peer_id=str(a["peer_id"]), host=str(a["host"]), port=int(a["port"])) for a in ring)
