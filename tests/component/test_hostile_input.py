"""Hostile input against the masters (issue 9, item 8): random JSON bodies never get a 500 and
always a JSON error naming the field; nothing a client sends breaks later requests (``/metrics``
above all); malformed HTTP costs a debug line, never an ERROR traceback.

The apps run in-process on loopback (``tests.component.served``); requests are plain sync HTTP.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringseed.master import coordinator, tracker
from ringseed.protocol import announcements, manifest, revision
from tests.component import served

TOKEN = "t0ken"
H = "ab" * 32
LAYOUT = {"version": 1, "chunk_size": 1 << 20, "files": [{"path": "m.bin", "size": 5 << 20, "mode": 0o644}]}
NODE = {"node": "node-a", "url": "http://127.0.0.1:1", "session": "s1"}
SOURCE = revision.Revision(layout=manifest.Layout.from_dict(LAYOUT)).to_dict()

# endpoint -> (method, path, a valid body, the field names a reason may name)
TRACKER_CALLS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "register": ("POST", "/v1/register", dict(NODE, chunks={"0": H}, layout=LAYOUT)),
    "heartbeat": (
        "POST",
        "/v1/heartbeat",
        {
            "node": "node-a",
            "load": 1,
            "counters": {"origin_bytes": 5, "fetched_bytes": 7, "uploaded_bytes": 0},
            "chunks": [[1, H, None], [2, None, "node-b"]],
            "runs": [[3, 2]],
            "sources": [[3, "node-b"]],
            "dropped": [3],
            "verified_digest": None,
            "since": 0,
            "epoch": "e",
            "problem": {"reason": "DiskFull", "message": "no space left"},
            "revision": "r1",
        },
    ),
    "manifest": (
        "PUT",
        "/v1/manifest",
        {"node": "node-a", "layout": LAYOUT, "chunk_hashes": [H] * 5, "revision": SOURCE, "replaces": SOURCE["id"]},
    ),
    "claim": ("POST", "/v1/origin/claim", {"node": "node-a", "count": 2}),
    "watch": ("POST", "/v1/watch", {"node": "node-a", "since": 0, "epoch": "e", "chunks": [1, 2], "wait": 0}),
    "report": ("POST", "/v1/report", {"node": "node-a", "peer": "node-b", "chunk": 0}),
}
TRACKER_FIELDS = {
    "node", "url", "session", "chunks", "layout", "load", "counters", "dropped", "verified_digest", "since",
    "epoch", "problem", "revision", "chunk_hashes", "count", "peer", "chunk", "reason", "message",
    "replaces", "wait", "runs", "sources",
}  # fmt: skip
COORDINATOR_CALLS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "join": ("POST", "/v1/join", {"peer_id": "p0", "host": "127.0.0.1", "port": 9000, "wait": 0}),
    "heartbeat": ("POST", "/v1/heartbeat", {"peer_id": "p0", "abort_seq": 0, "wait": 0}),
    "begin": ("POST", "/v1/collective/begin", {"peer_id": "p0", "op": "all_reduce", "nbytes": 64, "wait": 0}),
    "accept": ("POST", "/v1/vote/accept", {"peer_id": "p0", "wait": 0}),
    "sync": ("POST", "/v1/state/sync", {"peer_id": "p0", "revision": 1, "hashes": {"w": "ab"}, "wait": 0}),
    "bandwidth": ("POST", "/v1/bandwidth", {"peer_id": "p0", "row": {"p1": 1e9}, "wait": 0}),
    "end": ("POST", "/v1/collective/end", {"peer_id": "p0", "tag": 0, "ok": True, "reason": "", "wait": 0}),
}
COORDINATOR_FIELDS = {"peer_id", "host", "port", "wait", "abort_seq", "op", "nbytes", "revision", "hashes", "row"}
COORDINATOR_FIELDS |= {"tag", "ok", "reason", "round"}

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.sampled_from([-1, 0, 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**400])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", H, "node-b", "DiskFull", "0", "-1", "x" * 300])
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)


def bodies(calls: dict[str, tuple[str, str, dict[str, Any]]]) -> st.SearchStrategy[tuple[str, str, bytes]]:
    """(method, path, raw body): valid bodies with one field replaced, dropped or nested junk, or any JSON."""

    def mutated(call: tuple[str, str, dict[str, Any]]) -> st.SearchStrategy[tuple[str, str, bytes]]:
        method, path, valid = call
        keys = sorted(valid)
        replaced = st.tuples(st.sampled_from(keys), values).map(lambda kv: {**valid, kv[0]: kv[1]})
        removed = st.sampled_from(keys).map(lambda k: {n: v for n, v in valid.items() if n != k})
        body = st.one_of(replaced, removed, values, st.just(valid))
        raw = body.map(lambda b: json.dumps(b).encode())
        raw |= st.sampled_from([b"", b"{", b"NaN", b'{"node": NaN}', b'{"load": 1e999}', b"[" * 50000 + b"]" * 50000])
        return raw.map(lambda data: (method, path, data))

    return st.sampled_from(sorted(calls)).flatmap(lambda name: mutated(calls[name]))


def call(base: str, method: str, path: str, body: bytes | None = None, token: str = TOKEN) -> tuple[int, Any]:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw) if raw else None
    except ValueError:
        return response.status, raw.decode(errors="replace")


def assert_answer(status: int, answer: Any, fields: set[str]) -> None:
    assert status < 500, answer
    if status >= 400:
        assert isinstance(answer, dict) and answer.get("error") and answer.get("reason"), answer
        if answer["error"] in ("bad_field", "missing_field"):
            assert any(name in answer["reason"] for name in fields), answer


@pytest.fixture(scope="module")
def tracker_url() -> Iterator[str]:
    app = tracker.create_app(token=TOKEN, offline_after=3600.0, heartbeat_interval=1.0, seeders=1)
    with served.in_thread(app) as url:
        for name in ("node-a", "node-b"):
            assert (
                call(url, "POST", "/v1/register", json.dumps(dict(NODE, node=name, layout=LAYOUT)).encode())[0] == 200
            )
        yield url


@pytest.fixture(scope="module")
def coordinator_url() -> Iterator[str]:
    # Calls may be held (long polls): at most a heartbeat interval, or MAX_WAIT for rounds, which
    # random bodies ask for. Both are short here, so that a held call never outlasts the client.
    app = coordinator.create_app(
        token=TOKEN, heartbeat_interval=0.2, heartbeat_timeout=3600.0, optimize_topology=False, min_peers=1
    )
    with pytest.MonkeyPatch.context() as patch, served.in_thread(app) as url:
        patch.setattr(coordinator, "MAX_WAIT", 0.5)
        yield url


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=bodies(TRACKER_CALLS))
def test_tracker_answers_any_body_with_a_named_4xx_or_success(
    tracker_url: str, request: tuple[str, str, bytes]
) -> None:
    method, path, body = request
    assert_answer(*call(tracker_url, method, path, body), TRACKER_FIELDS)
    assert call(tracker_url, "GET", "/metrics")[0] == 200  # nothing it sent sticks


@settings(max_examples=100, deadline=None)
@given(chunk=st.text(max_size=30), node=st.text(max_size=30))
def test_tracker_peers_query_is_checked(tracker_url: str, chunk: str, node: str) -> None:
    from urllib.parse import urlencode

    status, answer = call(tracker_url, "GET", "/v1/peers?" + urlencode({"chunk": chunk, "node": node}))
    assert_answer(status, answer, {"chunk", "node"})


def test_tracker_still_serves_after_the_barrage(tracker_url: str) -> None:
    """After the property test in this module (same server): status, manifest, a valid heartbeat."""
    for path in ("/metrics", "/v1/status", "/v1/manifest"):
        status, answer = call(tracker_url, "GET", path)
        assert status == 200, answer
    body = {"node": "node-b", "counters": {"origin_bytes": 2**63 - 1, "fetched_bytes": 2**63 - 1}}
    assert call(tracker_url, "POST", "/v1/heartbeat", json.dumps(body).encode())[0] == 200
    status, text = call(tracker_url, "GET", "/metrics")
    assert status == 200 and "ringseed_tracker_bytes_from_origin" in text


def test_a_400_digit_counter_is_refused_and_metrics_stay_up(tracker_url: str) -> None:
    for value in (10**400, 2**63, -1, 1.5, "7", True):
        body = json.dumps({"node": "node-a", "counters": {"origin_bytes": value}}).encode()
        status, answer = call(tracker_url, "POST", "/v1/heartbeat", body)
        assert status == 400 and answer["error"] in ("bad_json", "bad_field"), answer
        assert "origin_bytes" in answer["reason"] or "integer" in answer["reason"], answer
        assert call(tracker_url, "GET", "/metrics")[0] == 200


def test_announced_sources_are_checked_whether_known_or_not(tracker_url: str) -> None:
    """Names the tracker knows skip the pattern match; anything else is matched (a list as a
    name used to raise inside the set lookup), and a long integer is refused in a body whose
    digests hold long runs of digits too."""
    digest = "1" * 64
    bad = ([0, None, ["node-a"]], [0, None, {"n": 1}], [0, None, "bad name"], [0, None, 7], [0, digest, "x" * 300])
    for item in bad:
        body = json.dumps({"node": "node-a", "chunks": [[0, None, "node-b"], item]}).encode()
        status, answer = call(tracker_url, "POST", "/v1/heartbeat", body)
        assert status == 400 and answer["error"] == "bad_field" and "chunks[1]" in answer["reason"], (item, answer)
    body = json.dumps({"node": "node-a", "chunks": [[0, None, "node-b"], [1, None, "never-registered"]]}).encode()
    assert call(tracker_url, "POST", "/v1/heartbeat", body)[0] == 200  # a well-formed name is fine
    body = json.dumps({"node": "node-a", "chunks": [[10**21, digest, None]]}).encode()
    status, answer = call(tracker_url, "POST", "/v1/heartbeat", body)
    assert status == 400 and answer["error"] == "bad_json" and "digits" in answer["reason"], answer


def test_announced_runs_and_sources_are_checked(tracker_url: str) -> None:
    """``runs`` are [first, count] with a positive count; ``sources`` [index, node name]."""
    bad_runs = ([0], [0, 0], [-1, 2], [0, "2"], [0, 1.5], [0, 1 << 40], {"0": 1})
    for run in bad_runs:
        body = json.dumps({"node": "node-a", "runs": [[0, 1], run]}).encode()
        status, answer = call(tracker_url, "POST", "/v1/heartbeat", body)
        assert status == 400 and answer["error"] == "bad_field" and "runs[1]" in answer["reason"], (run, answer)
    for source in ([0, None], [0, "bad name"], [0, 7], ["0", "node-b"], [0]):
        body = json.dumps({"node": "node-a", "runs": [[0, 1]], "sources": [[0, "node-b"], source]}).encode()
        status, answer = call(tracker_url, "POST", "/v1/heartbeat", body)
        assert status == 400 and answer["error"] == "bad_field" and "sources[1]" in answer["reason"], (source, answer)
    body = json.dumps({"node": "node-a", "runs": [[0, 1]], "sources": [[0, "node-b"]] * 257}).encode()
    status, answer = call(tracker_url, "POST", "/v1/heartbeat", body)
    assert status == 400 and "at most 256" in answer["reason"], answer
    body = json.dumps({"node": "node-a", "runs": [[0, 1], [3, 2]], "sources": [[0, "never-registered"]]}).encode()
    assert call(tracker_url, "POST", "/v1/heartbeat", body)[0] == 200


def test_a_node_that_asks_for_index_runs_gets_the_same_view_as_runs(tracker_url: str) -> None:
    plain = call(tracker_url, "POST", "/v1/heartbeat", json.dumps({"node": "node-b"}).encode())[1]
    body = json.dumps({"node": "node-b", "index_runs": True}).encode()
    status, runs = call(tracker_url, "POST", "/v1/heartbeat", body)
    assert status == 200 and runs["index_runs"] is True and "index_runs" not in plain
    assert announcements.expand(runs.get("pulling", [])) == plain.get("pulling", [])
    assert runs["availability"] == plain["availability"]  # (a snapshot's vector stays a vector)
    watch = {"node": "node-b", "since": None, "epoch": plain["epoch"], "wait": 0, "index_runs": True}
    status, answer = call(tracker_url, "POST", "/v1/watch", json.dumps(watch).encode())
    assert status == 200 and answer["index_runs"] is True


def test_problem_and_revision_reach_status_and_metrics(tracker_url: str) -> None:
    problem = {"reason": "DiskFull", "message": "staging\nhas   no space " + "x" * 1000}
    body = {"node": "node-b", "problem": problem, "revision": "abc123"}
    assert call(tracker_url, "POST", "/v1/heartbeat", json.dumps(body).encode())[0] == 200
    status = call(tracker_url, "GET", "/v1/status")[1]
    entry = status["nodes"]["node-b"]
    assert entry["reason"] == "DiskFull" and entry["revision"] == "abc123" and status["nodes_problem"] >= 1
    assert entry["message"].startswith("staging has no space x") and len(entry["message"]) == tracker.MAX_MESSAGE
    metrics = call(tracker_url, "GET", "/metrics")[1]
    assert 'ringseed_tracker_node_problem{node="node-b",reason="DiskFull"} 1' in metrics.splitlines()
    assert call(tracker_url, "POST", "/v1/heartbeat", json.dumps({"node": "node-b"}).encode())[0] == 200
    assert call(tracker_url, "GET", "/v1/status")[1]["nodes"]["node-b"]["reason"] == "DiskFull"  # left out: kept
    cleared = {"node": "node-b", "problem": None}
    assert call(tracker_url, "POST", "/v1/heartbeat", json.dumps(cleared).encode())[0] == 200
    assert call(tracker_url, "GET", "/v1/status")[1]["nodes"]["node-b"]["reason"] is None
    assert "node-b" not in call(tracker_url, "GET", "/metrics")[1].split("ringseed_tracker_node_problem")[-1]
    for bad in ({"reason": "disk full", "message": "m"}, {"reason": "DiskFull"}, "DiskFull"):
        answer = call(tracker_url, "POST", "/v1/heartbeat", json.dumps({"node": "node-b", "problem": bad}).encode())
        assert answer[0] == 400 and ("reason" in answer[1]["reason"] or "problem" in answer[1]["reason"]), answer


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=bodies(COORDINATOR_CALLS))
def test_coordinator_answers_any_body_with_a_named_4xx_or_success(
    coordinator_url: str, request: tuple[str, str, bytes]
) -> None:
    method, path, body = request
    assert_answer(*call(coordinator_url, method, path, body), COORDINATOR_FIELDS)
    assert call(coordinator_url, "GET", "/metrics")[0] == 200  # nothing it sent sticks


def test_coordinator_still_serves_after_the_barrage(coordinator_url: str) -> None:
    for path in ("/metrics", "/v1/status", "/v1/topology"):
        assert call(coordinator_url, "GET", path)[0] == 200
    join = {"peer_id": "late", "host": "127.0.0.1", "port": 9001, "wait": 0}
    assert call(coordinator_url, "POST", "/v1/join", json.dumps(join).encode())[0] == 200


def _raw(base: str, data: bytes) -> bytes:
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname or "", parts.port or 0), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while block := sock.recv(65536):
            chunks.append(block)
    return b"".join(chunks)


MALFORMED = [
    b"GET /v1/status HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE / NOPE\r\n\r\n",
    b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 20000 + b"\r\n\r\n",
    b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
]


@pytest.mark.parametrize("data", MALFORMED, ids=["bad-length", "garbage-second", "long-header", "bad-chunked"])
def test_malformed_http_costs_a_debug_line_not_an_error(
    tracker_url: str, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    answer = _raw(tracker_url, data)
    assert b" 400 Bad Request\r\n" in answer, answer[:300]
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == [], [(r.name, r.getMessage()) for r in errors]
    assert any(r.name == "ringseed.web" and r.levelno == logging.DEBUG for r in caplog.records)
    assert call(tracker_url, "GET", "/v1/status")[0] == 200
