"""The coordinator role of the master: a training group's membership, votes, ring and recovery.

Owns the HTTP face of :mod:`ringseed.protocol.membership` (which makes every decision) and the
failure detector. JSON over HTTP with the group's bearer token (``web.make_app``).

Endpoints (every POST body names ``peer_id``; ``wait`` is how long the call may be held, in s):
- ``POST /v1/join {peer_id, host, port}``: Registered; held until Accepted ->
  ``{status, epoch, ring, heartbeat_interval, heartbeat_timeout, abort_seq}``.
- ``POST /v1/heartbeat {peer_id, abort_seq}``: proof of life; held up to the heartbeat interval
  and answered at once when a tag is aborted -> ``{status, epoch, abort_seq, aborts, pending_peers}``.
  An unknown (removed) peer gets 410 ``removed``.
- Rounds, all ``{peer_id, round?, ...}`` -> ``{round, done, result}``; the first call votes and
  later calls with ``round`` only poll: ``POST /v1/collective/begin {op, nbytes}`` (result: tag,
  epoch, ring), ``POST /v1/vote/accept``, ``POST /v1/state/sync {revision, hashes}``,
  ``POST /v1/bandwidth {row}``.
- ``POST /v1/collective/end {peer_id, tag, ok, reason}``: held until the verdict ->
  ``{verdict: "complete"|"abort"|null, reason, epoch}``.
- ``POST /v1/leave {peer_id}``: a clean exit, handled like a removal.
- ``GET /v1/topology``, ``GET /v1/status`` (contract: "Master status": membership's view plus
  ``held_heartbeats``, the peers whose heartbeat is held now, i.e. whose death is noticed at
  once), ``GET /metrics``.

Failure detector: a peer whose last request (its last sign of life) is older than
``heartbeat_timeout`` is removed by a background task that wakes at the earliest such deadline
(and at least every ``DETECTOR_PERIOD``), so a silent peer is declared dead about
``heartbeat_timeout`` after its last sign of life, not a check period later. A peer's held
heartbeat whose connection closes before the answer is sent counts as death at once: a peer's
heartbeat thread always waits for the answer (it never hangs up a held call), so the connection
closes under a held heartbeat only when its process is gone (SIGKILL, crash, exit without
``close``), and the kernel closes its sockets at once. Removal aborts the peer's collectives at
once and wakes every held call, so survivors learn of it within milliseconds, not after a
socket timeout. Long polls use one asyncio event that is replaced on every state change.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from aiohttp import web as aioweb

from ringseed import web
from ringseed.master import coordinator_http as http
from ringseed.protocol import membership

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_WAIT = 60.0
DETECTOR_PERIOD = 0.05  # the failure detector's longest sleep, in s
LIVENESS_POLL = 0.02  # how often a held heartbeat checks that its connection is still open, in s


class Coordinator:
    """State plus change notification; handlers are thin wrappers around it."""

    def __init__(
        self,
        *,
        heartbeat_interval: float,
        heartbeat_timeout: float,
        optimize_topology: bool,
        min_peers: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if heartbeat_interval <= 0 or heartbeat_timeout <= heartbeat_interval:
            raise ValueError("need 0 < heartbeat_interval < heartbeat_timeout")
        self.interval = heartbeat_interval
        self.timeout = heartbeat_timeout
        self.clock = clock
        self.group = membership.Membership(min_peers=min_peers, optimize_topology=optimize_topology)
        self.metrics = web.Metrics()
        self._changed = asyncio.Event()
        self.held: collections.Counter[str] = collections.Counter()  # peer id -> heartbeats held now
        self.closing = False  # the server is shutting down: held calls answer now
        self.metrics.declare("coordinator_peers_removed_total", "counter", "peers removed by the failure detector")
        self.metrics.declare("coordinator_aborts_total", "counter", "collective tags that got the abort verdict")

    def changed(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def close(self) -> None:
        """The server is shutting down: every held call returns what it has (a vote whose peer
        already left would otherwise hold the shutdown for up to ``MAX_WAIT``)."""
        self.closing = True
        self.changed()

    async def wait_for(
        self, check: Callable[[], T | None], *, wait: float, connected: Callable[[], bool] | None = None
    ) -> T | None:
        """Re-run ``check`` after every state change until it gives a value or ``wait`` passes;
        with ``connected``, also stop (within ``LIVENESS_POLL``) once it returns False."""
        deadline = self.clock() + min(max(wait, 0.0), MAX_WAIT)
        while True:
            found = check()
            left = deadline - self.clock()
            if found is not None or left <= 0 or self.closing or (connected is not None and not connected()):
                return found
            event = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), left if connected is None else min(left, LIVENESS_POLL))

    def seen(self, peer_id: str) -> None:
        if peer_id in self.group.peers:
            self.group.heartbeat(peer_id=peer_id, now=self.clock())

    def expire(self) -> None:
        before = self.group.abort_seq
        lost = self.group.expire(now=self.clock(), timeout=self.timeout)
        for peer_id in lost:
            log.warning("Removed peer %s: no heartbeat for %.1f s", peer_id, self.timeout)
            self.metrics.inc("coordinator_peers_removed_total")
        if lost:
            self.metrics.inc("coordinator_aborts_total", self.group.abort_seq - before)
            self.changed()

    def lost(self, peer_id: str, *, reason: str) -> None:
        """Remove a peer known to be dead (its held heartbeat's connection closed)."""
        if peer_id not in self.group.peers:
            return
        before = self.group.abort_seq
        self.group.remove(peer_id, reason=reason, now=self.clock())
        log.warning("Removed peer %s: %s", peer_id, reason)
        self.metrics.inc("coordinator_peers_removed_total")
        self.metrics.inc("coordinator_aborts_total", self.group.abort_seq - before)
        self.changed()

    def next_expiry(self) -> float:
        """Seconds until the earliest peer's silence exceeds the timeout (``DETECTOR_PERIOD`` if none)."""
        if not self.group.peers:
            return DETECTOR_PERIOD
        oldest = min(p.last_seen for p in self.group.peers.values())
        return oldest + self.timeout - self.clock()

    def refresh_metrics(self) -> None:
        status = self.group.status()
        self.metrics.set("coordinator_peers", status["peers"])
        self.metrics.set("coordinator_world_size", status["world_size"])
        self.metrics.set("coordinator_epoch", status["epoch"])
        for phase in membership.Phase:
            self.metrics.set("coordinator_phase", 1.0 if status["phase"] == phase.value else 0.0, phase=phase.value)
        last = status["last_all_reduce"]
        if last is not None:
            self.metrics.set("coordinator_last_all_reduce_busbw_gbps", last["busbw_gbps"])


def create_app(
    *, token: str, heartbeat_interval: float, heartbeat_timeout: float, optimize_topology: bool, min_peers: int
) -> aioweb.Application:
    """The coordinator's aiohttp application (see the module docstring for the API)."""
    app = web.make_app(token=token, errors=http.ERRORS)
    state: dict[str, Coordinator] = {}
    if heartbeat_interval <= 0 or heartbeat_timeout <= heartbeat_interval:
        raise ValueError("need 0 < heartbeat_interval < heartbeat_timeout")

    async def lifecycle(app: aioweb.Application) -> AsyncIterator[None]:
        coordinator = state["c"] = Coordinator(
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            optimize_topology=optimize_topology,
            min_peers=min_peers,
        )
        task = asyncio.create_task(_detector(coordinator))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def release_held_calls(app: aioweb.Application) -> None:
        if "c" in state:
            state["c"].close()

    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(release_held_calls)
    _routes(app, lambda: state["c"])
    return app


async def _detector(coordinator: Coordinator) -> None:
    period = min(coordinator.interval / 2, coordinator.timeout / 20, DETECTOR_PERIOD)
    while True:
        # wake just after the earliest deadline (expiry needs silence *longer* than the timeout)
        await asyncio.sleep(min(period, max(coordinator.next_expiry(), 0.0) + 0.001))
        coordinator.expire()


def _routes(app: aioweb.Application, get: Callable[[], Coordinator]) -> None:
    r = app.router
    r.add_post("/v1/join", http.join(get))
    r.add_post("/v1/heartbeat", http.heartbeat(get))
    r.add_post("/v1/collective/begin", http.round_(get, membership.RoundKind.COLLECTIVE))
    r.add_post("/v1/vote/accept", http.round_(get, membership.RoundKind.ACCEPT))
    r.add_post("/v1/state/sync", http.round_(get, membership.RoundKind.SYNC))
    r.add_post("/v1/bandwidth", http.round_(get, membership.RoundKind.BANDWIDTH))
    r.add_post("/v1/collective/end", http.end(get))
    r.add_post("/v1/leave", http.leave(get))
    r.add_get("/v1/topology", http.topology(get))
    r.add_get("/v1/status", http.status(get))

    async def metrics(request: aioweb.Request) -> aioweb.StreamResponse:
        c = get()
        return await c.metrics.handler(c.refresh_metrics)(request)

    r.add_get("/metrics", metrics)
