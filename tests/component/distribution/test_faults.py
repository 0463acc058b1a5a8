"""Failures during a transfer, with real processes: killed agents, a killed seeder, a killed master."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringseed.agent import store
from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest
from tests.component.origins import servers

RATE = 12 * MiB  # origin budget: the 48 MiB model takes about 4 s to leave the origin


def _chunks(status: dict[str, Any], name: str) -> int:
    return int(status["nodes"].get(name, {}).get("chunks", 0))


def _duty_holder(local: swarm.LocalSwarm) -> str:
    status = local.wait_for(lambda s: bool(s["origin_duty"]) and s["total_chunks"] > 0, timeout=60, what="origin duty")
    return str(status["origin_duty"][0])


def test_killed_agents_resume_without_refetching_verified_chunks(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(48))
    expected = source_manifest(root, chunk_size=MiB)
    total = expected.layout.chunk_count
    local = swarm_factory(source=root.as_uri(), nodes=5, chunk_size=MiB, origin_rate_limit=RATE, offline_after=3.0)
    local.start()
    duty = _duty_holder(local)
    victims = [n for n in local.names if n != duty][:2]
    local.wait_for(lambda s: all(_chunks(s, v) >= total * 0.3 for v in victims), timeout=120, what="victims at 30%")
    for victim in victims:
        local.kill(victim)
    survivors = [n for n in local.names if n not in victims]
    local.wait_for(lambda s: local.all_verified(s, survivors), timeout=120, what="survivors verified")
    journaled = {v: store.read_journal(local.journal(v)) for v in victims}
    assert all(0 < len(j) < total for j in journaled.values()), {v: len(j) for v, j in journaled.items()}
    for victim in victims:
        local.start_agent(victim)
    status = local.wait_for(local.all_verified, timeout=120, what="restarted agents verified")
    for victim in victims:
        kept = sum(expected.layout.chunk_length(i) for i in journaled[victim])
        fetched = status["nodes"][victim]["bytes_fetched"]
        assert fetched <= expected.layout.total_size - kept + 2 * MiB, (victim, fetched, kept)
    assert_copies(local, expected)


def test_killed_origin_duty_agent_hands_over_and_origin_is_read_about_once(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(48, files=6))
    expected = source_manifest(root, chunk_size=MiB)
    origin = servers.FlakyHTTPOrigin(root)
    with origin.in_thread() as url:
        local = swarm_factory(source=url, nodes=4, chunk_size=MiB, origin_rate_limit=RATE, offline_after=3.0)
        local.start()
        duty = _duty_holder(local)
        local.wait_for(lambda s: _chunks(s, duty) >= expected.layout.chunk_count * 0.4, timeout=120, what="40% out")
        local.kill(duty)
        others = [n for n in local.names if n != duty]
        status = local.wait_for(lambda s: local.all_verified(s, others), timeout=120, what="others verified")
        assert status["origin_duty"] and status["origin_duty"][0] != duty
        sent = origin.bytes_sent
    assert_copies(local, expected, others)
    assert sent <= 1.1 * expected.layout.total_size, sent / expected.layout.total_size


def test_per_node_copies_of_a_file_source_keep_one_revision_across_a_duty_handover(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    """Each node reads its own copy of the source (copied with its times, as ``cp -p`` or
    ``rsync -a`` do; or a bucket's FUSE mount, whose inode numbers are per mount): the copies'
    identities agree, so the node taking over origin duty goes on with the same revision instead
    of seeing a changed source, re-reading it and moving the swarm to a new revision."""
    root = make_model(tmp_path / "model", odd_sizes(48, files=6))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=4, chunk_size=MiB, origin_rate_limit=RATE, offline_after=3.0)
    local.start_master()
    for name in local.names:
        copy = shutil.copytree(root, tmp_path / "shares" / name)  # other inodes, the same mtimes
        local.source = copy.as_uri()
        local.start_agent(name)
    duty = _duty_holder(local)
    before = local.wait_for(lambda s: _chunks(s, duty) >= expected.layout.chunk_count * 0.4, timeout=120, what="40%")
    local.kill(duty)
    others = [n for n in local.names if n != duty]
    status = local.wait_for(lambda s: local.all_verified(s, others), timeout=120, what="others verified")
    assert status["origin_duty"] and status["origin_duty"][0] != duty
    assert status["revision"] == before["revision"], "the new duty holder saw another revision in its copy"
    assert_copies(local, expected, others)
    assert status["bytes_from_origin"] <= 1.1 * expected.layout.total_size, status["bytes_from_origin"]
    for name in others:
        assert status["nodes"][name]["bytes_fetched"] <= expected.layout.total_size + MiB, (name, status["nodes"][name])


def test_master_killed_and_restarted_mid_transfer(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(48))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=4, chunk_size=MiB, origin_rate_limit=RATE)
    local.start()
    local.wait_for(
        lambda s: max((_chunks(s, n) for n in local.names), default=0) >= expected.layout.chunk_count * 0.25,
        timeout=120,
        what="25% out",
    )
    local.kill("master")
    time.sleep(1.0)
    local.start_master()
    status = local.wait_for(local.all_verified, timeout=120, what="all verified after the master restart")
    assert status["manifest_digest"] == expected.digest
    assert_copies(local, expected)
    assert status["bytes_from_origin"] <= 1.1 * expected.layout.total_size
