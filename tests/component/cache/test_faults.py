"""Faults with real processes: SIGKILL the writer's node agent after the ack, SIGKILL the master leader mid-save."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringseed.fs import spec
from ringseed.local import cacheswarm
from tests.waiting import wait_for

MiB = 1 << 20


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[cacheswarm.CacheSwarm]:
    local = cacheswarm.CacheSwarm(nodes=3, workdir=tmp_path, chunk_size=8 * MiB, memory_bytes=128 * MiB)
    try:
        local.start()
        local.wait_ready(timeout=60)
        local.wait_follower(timeout=60)
        yield local
    finally:
        local.close()


def fs_on(local: cacheswarm.CacheSwarm, name: str) -> spec.RingseedFileSystem:
    env = local.env_for(name)
    return spec.RingseedFileSystem(socket=env["RINGSEED_CACHE_SOCKET"], token=env["RINGSEED_TOKEN"])


def test_local_checkpoint_restores_from_the_replica_after_the_writers_node_is_killed(ringseed_cmd: list[str]) -> None:
    done = subprocess.run(
        [*ringseed_cmd, "local", "checkpoint", "--nodes", "3", "--size", "40Mi", "--chunk-size", "8Mi", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["ok"] and result["bytes"] == 40 * MiB
    assert result["copies"] == ["node-0", "node-1"]
    assert result["restored_from"]["peer"] == 5 and result["restored_from"]["sink"] == 0


def test_killing_the_master_leader_mid_save_leaves_the_save_complete_on_the_new_leader(
    swarm: cacheswarm.CacheSwarm,
) -> None:
    fs = fs_on(swarm, "node-0")
    data = os.urandom(24 * MiB + 7)
    leader = swarm.leader()
    assert leader is not None
    with fs.open("step-5/model.pt", "wb") as f:
        f.write(data[: 12 * MiB])
        swarm.kill(f"master-{leader}", signal.SIGKILL)
        f.write(data[12 * MiB :])
    assert f.result is not None and f.result["copies"] == ["node-0", "node-1"]
    wait_for(lambda: swarm.leader() not in (None, leader), within=30, what="the other master leading")
    assert swarm.leader() == 1 - leader
    assert fs_on(swarm, "node-2").cat("step-5/model.pt") == data
    status = swarm.status()
    assert status is not None and status["last_checkpoint"]["name"] == "step-5"
