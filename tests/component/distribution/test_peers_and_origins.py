"""A lying peer, a misbehaving HTTP origin and an S3 origin, end to end through agent processes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest
from tests.component.origins import servers


def test_peer_serving_corrupted_bytes_is_detected_and_avoided(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(32))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=5, chunk_size=MiB, origin_rate_limit=8 * MiB)
    local.start_master()
    local.start_agent("node-0")  # first to register: it takes origin duty, the liar must not
    local.wait_for(lambda s: s["origin_duty"] == ["node-0"], timeout=60, what="node-0 on origin duty")
    liar, honest = "node-4", ["node-1", "node-2", "node-3"]
    local.start_agent(liar, module="tests.component.distribution.lying_agent")
    # The liar downloads honestly; once it holds every chunk, it and node-0 are the only holders when
    # the honest nodes start, and the tracker hands out the least-loaded holder (a hand-out counts as
    # load), so the liar is handed out from the honest nodes' first requests: it really serves bytes.
    local.wait_for(lambda s: s["nodes"].get(liar, {}).get("complete", False), timeout=120, what="the liar complete")
    for name in honest:
        local.start_agent(name)
    local.wait_for(local.all_verified, timeout=120, what="all verified")
    # the tracker judges reports in its periodic pass, which may come after the last node verified
    status = local.wait_for(lambda s: s["nodes"][liar]["penalised"] is True, timeout=30, what="the liar penalised")
    assert not any(e["penalised"] for n, e in status["nodes"].items() if n != liar)
    assert_copies(local, expected)  # no node's final model holds the corrupted bytes
    # Detected and avoided: each honest node counts every chunk that failed verification
    # (``agent_chunks_rejected``). After its first detection it never asks the liar again, and the
    # tracker hands the liar out to nobody, so a node can only have received corrupted bytes on the
    # requests already in flight then: at most its download slots (the agents run with the default
    # 4). Without avoidance the liar, one of the two least-loaded holders, would serve about half
    # of the 32 chunks to each honest node.
    detected = {name: _metric(local, name, "ringseed_agent_chunks_rejected") for name in honest}
    assert sum(detected.values()) >= 1, detected
    assert all(n <= 4 for n in detected.values()), detected


def _metric(local: swarm.LocalSwarm, name: str, metric: str) -> float:
    metrics = local.agent_metrics(name)
    assert metrics is not None, f"{name} does not answer /metrics"
    return metrics[metric]


def test_http_origin_with_500s_resets_and_truncated_bodies(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(8, files=3))
    expected = source_manifest(root, chunk_size=MiB)
    faults = [servers.Fault.ERROR_500, servers.Fault.RESET, servers.Fault.TRUNCATE, servers.Fault.ERROR_503]
    origin = servers.FlakyHTTPOrigin(root, faults=faults * 2)
    with origin.in_thread() as url:
        local = swarm_factory(source=url, nodes=3, chunk_size=MiB)
        local.start()
        local.wait_for(local.all_verified, timeout=120, what="all verified despite origin faults")
    assert origin.injected == faults * 2
    assert_copies(local, expected)


@pytest.fixture
def moto_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with servers.moto_s3() as endpoint:
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in servers.s3_env(endpoint).items():
            monkeypatch.setenv(name, value)  # the agent processes inherit it
        yield endpoint


def test_s3_origin_on_moto(tmp_path: Path, moto_env: str, swarm_factory: Callable[..., swarm.LocalSwarm]) -> None:
    root = make_model(tmp_path / "model", odd_sizes(8, files=3))
    expected = source_manifest(root, chunk_size=MiB)
    objects = {f"models/m1/{p.relative_to(root).as_posix()}": p.read_bytes() for p in root.rglob("*") if p.is_file()}
    servers.put_objects(moto_env, "weights", objects)
    local = swarm_factory(source="s3://weights/models/m1/", nodes=3, chunk_size=MiB)
    local.start()
    status = local.wait_for(local.all_verified, timeout=120, what="all verified from S3")
    assert status["manifest_digest"] == expected.digest
    assert_copies(local, expected)


def test_published_manifest_supplies_every_hash(tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]) -> None:
    root = make_model(tmp_path / "model", odd_sizes(8, files=3))
    expected = source_manifest(root, chunk_size=MiB)
    published = tmp_path / "manifest.json"
    published.write_text(json.dumps(expected.to_dict()))
    local = swarm_factory(source=root.as_uri(), nodes=3, chunk_size=2 * MiB, manifest_uri=published.as_uri())
    local.start()
    first = local.wait_for(lambda s: s["total_chunks"] > 0, timeout=60, what="layout")
    assert first["hashes_known"] == expected.layout.chunk_count  # all at once, not chunk by chunk
    status = local.wait_for(local.all_verified, timeout=120, what="all verified")
    assert status["manifest_digest"] == expected.digest  # the manifest's chunk size wins over --chunk-size
    assert_copies(local, expected)


def test_model_with_unexpected_digest_is_never_published(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(4, files=2))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=2, chunk_size=MiB)
    local.start_master()
    local.start_agent("node-0", env={"RINGSEED_EXPECTED_DIGEST": expected.digest})
    local.start_agent("node-1", env={"RINGSEED_EXPECTED_DIGEST": "0" * 64})
    # node-1 holds every chunk, finds the model's digest is not the expected one and says so: its
    # decision is made (a problem in its heartbeat), so what it published can be checked now.
    status = local.wait_for(
        lambda s: local.all_verified(s, ["node-0"]) and s["nodes"].get("node-1", {}).get("reason") == "DigestMismatch",
        timeout=120,
        what="node-0 verified and node-1 reporting DigestMismatch",
    )
    assert status["nodes"]["node-1"]["complete"] and not status["nodes"]["node-1"]["verified"]
    assert "not the expected 0000000000000000" in status["nodes"]["node-1"]["message"]
    assert not local.model_dir("node-1").exists()
    assert_copies(local, expected, ["node-0"])
