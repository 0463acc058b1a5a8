"""Status computation: master report -> phase, figures, conditions, Events (no sockets)."""

from __future__ import annotations

from typing import Any

import pytest

from ringseed.api import conditions
from ringseed.operator import status, swarm

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def tracker(*, total: int, ready: int, failed: int = 0, held: int = 0, total_bytes: int = 1000) -> dict[str, Any]:
    """``total`` nodes n0.. of which the first ``ready`` are verified and the last ``failed`` offline."""
    nodes = {
        f"n{i}": {"bytes": total_bytes if i < ready else held, "verified": i < ready, "online": i < total - failed}
        for i in range(total)
    }
    return {
        "role": "tracker",
        "total_bytes": total_bytes,
        "total_chunks": 4,
        "nodes_total": total,
        "nodes_ready": ready,
        "nodes_failed": failed,
        "bytes_from_origin": 1000,
        "throughput_bps": 3 * 1024**3,
        "eta_seconds": 3725.0,
        "manifest_digest": None,
        "nodes": nodes,
    }


def agents(report: dict[str, Any] | None) -> swarm.Agents:
    """The agent DaemonSet wanting exactly the report's nodes, rolled out."""
    names = frozenset((report or {}).get("nodes") or {})
    return swarm.Agents(desired=len(names), nodes=names, rolled_out=True, pod_problems={})


def md(
    report: dict[str, Any] | None,
    *,
    silent_for: float | None = None,
    previous: Any = None,
    now: str = NOW,
    wanted: swarm.Agents | None = None,
) -> dict[str, Any]:
    view = None
    if report is not None:
        view = status.swarm_for(
            report, agents=wanted or agents(report), previous=previous or {}, now=now, degraded_after=60
        )
    return status.md_status(
        reach=status.Reach(report=report, unreachable_for=silent_for),
        swarm=view,
        generation=3,
        previous=previous or {},
        now=now,
        degraded_after=60,
    )


def cond(result: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in result["conditions"] if c["type"] == type_)


@pytest.mark.parametrize(
    ("report", "phase", "reason"),
    [
        (None, "Pending", conditions.REASON_MASTER_UNREACHABLE),
        (tracker(total=0, ready=0), "Pending", conditions.REASON_NO_NODES),
        (tracker(total=3, ready=0), "Downloading", conditions.REASON_DOWNLOADING),
        (tracker(total=3, ready=1), "Distributing", conditions.REASON_DISTRIBUTING),
        (tracker(total=3, ready=3), "Complete", conditions.REASON_COMPLETE),
        (tracker(total=3, ready=1, failed=1), "Degraded", conditions.REASON_NODES_FAILED),
    ],
)
def test_distribution_phase_and_reason(report: dict[str, Any] | None, phase: str, reason: str) -> None:
    result = md(report)
    assert result["phase"] == phase
    assert cond(result, conditions.READY)["reason"] == reason
    assert cond(result, conditions.READY)["status"] == ("True" if phase == "Complete" else "False")
    assert cond(result, conditions.DEGRADED)["status"] == ("True" if phase == "Degraded" else "False")
    assert cond(result, conditions.PROGRESSING)["status"] == ("False" if phase == "Complete" else "True")
    assert result["observedGeneration"] == 3


def test_distribution_figures_for_kubectl() -> None:
    result = md(tracker(total=4, ready=1, held=500))
    assert (result["nodesReady"], result["nodesTotal"], result["nodesFailed"]) == (1, 4, 0)
    assert result["percent"] == 62  # (1000 + 3 * 500) / 4000
    assert result["throughput"] == "3.0 GiB/s"
    assert result["eta"] == "1h02m"
    assert result["totalBytes"] == 1000 and result["totalChunks"] == 4 and result["bytesFromOrigin"] == 1000


