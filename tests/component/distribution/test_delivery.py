"""Delivery to a swarm of real agent processes: bytes identical everywhere, origin read about once."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest


def test_eight_agents_receive_256mib_model_identical(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(256, files=5))
    expected = source_manifest(root, chunk_size=4 * MiB)
    local = swarm_factory(source=root.as_uri(), nodes=8, chunk_size=4 * MiB, memory_bytes=32 * MiB)
    local.start()
    status = local.wait_for(local.all_verified, timeout=240, what="8 verified copies")
    assert status["manifest_digest"] == expected.digest
    assert_copies(local, expected)
    assert status["bytes_from_origin"] <= 1.1 * expected.layout.total_size


def test_cli_json_reports_every_node(tmp_path: Path, ringseed_cmd: list[str]) -> None:
    root = make_model(tmp_path / "model", odd_sizes(6, files=2))
    argv = [*ringseed_cmd, "local", "distribute", str(root), "--nodes", "2", "--json"]
    argv += ["--workdir", str(tmp_path / "work"), "--chunk-size", "1Mi", "--timeout", "120"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["ok"] is True
    assert result["model_bytes"] == sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert result["origin_bytes"] >= result["model_bytes"]
    assert {"seconds", "lower_bound_seconds"} <= result.keys()
    assert set(result["nodes"]) == {"node-0", "node-1"}
    assert all(n["complete"] and n["verified"] for n in result["nodes"].values())
