"""Test helpers: a coordinator on a loopback port in a background thread, and peers in threads."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ringseed.collective import communicator, control, engine
from ringseed.master import coordinator
from tests.component import served

TOKEN = "test-token"
T = TypeVar("T")


@contextlib.contextmanager
def running_coordinator(
    *, interval: float = 0.2, timeout: float = 1.5, min_peers: int = 1, optimize: bool = False
) -> Iterator[str]:
    """Yield the URL of a coordinator served from a thread; stop it afterwards."""
    app = coordinator.create_app(
        token=TOKEN,
        heartbeat_interval=interval,
        heartbeat_timeout=timeout,
        optimize_topology=optimize,
        min_peers=min_peers,
    )
    with served.in_thread(app) as url:
        yield url


def wait_for_status(url: str, check: Callable[[dict[str, Any]], bool], *, within: float = 30.0) -> dict[str, Any]:
    """Poll the coordinator's ``GET /v1/status`` until ``check`` holds; AssertionError after ``within`` s."""
    client = control.Client(url=url, token=TOKEN)
    deadline = time.monotonic() + within
    try:
        while True:
            status = client.call("GET", "/v1/status")
            if check(status):
                return status
            assert time.monotonic() < deadline, f"coordinator status never satisfied the check: {status}"
            time.sleep(0.01)  # a poll interval, not a guess at how long something takes
    finally:
        client.close()


def make_peer(url: str, name: str) -> communicator.Communicator:
    return communicator.Communicator(coordinator_url=url, token=TOKEN, peer_id=name, io_timeout=10.0, hold=2.0)


def on_each(
    comms: list[communicator.Communicator], fn: Callable[[int, communicator.Communicator], T], *, timeout: float = 60.0
) -> list[T]:
    """Run ``fn(i, comm)`` for every peer at once (each peer is its own thread)."""
    with concurrent.futures.ThreadPoolExecutor(len(comms)) as pool:
        futures = [pool.submit(fn, i, c) for i, c in enumerate(comms)]
        return [f.result(timeout) for f in futures]


@contextlib.contextmanager
def connected_peers(url: str, n: int, *, prefix: str = "p") -> Iterator[list[communicator.Communicator]]:
    comms = [make_peer(url, f"{prefix}{i}") for i in range(n)]
    try:
        on_each(comms, lambda i, c: c.connect(timeout=30))
        yield comms
    finally:
        for c in comms:
            with contextlib.suppress(Exception):
                c.close()


def join_ghost(url: str) -> tuple[engine.RingEngine, control.Client]:
    """A peer "ghost" driven by hand: its ring engine listening and joined to the coordinator."""
    ghost_engine = engine.RingEngine(peer_id="ghost", token=TOKEN, io_timeout=30.0)
    address = ghost_engine.start()
    ghost = control.Client(url=url, token=TOKEN)
    ghost.call("POST", "/v1/join", {"peer_id": "ghost", "host": address.host, "port": address.port})
    return ghost_engine, ghost


def ghost_enters_ring(ghost: control.Client, ghost_engine: engine.RingEngine, *, nbytes: int) -> dict[str, Any]:
    """The ghost votes to begin an all-reduce of ``nbytes`` and joins the ring; returns the begin reply."""
    begun: dict[str, Any] = ghost.round(
        "/v1/collective/begin", peer_id="ghost", payload={"op": "all_reduce", "nbytes": nbytes}
    )
    ghost_engine.set_ring([engine.PeerAddress(**a) for a in begun["ring"]], epoch=begun["epoch"], timeout=10)
    return begun