def test_silence_is_degraded_only_after_a_while_and_keeps_figures() -> None:
    before = md(tracker(total=2, ready=2))
    assert md(None, silent_for=5, previous=before) == {}  # brief: nothing to say
    result = md(None, silent_for=61, previous=before)
    assert result["phase"] == "Degraded"
    assert cond(result, conditions.DEGRADED)["reason"] == conditions.REASON_MASTER_UNREACHABLE
    assert "nodesReady" not in result  # a merge patch: the last figures stay


def test_transition_time_moves_only_when_status_flips() -> None:
    first = md(tracker(total=2, ready=1))
    second = md(tracker(total=2, ready=1), previous=first, now=LATER)
    assert cond(second, conditions.PROGRESSING)["lastTransitionTime"] == NOW
    third = md(tracker(total=2, ready=2), previous=second, now=LATER)
    assert cond(third, conditions.READY)["lastTransitionTime"] == LATER
    assert cond(third, conditions.DEGRADED)["lastTransitionTime"] == NOW


def test_invalid_spec_names_field_and_problem() -> None:
    result = status.invalid_status(
        field="spec.seeders", problem="must be at least 1", generation=2, previous={}, now=NOW
    )
    assert result["phase"] == "Failed"
    invalid = cond(result, conditions.INVALID_SPEC)
    assert (invalid["status"], invalid["reason"]) == ("True", conditions.REASON_SPEC_INVALID)
    assert invalid["message"] == "spec.seeders: must be at least 1"
    healed = md(tracker(total=1, ready=0), previous=result)
    assert cond(healed, conditions.INVALID_SPEC)["status"] == "False"


def coordinator(peers: int) -> dict[str, Any]:
    return {
        "role": "coordinator",
        "peers": peers,
        "world_size": peers,
        "ring_order": [f"n{i}" for i in range(peers)],
        "last_all_reduce": None,
        "phase": "Idle",
    }


def tg(report: dict[str, Any] | None, *, previous: Any = None, waiting: status.Verdict | None = None) -> dict[str, Any]:
    return status.tg_status(
        reach=status.Reach(report=report),
        generation=None,
        previous=previous or {},
        now=NOW,
        min_peers=2,
        degraded_after=60,
        waiting=waiting,
    )


def test_group_phases() -> None:
    waiting = status.waiting_for_model(model="llama", found=True, phase="Distributing")
    result = tg(None, waiting=waiting)
    assert result["phase"] == "WaitingForModel"
    assert cond(result, conditions.WAITING_FOR_MODEL)["reason"] == conditions.REASON_MODEL_NOT_READY
    assert status.waiting_for_model(model="x", found=False, phase=None).reason == conditions.REASON_MODEL_NOT_FOUND
    assert tg(coordinator(1))["phase"] == "Starting"
    running = tg(coordinator(2), previous=result)
    assert running["phase"] == "Running"
    assert cond(running, conditions.WAITING_FOR_MODEL)["status"] == "False"
    dropped = tg(coordinator(1), previous=running)
    assert dropped["phase"] == "Degraded"
    assert cond(dropped, conditions.DEGRADED)["reason"] == conditions.REASON_PEERS_BELOW_MINIMUM


def test_phase_events() -> None:
    assert status.phase_event(previous={"phase": "Distributing"}, current={"phase": "Distributing"}) is None
    assert status.phase_event(previous={}, current={}) is None
    kind, reason, message = status.phase_event(
        previous={"phase": "Complete"},  # type: ignore[misc]
        current={"phase": "Degraded", "message": "2 of 3 nodes failed"},
    )
    assert (kind, reason) == ("Warning", "PhaseDegraded")
    assert message == "Phase changed from Complete to Degraded: 2 of 3 nodes failed"
    assert status.phase_event(previous={}, current={"phase": "Pending"}) is None  # the first phase: no news
    assert status.phase_event(previous={}, current={"phase": "Failed"})[:2] == ("Warning", "PhaseFailed")  # type: ignore[index]


@pytest.mark.parametrize(("seconds", "text"), [(None, "unknown"), (0, "0s"), (59.6, "1m00s"), (7322, "2h02m")])
def test_human_duration(seconds: float | None, text: str) -> None:
    assert status.human_duration(seconds) == text
