"""Source revisions with real processes: no stale copy, no mixed copy, bounded re-reads, reuse.

- A rerun after the source changed (bytes in place, size, write + rename) delivers the new bytes
  everywhere, and costs the origin and the peers only what changed.
- A source replaced while it is being pulled ends with every node holding one whole revision
  (the new one), never a mix.
- A source changed after every node is verified (nobody reads it then) is found by the origin-duty
  agent's periodic check and reaches every node.
- With a published manifest, a source overwritten mid-pull is re-read a bounded number of
  times, the nodes name the problem (``SourceChanged``), and a newly published manifest moves
  the swarm on.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest


def _overwrite_in_place(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(os.urandom(4096))


def _grow(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(os.urandom(MiB + 333))


def _replace(path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(os.urandom(path.stat().st_size))
    os.replace(tmp, path)


def _run(local: swarm.LocalSwarm, what: str) -> dict[str, Any]:
    try:
        local.start()
        return local.wait_for(local.all_verified, timeout=120, what=what)
    finally:
        local.close()


def _fetched(status: dict[str, Any]) -> dict[str, int]:
    return {name: int(node["bytes_fetched"]) for name, node in status["nodes"].items()}


@pytest.mark.parametrize("change", [_overwrite_in_place, _grow, _replace], ids=["in-place", "grown", "replaced"])
def test_rerun_after_the_source_changed_delivers_the_new_bytes_and_reuses_the_rest(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(16, files=4))
    kwargs: dict[str, Any] = {"source": root.as_uri(), "nodes": 3, "chunk_size": MiB, "workdir": tmp_path / "w"}
    first = _run(swarm.LocalSwarm(**kwargs), "first run verified")
    change(root / "shard-03.bin")  # the last shard: chunks before it keep their place in the stream
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm.LocalSwarm(**kwargs)
    second = _run(local, "second run verified")
    assert second["manifest_digest"] == expected.digest != first["manifest_digest"]
    assert second["revision"] != first["revision"] and second["revision_confirmed"]
    assert_copies(local, expected)
    changed = (root / "shard-03.bin").stat().st_size + 2 * MiB  # the file, plus the chunks on its edges
    assert second["bytes_from_origin"] <= changed, (second["bytes_from_origin"], changed)
    assert max(_fetched(second).values()) <= changed + second["bytes_from_origin"]


def test_cli_rerun_on_a_changed_source_reports_new_bytes_not_ok_with_old_ones(
    tmp_path: Path, ringseed_cmd: list[str]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(4, files=2))
    argv = [*ringseed_cmd, "local", "distribute", str(root), "--nodes", "2", "--json", "--chunk-size", "1Mi"]
    argv += ["--workdir", str(tmp_path / "work"), "--timeout", "120"]
    runs = []
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout))
        if len(runs) == 1:
            _overwrite_in_place(root / "shard-00.bin")
    assert runs[1]["manifest_digest"] == source_manifest(root, chunk_size=MiB).digest != runs[0]["manifest_digest"]
    assert all(node["verified"] for run in runs for node in run["nodes"].values())
    assert runs[1]["origin_bytes"] < runs[0]["origin_bytes"]  # only the changed part left the origin again


@pytest.mark.parametrize("change", [_overwrite_in_place, _replace], ids=["in-place", "replaced"])
def test_a_source_changed_after_every_node_is_verified_reaches_every_node(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm], change: Callable[[Path], None]
) -> None:
    """Nobody reads the source once every copy is verified: the agent on origin duty checks it
    (``--source-check-interval``) and moves the swarm to the new revision, reusing what matches."""
    root = make_model(tmp_path / "model", odd_sizes(8, files=2))
    local = swarm_factory(source=root.as_uri(), nodes=3, chunk_size=MiB, agent_args=["--source-check-interval", "1"])
    local.start()
    first = local.wait_for(local.all_verified, timeout=60, what="verified")
    change(root / "shard-01.bin")
    expected = source_manifest(root, chunk_size=MiB)
    status = local.wait_for(
        lambda s: s["manifest_digest"] == expected.digest and local.all_verified(s), timeout=60, what="the new bytes"
    )
    assert status["revision"] != first["revision"] and status["revision_confirmed"]
    assert_copies(local, expected)
    changed = (root / "shard-01.bin").stat().st_size + 2 * MiB  # the file, plus the chunks on its edges
    assert status["bytes_from_origin"] - first["bytes_from_origin"] <= changed


@pytest.mark.parametrize("change", [_replace, _overwrite_in_place], ids=["replaced", "in-place"])
def test_a_source_changed_mid_pull_ends_in_one_whole_revision(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm], change: Callable[[Path], None]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(24, files=3))
    local = swarm_factory(source=root.as_uri(), nodes=3, chunk_size=MiB, origin_rate_limit=8 * MiB)
    local.start()
    first = local.wait_for(lambda s: s["revision_confirmed"] and s["total_chunks"] > 0, timeout=60, what="revision")
    local.wait_for(
        lambda s: max(n["chunks"] for n in s["nodes"].values()) >= s["total_chunks"] // 3, timeout=60, what="a third"
    )
    for name in ("shard-00.bin", "shard-01.bin", "shard-02.bin"):  # early chunks are out: change all of them
        change(root / name)
    expected = source_manifest(root, chunk_size=MiB)
    status = local.wait_for(local.all_verified, timeout=120, what="verified after the change")
    assert status["revision"] != first["revision"]
    assert status["manifest_digest"] == expected.digest
    assert_copies(local, expected)


def test_a_manifest_source_overwritten_mid_pull_is_re_read_boundedly_and_named(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(16, files=2))
    published = tmp_path / "manifest.json"
    old = source_manifest(root, chunk_size=MiB)
    published.write_text(json.dumps(old.to_dict()))
    local = swarm_factory(
        source=root.as_uri(), nodes=3, chunk_size=MiB, origin_rate_limit=8 * MiB, manifest_uri=published.as_uri()
    )
    local.start()
    local.wait_for(lambda s: s["revision"] == old.digest and s["revision_confirmed"], timeout=60, what="manifest")
    _replace(root / "shard-01.bin")  # the second half of the model no longer matches the manifest
    changed = (root / "shard-01.bin").stat().st_size + MiB
    named = local.wait_for(
        lambda s: any(n["reason"] == "SourceChanged" for n in s["nodes"].values()), timeout=120, what="SourceChanged"
    )
    assert not any(n["verified"] for n in named["nodes"].values())
    assert named["bytes_from_origin"] <= old.layout.total_size + 3 * changed  # each bad chunk read at most 3 times
    new = source_manifest(root, chunk_size=MiB)
    published.write_text(json.dumps(new.to_dict()))  # the publisher catches up
    status = local.wait_for(local.all_verified, timeout=120, what="verified under the new manifest")
    assert status["manifest_digest"] == new.digest == status["revision"]
    assert_copies(local, new)
    assert status["bytes_from_origin"] <= old.layout.total_size + 4 * changed


def test_a_change_nobody_reads_is_taken_up_when_origin_duty_moves(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(8, files=2))
    local = swarm_factory(source=root.as_uri(), nodes=3, chunk_size=MiB, offline_after=3.0)
    local.start()
    first = local.wait_for(local.all_verified, timeout=120, what="3 verified copies")
    _replace(root / "shard-01.bin")  # complete: nobody reads the source, the revision stays pinned
    expected = source_manifest(root, chunk_size=MiB)
    duty = first["origin_duty"][0]
    local.kill(duty)  # the next holder takes the revision from the source as it gets the duty
    others = [n for n in local.names if n != duty]
    status = local.wait_for(
        lambda s: s["manifest_digest"] == expected.digest and local.all_verified(s, others),
        timeout=120,
        what="the others verified under the new revision",
    )
    assert status["revision"] != first["revision"] and status["revision_confirmed"]
    assert_copies(local, expected, others)
