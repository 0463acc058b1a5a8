"""The tracker over HTTP names each node's pace in registration and heartbeat replies, scaled
with the swarm (the rules: ``ringseed/protocol/pacing.py``, unit-tested with a fake clock)."""

from __future__ import annotations

import json

from ringseed.master import tracker
from tests.component import served
from tests.component.test_hostile_input import LAYOUT, TOKEN, call


def test_replies_name_a_pace_that_grows_with_the_swarm() -> None:
    app = tracker.create_app(
        token=TOKEN,
        offline_after=5.0,
        heartbeat_interval=1.0,
        seeders=1,
        heartbeat_rate=10.0,
        early_gap=0.05,
        heartbeat_jitter=0.0,  # (the jittered pace: below)
    )
    with served.in_thread(app) as url:
        paces = []
        for i in range(30):
            body = {"node": f"n{i}", "url": "http://127.0.0.1:1", "session": "s", "layout": LAYOUT}
            status, reply = call(url, "POST", "/v1/register", json.dumps(body).encode())
            assert status == 200, reply
            paces.append((reply["heartbeat_interval"], reply["early_gap"], reply["offline_after"]))
        assert paces[0] == (1.0, 0.05, 5.0)  # n0: alone, and on origin duty
        assert paces[5] == (1.0, 0.6, 5.0)  # six nodes at 10 heartbeats per second
        assert paces[29] == (3.0, 3.0, 9.0)  # thirty: every 3 s, offline after 3 intervals
        status, reply = call(url, "POST", "/v1/heartbeat", json.dumps({"node": "n7"}).encode())
        assert status == 200 and (reply["heartbeat_interval"], reply["early_gap"]) == (3.0, 3.0)
        status, reply = call(url, "POST", "/v1/heartbeat", json.dumps({"node": "n0"}).encode())
        assert status == 200 and (reply["heartbeat_interval"], reply["early_gap"]) == (3.0, 0.05)


def test_a_scaled_pace_is_jittered_by_default() -> None:
    app = tracker.create_app(
        token=TOKEN, offline_after=5.0, heartbeat_interval=1.0, seeders=1, heartbeat_rate=10.0, early_gap=0.05
    )
    with served.in_thread(app) as url:
        for i in range(30):
            body = {"node": f"n{i}", "url": "http://127.0.0.1:1", "session": "s", "layout": LAYOUT}
            status, reply = call(url, "POST", "/v1/register", json.dumps(body).encode())
            assert status == 200, reply
        told = set()
        for _ in range(20):
            status, reply = call(url, "POST", "/v1/heartbeat", json.dumps({"node": "n7"}).encode())
            assert status == 200
            assert 1.5 <= reply["early_gap"] == reply["heartbeat_interval"] <= 4.5  # 3 s nominal, +-50%
            told.add(reply["early_gap"])
        assert len(told) > 1
