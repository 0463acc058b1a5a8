"""The coordinator over real HTTP on loopback, with real communicators and ring engines."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from ringseed.collective import control, engine
from tests.component.collective import coordinator_helpers as h


def _get(url: str, path: str, token: str = h.TOKEN) -> tuple[int, str]:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_wrong_token_gets_401() -> None:
    with h.running_coordinator() as url:
        status, body = _get(url, "/v1/status", token="wrong")
        assert status == 401 and json.loads(body)["error"] == "unauthorized"
        client = control.Client(url=url, token="wrong")
        with pytest.raises(control.CoordinatorError) as err:
            client.call("POST", "/v1/join", {"peer_id": "x", "host": "127.0.0.1", "port": 1})
        assert err.value.status == 401


def test_bad_body_names_the_field() -> None:
    with h.running_coordinator() as url:
        client = control.Client(url=url, token=h.TOKEN)
        with pytest.raises(control.CoordinatorError) as err:
            client.call("POST", "/v1/join", {"peer_id": "x", "host": "127.0.0.1", "port": "nope"})
        assert err.value.status == 400 and "port" in err.value.reason


def test_three_peers_all_reduce_and_status_shows_the_group() -> None:
    with h.running_coordinator(min_peers=3) as url, h.connected_peers(url, 3) as comms:
        arrays = [np.arange(1001, dtype=np.float32) * (i + 1) for i in range(3)]
        h.on_each(comms, lambda i, c: c.all_reduce(arrays[i]).wait(30))
        for a in arrays:
            np.testing.assert_array_equal(a, np.arange(1001, dtype=np.float32) * 6)
        status = json.loads(_get(url, "/v1/status")[1])
        assert status["role"] == "coordinator" and status["world_size"] == 3
        assert sorted(status["ring_order"]) == ["p0", "p1", "p2"] and status["phase"] == "Idle"
        assert status["last_all_reduce"]["bytes"] == 1001 * 4
        metrics = _get(url, "/metrics")[1]
        assert "ringseed_coordinator_world_size 3" in metrics


def test_broadcast_and_all_gather_through_the_communicator() -> None:
    with h.running_coordinator(min_peers=2) as url, h.connected_peers(url, 2) as comms:
        data = [np.full(5, i + 1, dtype=np.int64) for i in range(2)]
        h.on_each(comms, lambda i, c: c.broadcast(data[i], root=1).wait(30))
        root_value = int(comms[0].ring[1][1:]) + 1  # the peer at rank 1 ("pK" holds K + 1)
        assert all((d == root_value).all() for d in data)
        outs = [np.zeros(6, dtype=np.int64) for _ in range(2)]
        parts = [np.full(3, c.rank + 10, dtype=np.int64) for c in comms]
        h.on_each(comms, lambda i, c: c.all_gather(parts[i], outs[i]).wait(30))
        for out in outs:
            np.testing.assert_array_equal(out, [10, 10, 10, 11, 11, 11])


def test_a_reported_failure_aborts_everyone_and_restores_buffers() -> None:
    with h.running_coordinator(min_peers=2) as url, h.connected_peers(url, 2) as comms:
        h.on_each(comms, lambda i, c: c.all_reduce(np.ones(4)).wait(30))  # ring is up
        arrays = [np.arange(100, dtype=np.float64) + i for i in range(2)]
        before = [a.copy() for a in arrays]

        def run(i: int, c: object) -> str:
            comm = comms[i]
            if i == 1:  # this peer's engine fails mid-operation (as on a reset socket)
                comm._engine.abort("simulated socket reset")
            try:
                comm.all_reduce(arrays[i]).wait(30)
            except engine.CollectiveAborted as exc:
                return str(exc)
            return "completed"

        outcomes = h.on_each(comms, run)
        assert all("aborted" in o for o in outcomes)
        for a, b in zip(arrays, before, strict=True):
            assert a.tobytes() == b.tobytes()
        h.on_each(comms, lambda i, c: c.all_reduce(arrays[i]).wait(30))
        np.testing.assert_array_equal(arrays[0], before[0] + before[1])


def test_optimized_topology_round_returns_every_peer() -> None:
    with h.running_coordinator(min_peers=3, optimize=True) as url, h.connected_peers(url, 3) as comms:
        rings = h.on_each(comms, lambda i, c: c.update_topology())
        assert all(sorted(r) == ["p0", "p1", "p2"] for r in rings) and len({tuple(r) for r in rings}) == 1
        arrays = [np.ones(64, dtype=np.float32) for _ in range(3)]
        h.on_each(comms, lambda i, c: c.all_reduce(arrays[i]).wait(30))
        assert all((a == 3).all() for a in arrays)
