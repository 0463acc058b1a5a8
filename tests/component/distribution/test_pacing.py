"""Real agents heartbeat at the pace the tracker names (the rules: ``ringseed/protocol/pacing.py``)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest


def test_agents_take_the_pace_of_a_tracker_with_a_small_budget_and_still_complete(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(12, files=2))
    expected = source_manifest(root, chunk_size=MiB)
    # 4 agents at 2 heartbeats per second: every 2 s, early ones no sooner than 2 s apart
    local = swarm_factory(
        source=root.as_uri(),
        nodes=4,
        chunk_size=MiB,
        heartbeat_interval=0.25,
        # (4 nodes: every copy is at the front; no jitter: the exact pace is asserted)
        master_args=["--heartbeat-rate", "2", "--front-seats", "0", "--heartbeat-jitter", "0"],
    )
    local.start()
    status = local.wait_for(local.all_verified, timeout=180, what="4 verified copies")
    assert status["manifest_digest"] == expected.digest
    assert_copies(local, expected)
    paces = {}
    for name in local.names:
        request = urllib.request.Request(
            f"http://127.0.0.1:{local.agent_ports[name]}/v1/status", headers={"Authorization": f"Bearer {local.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            node = json.loads(response.read())
        paces[name] = (node["origin_duty"], node["pace"]["heartbeat_interval"], node["pace"]["early_gap"])
    duty = [name for name, (on_duty, _, _) in paces.items() if on_duty]
    assert len(duty) == 1 and paces[duty[0]][1:] == (2.0, 0.05)  # the duty node keeps the base gap
    assert all(pace == (False, 2.0, 2.0) for name, pace in paces.items() if name not in duty)
