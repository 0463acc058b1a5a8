"""One bad node must not stall the swarm: a faulty receiver and a lying origin-duty agent, with
real agent processes (issue 9, item 6). The faults are the tests' own agent wrappers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringseed.agent import store
from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest

BAD_RAM = "tests.component.distribution.bad_ram_agent"
LIAR = "tests.component.distribution.lying_agent"


def _node(status: dict[str, Any], name: str) -> dict[str, Any]:
    entry: dict[str, Any] = status["nodes"].get(name, {})
    return entry


def test_a_faulty_receiver_stalls_nobody_late_joiners_included(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(24))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=7, chunk_size=MiB, origin_rate_limit=6 * MiB)
    bad, early, late = "node-1", ["node-0", "node-2", "node-3", "node-4"], ["node-5", "node-6"]
    local.start_master()
    local.start_agent("node-0")
    local.wait_for(lambda s: s["origin_duty"] == ["node-0"], timeout=60, what="node-0 on origin duty")
    local.start_agent(bad, module=BAD_RAM)  # registered second: first in line for the duty on the old rules
    for name in early[1:]:
        local.start_agent(name)
    local.wait_for(lambda s: local.all_verified(s, early), timeout=120, what="the early honest nodes verified")
    for name in late:
        local.start_agent(name)
    honest = early + late
    status = local.wait_for(
        lambda s: local.all_verified(s, honest) and _node(s, bad).get("discredited", False),
        timeout=120,
        what="every honest node verified, late joiners too, and the faulty receiver discredited",
    )
    assert not any(_node(status, n)["penalised"] for n in honest), status["nodes"]
    assert bad not in status["origin_duty"] and _node(status, bad)["bytes_from_origin"] == 0  # never held the duty
    assert not _node(status, bad)["verified"]
    assert status["bytes_from_origin"] <= 1.1 * expected.layout.total_size
    assert_copies(local, expected, honest)


def test_a_lying_origin_duty_agent_is_caught_and_its_chunks_pulled_by_another(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(24))
    expected = source_manifest(root, chunk_size=MiB)
    local = swarm_factory(source=root.as_uri(), nodes=4, chunk_size=MiB, origin_rate_limit=4 * MiB)
    liar, honest = "node-0", ["node-1", "node-2", "node-3"]
    local.start_master()
    local.start_agent(liar, module=LIAR)
    local.wait_for(lambda s: s["origin_duty"] == [liar], timeout=60, what="the liar on origin duty")
    for name in honest:
        local.start_agent(name)
    status = local.wait_for(lambda s: local.all_verified(s, honest), timeout=120, what="the honest nodes verified")
    assert _node(status, liar)["penalised"] and liar not in status["origin_duty"]
    assert status["origin_duty"] and status["origin_duty"][0] in honest
    # Only what the liar had pulled (or was pulling) when it was caught left the origin twice.
    assert status["bytes_from_origin"] <= 2.1 * expected.layout.total_size
    assert_copies(local, expected, honest)
    for name in honest:  # the flipped chunks (received in place where staging allows) never counted
        assert store.read_journal(local.journal(name)) == dict(enumerate(expected.chunk_hashes)), name
