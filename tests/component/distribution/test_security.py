"""Tracker and peer endpoints: bearer token, body limits and schemas, JSON errors, no crash."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, make_model, odd_sizes


def _call(url: str, *, token: str, method: str = "GET", body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


BAD_REQUESTS = [
    ("POST", "/v1/register", b"{not json", 400),
    ("POST", "/v1/register", b"[1, 2]", 400),
    ("POST", "/v1/register", json.dumps({"node": "x"}).encode(), 400),
    ("POST", "/v1/register", json.dumps({"node": 5, "url": "u", "session": "s"}).encode(), 400),
    ("POST", "/v1/heartbeat", json.dumps({"node": "ghost"}).encode(), 404),
    ("POST", "/v1/heartbeat", json.dumps({"node": "node-0", "chunks": [["x", None]]}).encode(), 400),
    ("POST", "/v1/heartbeat", json.dumps({"node": "node-0", "chunks": [[0, "zz"]]}).encode(), 400),
    ("PUT", "/v1/manifest", json.dumps({"node": "node-0", "layout": {"chunk_size": 1}}).encode(), 400),
    ("POST", "/v1/origin/claim", json.dumps({"node": "node-0", "count": 0}).encode(), 400),
    ("GET", "/v1/peers?chunk=abc", None, 400),
    ("POST", "/v1/report", json.dumps({"node": "node-0", "peer": "node-0", "chunk": 0}).encode(), 400),
    ("POST", "/v1/register", b"{" + b" " * (17 * MiB) + b"}", 413),
]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("security")
    root = make_model(tmp / "model", odd_sizes(2, files=1))
    with swarm.LocalSwarm(source=root.as_uri(), nodes=1, workdir=tmp / "swarm", chunk_size=MiB) as local:
        local.start()
        local.wait_for(local.all_verified, timeout=60, what="one verified node")
        yield local


@pytest.mark.parametrize(("path", "method"), [("/v1/status", "GET"), ("/v1/register", "POST"), ("/metrics", "GET")])
def test_master_refuses_wrong_token(running: swarm.LocalSwarm, path: str, method: str) -> None:
    body_out = b"{}" if method == "POST" else None
    status, body = _call(running.master_url + path, token="wrong", method=method, body=body_out)
    assert status == 401 and body["error"] == "unauthorized" and body["reason"]


def test_agent_refuses_wrong_token(running: swarm.LocalSwarm) -> None:
    peers = _call(running.master_url + "/v1/peers?chunk=0&node=someone", token=running.token)[1]["peers"]
    status, body = _call(peers[0]["url"] + "/v1/chunks/0", token="wrong")
    assert status == 401 and body["reason"]
    status, body = _call(peers[0]["url"] + "/v1/chunks/99999", token=running.token)
    assert status == 404 and body["error"] == "not_held"


@pytest.mark.parametrize(("method", "path", "body", "expected"), BAD_REQUESTS)
def test_bad_requests_get_4xx_with_reason_and_nothing_crashes(
    running: swarm.LocalSwarm, method: str, path: str, body: bytes | None, expected: int
) -> None:
    status, answer = _call(running.master_url + path, token=running.token, method=method, body=body)
    assert status == expected, answer
    assert isinstance(answer, dict) and answer["error"] and answer["reason"]
    after = running.status()
    assert after is not None and after["nodes"]["node-0"]["verified"]
    running.check_alive()


def test_metrics_are_prometheus_text(running: swarm.LocalSwarm) -> None:
    headers = {"Authorization": f"Bearer {running.token}"}
    request = urllib.request.Request(running.master_url + "/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    assert "# TYPE ringseed_tracker_nodes_ready gauge" in text
    assert "ringseed_tracker_nodes_ready 1" in text
