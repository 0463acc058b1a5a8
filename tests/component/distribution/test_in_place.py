"""Chunks received in place into staging, with real processes: the bytes of a chunk still arriving
sit in the staged file, yet nothing counts them as verified; a crash mid-receive leaves the chunk
missing after the restart, and it is fetched again."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringseed.agent import store
from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, source_manifest

STALLER = "tests.component.distribution.stalling_agent"


def _status(local: swarm.LocalSwarm, name: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{local.agent_ports[name]}/v1/status", headers={"Authorization": f"Bearer {local.token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_a_receiver_killed_mid_chunk_restarts_without_it_and_fetches_it_again(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", {"a.bin": 4 * MiB, "b.bin": 4 * MiB})  # every chunk in one file
    expected = source_manifest(root, chunk_size=MiB)
    stall = tmp_path / "stalled"
    local = swarm_factory(source=root.as_uri(), nodes=2, chunk_size=MiB)
    local.agent_args = ["--staging-writes", "in-place"]  # "auto" writes with O_DIRECT from a buffer on a disk
    local.start_master()
    local.start_agent("node-0", module=STALLER, env={"RINGSEED_TEST_STALL": str(stall)})
    local.wait_for(lambda s: local.all_verified(s, ["node-0"]), timeout=60, what="the staller holding the model")
    local.start_agent("node-1")
    local.wait_for(lambda s: stall.exists() and stall.read_text() != "", timeout=60, what="a chunk stalled mid-body")
    index = int(stall.read_text())
    (piece,) = expected.layout.pieces(index)
    staged = local.journal("node-1").parent / "files" / piece.path
    half = (root / piece.path).read_bytes()[piece.file_offset : piece.file_offset + piece.length // 2]

    def landed_half(_: dict[str, Any]) -> bool:
        with open(staged, "rb") as f:
            f.seek(piece.file_offset)
            return f.read(len(half)) == half

    in_place = store.fs_type(staged.parent) not in store.NO_IN_PLACE  # else received into a buffer
    if in_place:
        local.wait_for(landed_half, timeout=20, what="the first half of the stalled chunk in node-1's staged file")
    assert index not in store.read_journal(local.journal("node-1"))  # there, but not verified
    local.kill("node-1")
    assert index not in store.read_journal(local.journal("node-1"))
    local.start_agent("node-1")
    local.wait_for(lambda s: local.all_verified(s), timeout=60, what="node-1 verified after its restart")
    assert store.read_journal(local.journal("node-1")) == dict(enumerate(expected.chunk_hashes))
    assert _status(local, "node-1")["landed_chunks"] >= (1 if in_place else 0)  # the stalled one, again
    assert_copies(local, expected)
