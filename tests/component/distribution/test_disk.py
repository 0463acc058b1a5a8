"""A full disk with real processes: fetching pauses with ``DiskFull``, what the node holds stays
what the tracker lists, and it resumes by itself when there is room (a real ENOSPC on a small
tmpfs, as root) or finishes once the budget allows (``--ssd-bytes``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest
from tests.component.distribution.test_at_rest import agent_call, wait_agent


def _reason(status: dict[str, Any], name: str) -> str | None:
    return status["nodes"].get(name, {}).get("reason")


def _listed_as_held(local: swarm.LocalSwarm, name: str) -> bool:
    """The tracker lists exactly the chunks the node holds (no holder of a dropped chunk)."""
    status = local.status()
    try:
        held = agent_call(local, name, "GET", "/v1/status")["chunks_held"]
    except OSError:
        return False
    return status is not None and status["nodes"][name]["chunks"] == held


def test_the_ssd_budget_pauses_fetching_with_disk_full_until_a_bigger_budget(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(8, files=2))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=3, chunk_size=MiB)
    local.start_master()
    for name in ("node-0", "node-2"):
        local.start_agent(name)
    local.agent_args = ["--ssd-bytes", "3Mi"]
    local.start_agent("node-1")
    status = local.wait_for(
        lambda s: _reason(s, "node-1") == "DiskFull" and local.all_verified(s, ["node-0", "node-2"]),
        timeout=120,
        what="node-1 DiskFull, the others verified",
    )
    assert "--ssd-bytes 3145728" in status["nodes"]["node-1"]["message"]
    assert not status["nodes"]["node-1"]["verified"]
    local.wait_for(lambda _: _listed_as_held(local, "node-1"), timeout=30, what="tracker lists what node-1 holds")
    local.kill("node-1")
    local.agent_args = ["--ssd-bytes", "64Mi"]
    local.start_agent("node-1")
    status = local.wait_for(local.all_verified, timeout=120, what="all verified with room")
    assert _reason(status, "node-1") is None
    assert_copies(local, expected)


def test_a_full_disk_pauses_fetching_and_it_resumes_when_space_returns(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm], small_disk: Path
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(8, files=2))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=2, chunk_size=MiB)
    (local.workdir / "nodes").mkdir(parents=True)
    os.symlink(small_disk, local.node_dir("node-1"))  # node-1's data and cache live on the small disk
    local.start()
    status = local.wait_for(
        lambda s: _reason(s, "node-1") == "DiskFull" and local.all_verified(s, ["node-0"]),
        timeout=120,
        what="node-1 DiskFull",
    )
    assert not status["nodes"]["node-1"]["verified"]
    wait_agent(local, "node-1", lambda s: s["writes_paused"] and 0 < s["chunks_held"] < 9, "node-1 paused")
    local.wait_for(lambda _: _listed_as_held(local, "node-1"), timeout=30, what="tracker lists what node-1 holds")
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    status = local.wait_for(local.all_verified, timeout=120, what="node-1 resumed by itself and verified")
    assert _reason(status, "node-1") is None
    assert_copies(local, expected)
