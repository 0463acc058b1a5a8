"""A peer process killed with SIGKILL during all-reduces: survivors abort, restore, and retry.

Runs ``ringseed local allreduce --kill-peer-mid-op`` (coordinator and peers are real processes):
the last peer SIGKILLs itself inside the first all-reduce after the warm-up, when it combines
its first received segment, so the kill lands mid-operation whatever the machine's load.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any


def test_sigkill_mid_all_reduce_recovers_with_the_survivors(ringseed_cmd: list[str]) -> None:
    timeout = 2.0
    done = subprocess.run(
        [
            *ringseed_cmd,
            "local",
            "allreduce",
            "--peers",
            "3",
            "--size",
            "32Mi",
            "--kill-peer-mid-op",
            "--heartbeat-interval",
            "0.25",
            "--heartbeat-timeout",
            str(timeout),
            "--iters",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, Any] = json.loads(done.stdout)
    # every survivor's call ended in an abort, within the heartbeat timeout of the kill
    assert summary["abort_seconds"] is not None and summary["abort_seconds"] <= timeout
    # ... with its buffer bit-identical to before the call
    assert summary["restored_bit_for_bit"] is True
    # the retry ran on the survivors and equals the reduction over the survivors
    assert summary["world_size"] == 2 and summary["survivors"] == ["peer-0", "peer-1"]
    assert summary["retry_max_abs_error"] <= summary["tolerance"]
    # recovery: the failure detector's timeout plus a little (generous for loaded machines)
    assert summary["recovery_seconds"] <= timeout + 3.0
    assert summary["ok"] is True


def test_hung_peer_is_dropped_by_the_heartbeat_timeout_not_a_socket_timeout() -> None:
    """A peer that stops (sockets stay open, no heartbeat) mid-operation: the failure detector
    removes it, the abort is pushed to the survivors, who restore and retry without it."""
    import threading
    import time

    import numpy as np

    from ringseed.collective import engine, retry
    from tests.component.collective import coordinator_helpers as h

    interval, timeout = 0.2, 1.5
    with h.running_coordinator(min_peers=3, interval=interval, timeout=timeout) as url:
        ghost_engine, ghost = h.join_ghost(url)
        comms = [h.make_peer(url, f"p{i}") for i in range(2)]
        try:
            h.on_each(comms, lambda i, c: c.connect(timeout=30))

            def ghost_begins_then_hangs() -> None:  # votes, joins the ring, then never sends a byte
                h.ghost_enters_ring(ghost, ghost_engine, nbytes=4096 * 8)

            ghost.call("POST", "/v1/heartbeat", {"peer_id": "ghost", "abort_seq": 0})
            hang = threading.Thread(target=ghost_begins_then_hangs, daemon=True)
            hang.start()
            arrays = [np.arange(4096, dtype=np.float64) * (i + 1) for i in range(2)]
            before = [a.copy() for a in arrays]
            start = time.monotonic()
            works = [c.all_reduce(a) for c, a in zip(comms, arrays, strict=True)]
            for w in works:
                try:
                    w.wait(30)
                    raise AssertionError("the operation completed although a peer hung")
                except engine.CollectiveAborted:
                    pass
            took = time.monotonic() - start
            assert took <= timeout + 2.0  # far below the 30 s socket timeout
            assert all(a.tobytes() == b.tobytes() for a, b in zip(arrays, before, strict=True))
            worlds = h.on_each(comms, lambda i, c: retry.all_reduce_with_retry(c, arrays[i]))
            assert worlds == [2, 2]
            for a in arrays:
                np.testing.assert_array_equal(a, before[0] + before[1])
            hang.join(10)
        finally:
            for c in comms:
                c.close()
            ghost_engine.close()


def test_peer_dying_before_its_end_vote_aborts_at_once_not_after_the_heartbeat_timeout() -> None:
    """The window a SIGKILL can hit where no ring socket is in use: the dead peer sent all its data
    but never reported its end, so the survivors wait for its vote. Its process closes its held
    heartbeat connection as it dies; the coordinator takes that as death, so the survivors' calls
    abort in milliseconds instead of after the heartbeat timeout (checked well below it)."""
    import concurrent.futures
    import json
    import socket
    import threading
    import time
    import urllib.parse

    import numpy as np
    import pytest

    from ringseed.collective import engine, retry
    from tests.component.collective import coordinator_helpers as h

    interval, timeout = 2.0, 6.0
    with h.running_coordinator(min_peers=3, interval=interval, timeout=timeout) as url:
        ghost_engine, ghost = h.join_ghost(url)
        comms = [h.make_peer(url, f"p{i}") for i in range(2)]
        heartbeat = socket.socket()
        try:
            h.on_each(comms, lambda i, c: c.connect(timeout=30))
            ghost_done = threading.Event()

            begun_tag: concurrent.futures.Future[int] = concurrent.futures.Future()

            def ghost_reduces_but_never_ends() -> None:
                begun = h.ghost_enters_ring(ghost, ghost_engine, nbytes=4096 * 8)
                begun_tag.set_result(begun["tag"])
                ghost_engine.all_reduce(np.full(4096, 100.0), op=engine.ReduceOp.SUM, tag=begun["tag"])
                ghost_done.set()

            runner = threading.Thread(target=ghost_reduces_but_never_ends, daemon=True)
            runner.start()
            arrays = [np.arange(4096, dtype=np.float64) * (i + 1) for i in range(2)]
            before = [a.copy() for a in arrays]
            works = [c.all_reduce(a) for c, a in zip(comms, arrays, strict=True)]
            assert ghost_done.wait(30)
            tag = begun_tag.result(30)
            # the coordinator now waits for the ghost's end vote only: the survivors reported theirs
            h.wait_for_status(url, lambda s: {"tag": tag, "waiting_for": ["ghost"]} in _waits(s))
            assert not any(w.done() for w in works)
            parsed = urllib.parse.urlsplit(url)  # a held heartbeat, as a live peer always has one
            heartbeat.connect((parsed.hostname, parsed.port))
            body = json.dumps({"peer_id": "ghost", "abort_seq": 0, "wait": interval}).encode()
            heartbeat.sendall(
                b"POST /v1/heartbeat HTTP/1.1\r\nHost: coordinator\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer "
                + h.TOKEN.encode()
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            h.wait_for_status(url, lambda s: "ghost" in s["held_heartbeats"])  # the coordinator holds it
            died = time.monotonic()  # the ghost's process dies: the kernel closes all
            heartbeat.close()
            ghost_engine.close()
            for w in works:
                with pytest.raises(engine.CollectiveAborted):
                    w.wait(30)
            took = time.monotonic() - died
            assert took < timeout / 3, f"abort {took:.3f} s after the death, heartbeat timeout {timeout} s"
            assert all(a.tobytes() == b.tobytes() for a, b in zip(arrays, before, strict=True))
            worlds = h.on_each(comms, lambda i, c: retry.all_reduce_with_retry(c, arrays[i]))
            assert worlds == [2, 2]
            for a in arrays:
                np.testing.assert_array_equal(a, before[0] + before[1])
            runner.join(10)
        finally:
            heartbeat.close()
            for c in comms:
                c.close()
            ghost_engine.close()


def test_set_ring_stops_waiting_on_abort_and_on_a_refused_connection() -> None:
    """Rebuilding the ring must not outlast the news that it cannot complete: ``abort()`` ends the
    wait for the predecessor at once, and so does a successor whose listener is gone."""
    import socket
    import threading
    import time

    import pytest

    from ringseed.collective import engine
    from tests.component.collective import coordinator_helpers as h

    a = engine.RingEngine(peer_id="a", token=h.TOKEN)
    b = engine.RingEngine(peer_id="b", token=h.TOKEN)  # listens, but never calls set_ring
    try:
        ring = [a.start(), b.start()]
        threading.Timer(0.3, a.abort, args=("the coordinator aborted the tag",)).start()
        start = time.monotonic()
        with pytest.raises(engine.CollectiveAborted, match="coordinator aborted"):
            a.set_ring(ring, epoch=1, timeout=20)
        assert time.monotonic() - start < 10  # not the 20 s setup timeout

        with socket.socket() as s:  # a port nobody listens on any more
            s.bind(("127.0.0.1", 0))
            gone = engine.PeerAddress(peer_id="gone", host="127.0.0.1", port=s.getsockname()[1])
        start = time.monotonic()
        with pytest.raises(engine.CollectiveAborted, match="refused"):
            a.set_ring([ring[0], gone], epoch=2, timeout=20)
        assert time.monotonic() - start < 10
    finally:
        a.close()
        b.close()


def _waits(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"tag": c["tag"], "waiting_for": c["waiting_for"]} for c in status["collectives"]]
