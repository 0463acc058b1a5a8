"""The collective listener under hostile load, with real sockets: idle floods, garbage handshakes,
threads that cannot start. Honest peers must still connect and compute, every time."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringseed.collective import engine, listener, transport
from ringseed.protocol import frames
from tests.component.collective import _engine_ring
from tests.conftest import REPO, is_root

TOKEN = _engine_ring.TOKEN


def dial(address: engine.PeerAddress, *, peer_id: str = "honest", epoch: int = 1, channel: int = 0) -> socket.socket:
    return transport.dial(
        host=address.host,
        port=address.port,
        token=TOKEN,
        peer_id=peer_id,
        epoch=epoch,
        purpose=frames.Purpose.RING,
        channel=channel,
        io_timeout=10,
    )


@contextlib.contextmanager
def idle_connections(address: engine.PeerAddress, n: int) -> Iterator[list[socket.socket]]:
    """``n`` TCP connections that never say a word."""
    socks = [socket.create_connection((address.host, address.port), timeout=10) for _ in range(n)]
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


def eof_seen(sock: socket.socket) -> bool:
    """Reads what the listener sent (the challenge) and waits for it to close the connection."""
    sock.settimeout(20)
    while True:
        try:
            data = sock.recv(4096)
        except ConnectionResetError:
            return True
        if not data:
            return True


def ring_computes(peers: list[engine.RingEngine], *, epoch: int) -> None:
    ring = [p.address for p in peers]
    _engine_ring.each(peers, lambda e: e.set_ring(ring, epoch=epoch, timeout=20))
    arrays = [np.full(1000, e.rank + 1.0, np.float32) for e in peers]
    _engine_ring.each(peers, lambda e: e.all_reduce(arrays[e.rank], op=engine.ReduceOp.SUM, tag=epoch))
    for a in arrays:
        np.testing.assert_array_equal(a, np.full(1000, sum(range(1, len(peers) + 1)), np.float32))


def test_a_flood_of_idle_connections_cannot_keep_honest_peers_out() -> None:
    """Four times more idle connections than the pending table holds, opened before the peers
    connect: the oldest are evicted, the honest handshakes complete, the ring computes."""
    with _engine_ring.ring(3) as peers:
        target = peers[0]
        assert target._listener is not None
        flood = 4 * 64
        with idle_connections(target.address, flood):
            ring_computes(peers, epoch=2)
            stats = target._listener.stats
            assert stats.evicted >= flood - 64
            assert target._listener.pending <= 64  # bounded, whatever arrives
        assert target._listener.stats.loop_errors == 0


GARBAGE = {
    "random bytes": os.urandom(frames.HELLO_FIXED_BYTES),
    "bad magic": b"EVIL" + bytes(frames.HELLO_FIXED_BYTES - 4),
    "an HTTP request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(frames.HELLO_FIXED_BYTES),
    "half a hello, then silence": frames.MAGIC + bytes([frames.VERSION, 1]),
}


@pytest.mark.parametrize("payload", list(GARBAGE.values()), ids=list(GARBAGE))
def test_garbage_handshakes_are_refused_and_the_listener_keeps_serving(payload: bytes) -> None:
    with _engine_ring.ring(2) as peers:
        assert peers[0]._listener is not None
        before = peers[0]._listener.stats
        for _ in range(20):
            with socket.create_connection((peers[0].address.host, peers[0].address.port), timeout=10) as s:
                s.recv(frames.CHALLENGE_BYTES)
                s.sendall(payload)
        ring_computes(peers, epoch=2)
        after = peers[0]._listener.stats
        assert after.loop_errors == before.loop_errors == 0


def test_a_silent_dialer_is_closed_at_the_handshake_deadline() -> None:
    lis = listener.Listener(
        host="127.0.0.1", port=0, token=TOKEN, io_timeout=30, on_link=lambda h, s: None, handshake_timeout=0.3
    )
    lis.start()
    try:
        with socket.create_connection(("127.0.0.1", lis.port), timeout=10) as s:
            assert eof_seen(s)
        assert lis.stats.expired == 1
    finally:
        lis.close()


def test_honest_peers_connect_while_no_thread_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Handshakes and probes run on the listener's one thread: with thread creation failing
    everywhere (a pids limit), ring connections and bandwidth probes are still served."""
    target = engine.RingEngine(peer_id="target", token=TOKEN, io_timeout=10)
    prober = engine.RingEngine(peer_id="prober", token=TOKEN, io_timeout=10)
    kept: list[socket.socket] = []
    try:
        address = target.start()
        prober.start()

        def no_threads(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(threading.Thread, "start", no_threads)
        with idle_connections(address, 100):
            kept += [dial(address, peer_id="prev", channel=0)]
            assert prober.measure_bandwidth([address], nbytes=1 << 20)["target"] > 0
        monkeypatch.undo()
        assert target._listener is not None and target._listener.stats.loop_errors == 0
    finally:
        for s in kept:
            s.close()
        target.close()
        prober.close()


def test_a_ring_reconnects_and_computes_while_no_thread_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operation starts no thread (the caller's thread drives the links), so at a pids limit a
    ring still reconnects and runs ring-path collectives (1 MiB, above the small path)."""
    with _engine_ring.ring(3, io_timeout=120) as peers:
        ring = [p.address for p in peers]
        n = (1 << 20) // 4
        arrays = [np.full(n, e.rank + 1.0, np.float32) for e in peers]
        gathered = [np.zeros(3 * n, np.float32) for _ in peers]
        go = threading.Event()
        errors: list[BaseException] = []

        def rank_main(e: engine.RingEngine) -> None:
            go.wait()
            try:
                e.set_ring(ring, epoch=2, timeout=20)
                e.all_reduce(arrays[e.rank], op=engine.ReduceOp.SUM, tag=1)
                e.all_gather(arrays[e.rank], gathered[e.rank], tag=2)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=rank_main, args=(e,)) for e in peers]
        for w in workers:
            w.start()

        def no_threads(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(threading.Thread, "start", no_threads)
        go.set()
        for w in workers:
            w.join(60)
        monkeypatch.undo()
        assert not any(w.is_alive() for w in workers) and not errors, errors
        for a, g in zip(arrays, gathered, strict=True):
            np.testing.assert_array_equal(a, np.full(n, 6.0, np.float32))
            np.testing.assert_array_equal(g, np.full(3 * n, 6.0, np.float32))


class Child:
    """A listener in its own process (``_listener_child.py``), so a test can set that process's limits."""

    def __init__(self, *, handshake_timeout: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.component.collective._listener_child", str(handshake_timeout)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.read()
        self.pid = int(ready["pid"])
        self.address = engine.PeerAddress(peer_id="child", host="127.0.0.1", port=int(ready["port"]))

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the listener process ended (rc {self.proc.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def child_listener(*, handshake_timeout: float) -> Iterator[Child]:
    child = Child(handshake_timeout=handshake_timeout)
    try:
        yield child
    finally:
        child.close()


def test_accept_survives_running_out_of_file_descriptors() -> None:
    """The listener's process may open 8 more files: the idle flood makes accept() fail with
    EMFILE again and again; accepting pauses, idle handshakes expire, honest peers get in."""
    with child_listener(handshake_timeout=0.5) as child:
        child.ask("nofile 8")
        kept = []
        try:
            with idle_connections(child.address, 40):
                kept = [dial(child.address, peer_id=f"honest-{i}") for i in range(3)]
            kept.append(dial(child.address, peer_id="after-the-flood"))
        finally:
            for s in kept:
                s.close()
        stats = child.ask("stats")
        assert stats["accept_errors"] > 0, "the flood never exhausted the descriptors: the test proved nothing"
        assert stats["kept"] == 4 and stats["loop_errors"] == 0


def pids_hierarchy() -> Path | None:
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists():
        return v1
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "pids" in controllers.read_text().split():
        return v2
    return None


@contextlib.contextmanager
def pids_frozen(pid: int) -> Iterator[Path]:
    """Move ``pid`` into a new pids cgroup whose limit is the tasks it has now: no thread can start."""
    root = pids_hierarchy()
    if root is None:
        pytest.skip("no pids cgroup controller on this machine")
    group = root / f"ringseed-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "pids.max").write_text((group / "pids.current").read_text().strip())
        yield group
    finally:
        with contextlib.suppress(OSError):  # back to the root group, so the group can go
            (root / "cgroup.procs").write_text(str(pid))
        group.rmdir()


@pytest.mark.skipif(not is_root(), reason="creating a pids cgroup needs root")
def test_listener_keeps_serving_at_the_pids_limit() -> None:
    """The issue's case: every connection used to take a thread, so at the pids limit the accept
    thread died. Now idle floods, garbage and honest handshakes and probes need no new thread."""
    with child_listener(handshake_timeout=10) as child, pids_frozen(child.pid):
        assert child.ask("thread") == {"started": False}, "the pids limit does not bite: the test proves nothing"
        kept = []
        try:
            with idle_connections(child.address, 200):
                for payload in GARBAGE.values():
                    with socket.create_connection((child.address.host, child.address.port), timeout=10) as s:
                        s.recv(frames.CHALLENGE_BYTES)
                        s.sendall(payload)
                kept = [dial(child.address, peer_id=f"honest-{i}") for i in range(5)]
                prober = transport.dial(
                    host=child.address.host,
                    port=child.address.port,
                    token=TOKEN,
                    peer_id="prober",
                    epoch=0,
                    purpose=frames.Purpose.PROBE,
                    channel=0,
                    io_timeout=10,
                )
                with prober:
                    assert transport.probe(sock=prober, nbytes=4 << 20) > 0
        finally:
            for s in kept:
                s.close()
        stats = child.ask("stats")
        assert stats["kept"] == 5 and stats["loop_errors"] == 0 and stats["evicted"] > 0
