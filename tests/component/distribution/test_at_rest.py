"""Bytes at rest with real processes: a copy that rotted is found (on restart, on demand, in the
background), dropped, fetched again from peers and published again; names from outside are checked.

A flip that also moves the file's mtime is what a write does; one that keeps it (``os.utime``
back) is what bit rot or a careful intruder does: only hashing finds that one.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest


def flip(path: Path, *, keep_mtime: bool) -> None:
    """Flip one byte in the middle of ``path`` (a published model file)."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(before.st_size // 2)
        byte = f.read(1)
        f.seek(before.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def agent_call(local: swarm.LocalSwarm, name: str, method: str, path: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{local.agent_ports[name]}{path}",
        method=method,
        headers={"Authorization": f"Bearer {local.token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def wait_agent(local: swarm.LocalSwarm, name: str, predicate: Callable[[dict[str, Any]], bool], what: str) -> None:
    """Poll the agent's own ``/v1/status`` until ``predicate`` holds (an agent still starting is skipped)."""

    def check(_: dict[str, Any]) -> bool:
        try:
            return predicate(agent_call(local, name, "GET", "/v1/status"))
        except OSError:  # urllib's URLError too: not listening yet
            return False

    local.wait_for(check, timeout=120, what=what)


def _ready(tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm], **kwargs: Any) -> Any:
    root = make_model(tmp_path / "model", odd_sizes(8, files=3))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=3, chunk_size=MiB, **kwargs)
    local.start()
    local.wait_for(local.all_verified, timeout=120, what="3 verified copies")
    return local, expected


def test_a_flip_found_on_restart_is_repaired_from_peers_and_published_again(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    local, expected = _ready(tmp_path, swarm_factory)
    local.kill("node-1")
    flip(local.model_dir("node-1") / "shard-01.bin", keep_mtime=False)
    leftovers = [local.model_dir("node-1").with_name(f".model.{kind}-4242") for kind in ("tmp", "old")]
    for path in leftovers:
        path.mkdir()  # what a publish killed half-way leaves behind
    local.start_agent("node-1")
    wait_agent(local, "node-1", lambda s: s["check"]["bad"] >= 1 and s["verified_digest"], "node-1 repaired")
    status = local.wait_for(local.all_verified, timeout=60, what="all verified")
    assert_copies(local, expected)
    assert status["nodes"]["node-1"]["bytes_fetched"] <= 2 * MiB  # the bad chunk, not the model
    assert not any(path.exists() for path in leftovers)


def test_checks_on_demand_and_in_the_background_find_a_flip_that_kept_the_mtime(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    local, expected = _ready(tmp_path, swarm_factory, agent_args=["--scrub-rate", "0"])
    flip(local.model_dir("node-0") / "shard-02.bin", keep_mtime=True)
    assert agent_call(local, "node-0", "POST", "/v1/verify") == {"started": True}
    wait_agent(local, "node-0", lambda s: s["check"]["bad"] >= 1 and s["verified_digest"], "on-demand repair")
    local.kill("node-2")
    local.agent_args = ["--scrub-rate", "64Mi", "--scrub-after", "0.2"]
    local.start_agent("node-2")
    local.wait_for(lambda s: local.all_verified(s), timeout=60, what="node-2 back")
    flip(local.model_dir("node-2") / "shard-00.bin", keep_mtime=True)
    wait_agent(local, "node-2", lambda s: s["check"]["bad"] >= 1 and s["verified_digest"], "background repair")
    local.wait_for(local.all_verified, timeout=60, what="all verified")
    assert_copies(local, expected)


def test_local_distribute_rerun_repairs_a_corrupted_workdir(tmp_path: Path, ringseed_cmd: list[str]) -> None:
    root = make_model(tmp_path / "model", odd_sizes(4, files=2))
    argv = [*ringseed_cmd, "local", "distribute", str(root), "--nodes", "2", "--json", "--chunk-size", "1Mi"]
    argv += ["--workdir", str(tmp_path / "work"), "--timeout", "120"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert first.returncode == 0, first.stderr[-2000:]
    path = Path(json.loads(first.stdout)["nodes"]["node-1"]["path"])
    flip(path / "shard-00.bin", keep_mtime=False)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert second.returncode == 0, second.stderr[-2000:]
    result = json.loads(second.stdout)
    assert result["ok"] and all(node["verified"] for node in result["nodes"].values())
    assert (path / "shard-00.bin").read_bytes() == (root / "shard-00.bin").read_bytes()


def test_a_missing_source_is_a_named_problem_and_the_agent_stays_up(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    local = swarm_factory(source=(tmp_path / "gone").as_uri(), nodes=1, chunk_size=MiB)
    local.start()
    status = local.wait_for(
        lambda s: s["nodes"].get("node-0", {}).get("reason") == "OriginError", timeout=60, what="OriginError"
    )
    assert "no such file or directory" in status["nodes"]["node-0"]["message"]
    local.check_alive()
    make_model(tmp_path / "gone", odd_sizes(2, files=1))  # the source appears: the retry picks it up
    local.wait_for(local.all_verified, timeout=120, what="verified once the source exists")


@pytest.mark.parametrize(
    ("flag", "value", "problem"),
    [
        ("--model-name", "../x", "'..' is not a Kubernetes namespace name"),
        ("--model-name", "ns/../x", "must be NAMESPACE/NAME"),
        ("--model-name", "ns/.x", "lowercase letters"),
        ("--model-name", "Ns/x", "not a Kubernetes namespace name"),
        ("--node-name", "a b", "letters, digits"),
    ],
)
def test_names_from_the_command_line_are_checked(
    ringseed_cmd: list[str], tmp_path: Path, flag: str, value: str, problem: str
) -> None:
    argv = [*ringseed_cmd, "agent", "--master-url", "http://127.0.0.1:1", "--source", str(tmp_path)]
    argv += ["--model-name", "ns/m", "--data-dir", str(tmp_path / "d"), flag, value]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env=dict(os.environ, RINGSEED_TOKEN="t")
    )
    assert done.returncode == 2 and problem in done.stderr and flag in done.stderr, done.stderr
    assert not (tmp_path / "d").exists() and not (tmp_path / "x").exists()
