"""What a custom resource's status says, computed from what its master reported. Pure: no I/O, no clock.

Owns the phase rules, the conditions (types and searchable reasons from ``ringseed.api.conditions``),
the figures shown by ``kubectl get`` (percent, throughput, ETA) and the detection of phase changes
that deserve a Kubernetes Event. Rules:
- The master's ``/v1/status`` JSON (docs/contracts.md, "Master status") is the only input about
  the live state; ``None`` means the master did not answer. Time comes in as ``now`` (an RFC 3339
  string) and ``unreachable_for`` (seconds).
- ModelDistribution, over the nodes its agent DaemonSet wants (``swarm``): Pending (tracker not
  reachable yet / no node wanted), Downloading (none ready), Distributing, Complete (every wanted
  node holds a verified copy of the current revision and the DaemonSet has rolled out), Degraded
  (a wanted node offline, a node stuck on a reason for ``degraded_after`` seconds, or the tracker
  unreachable that long after having answered; the condition names the nodes and reasons),
  Failed (invalid spec). ``status.nodes`` says per node what it holds and what is wrong.
- TrainingGroup: WaitingForModel, Starting (peers < minPeers), Running, Degraded (peers fell below
  minPeers after running, or the coordinator unreachable long after having answered), Failed.
- A condition keeps its ``lastTransitionTime`` while its status stays the same (``conditions.merge``).
- A status dict is a merge patch: figures the master did not report are left out (kept as they were);
  a master silent for less than ``degraded_after`` after answering changes nothing (empty patch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ringseed.api import conditions as cond
from ringseed.operator import swarm as swarm_module


@dataclass(frozen=True)
class Reach:
    """How the master answered this time: its report, or how long it has been silent."""

    report: Mapping[str, Any] | None
    unreachable_for: float | None = None  # seconds since its last answer; None: it never answered
    error: str | None = None  # why it did not answer (shown in messages)


@dataclass(frozen=True)
class Verdict:
    phase: str
    reason: str
    message: str


def human_bytes_per_second(value: float | None) -> str:
    if not value:
        return "0 B/s"
    for unit in ("B/s", "KiB/s", "MiB/s", "GiB/s"):
        if value < 1024 or unit == "GiB/s":
            return f"{value:.0f} {unit}" if unit == "B/s" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def md_percent(swarm: swarm_module.Swarm) -> int:
    """Share of the bytes that all wanted nodes must hold that they hold (verified or not), 0..100."""
    if swarm.total <= 0:
        return 0
    return min(100, sum(n.percent for n in swarm.nodes) // swarm.total)


def _silent(reach: Reach, *, degraded_after: float, role: str) -> Verdict | None:
    """The verdict when the master did not answer: Degraded when long silent after answering."""
    if reach.report is not None:
        return None
    detail = f": {reach.error}" if reach.error else ""
    if reach.unreachable_for is not None and reach.unreachable_for >= degraded_after:
        return Verdict(
            "Degraded",
            cond.REASON_MASTER_UNREACHABLE,
            f"The {role} has not answered for {reach.unreachable_for:.0f}s{detail}",
        )
    return Verdict("", cond.REASON_MASTER_UNREACHABLE, f"Waiting for the {role} to answer{detail}")


def brief_silence(reach: Reach, *, degraded_after: float) -> bool:
    """The master answered before and has been silent for less than ``degraded_after``: not news."""
    silent_for = reach.unreachable_for
    return reach.report is None and silent_for is not None and silent_for < degraded_after


def md_verdict(reach: Reach, *, swarm: swarm_module.Swarm | None, degraded_after: float) -> Verdict:
    silent = _silent(reach, degraded_after=degraded_after, role="tracker")
    if silent is not None:
        return silent if silent.phase else Verdict("Pending", silent.reason, silent.message)
    assert swarm is not None  # the tracker answered
    total, ready = swarm.total, swarm.ready
    if total == 0:
        where = "The agent DaemonSet selects no node" if swarm.known else "No agent has registered with the tracker"
        return Verdict("Pending", cond.REASON_NO_NODES, f"{where} yet")
    if swarm.complete:
        revision = f" (revision {swarm.revision})" if swarm.revision else ""
        return Verdict("Complete", cond.REASON_COMPLETE, f"The model{revision} is verified on all {total} nodes")
    failing = failing_nodes(swarm)
    if failing:
        reason = cond.REASON_NODES_FAILED if swarm.offline else cond.REASON_NODES_STUCK
        text = swarm_module.problems_text(failing)
        return Verdict("Degraded", reason, f"{len(failing)} of {total} nodes cannot get the model: {text}")
    if ready == 0:
        return Verdict("Downloading", cond.REASON_DOWNLOADING, f"Pulling from the origin; 0 of {total} nodes ready")
    if ready >= total and not (swarm.known and swarm.rolled_out):
        return Verdict("Distributing", cond.REASON_DISTRIBUTING, "Waiting for the agent DaemonSet to roll out")
    return Verdict("Distributing", cond.REASON_DISTRIBUTING, f"{ready} of {total} nodes ready")


def failing_nodes(swarm: swarm_module.Swarm) -> tuple[swarm_module.NodeView, ...]:
    """Wanted nodes that are offline or stuck, by name."""
    return tuple(n for n in swarm.nodes if n.stuck or n.reason == swarm_module.OFFLINE)


def waiting_for_model(*, model: str, found: bool, phase: str | None) -> Verdict:
    """The verdict of a TrainingGroup whose ModelDistribution is missing or not Complete yet."""
    if not found:
        return Verdict("WaitingForModel", cond.REASON_MODEL_NOT_FOUND, f"ModelDistribution {model} does not exist")
    return Verdict(
        "WaitingForModel",
        cond.REASON_MODEL_NOT_READY,
        f"ModelDistribution {model} is {phase or 'Pending'}, waiting for Complete",
    )


def tg_verdict(
    reach: Reach, *, min_peers: int, previous_phase: str | None, degraded_after: float, waiting: Verdict | None
) -> Verdict:
    if waiting is not None:
        return waiting
    silent = _silent(reach, degraded_after=degraded_after, role="coordinator")
    if silent is not None:
        return silent if silent.phase else Verdict("Starting", silent.reason, silent.message)
    peers = int((reach.report or {}).get("peers") or 0)
    if peers >= min_peers:
        return Verdict("Running", cond.REASON_PEERS_READY, f"{peers} peers in the group (minPeers {min_peers})")
    if previous_phase in ("Running", "Degraded"):
        return Verdict("Degraded", cond.REASON_PEERS_BELOW_MINIMUM, f"Only {peers} peers left, minPeers is {min_peers}")
    return Verdict("Starting", cond.REASON_STARTING, f"{peers} of at least {min_peers} peers joined")


def conditions_for(
    verdict: Verdict,
    *,
    done_phases: tuple[str, ...],
    now: str,
    generation: int | None,
    previous: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Ready / Progressing / Degraded / InvalidSpec (and WaitingForModel) for a verdict, merged into
    the previous list so that ``lastTransitionTime`` moves only when a status flips."""
    failed = verdict.phase == "Failed"
    ready = verdict.phase in done_phases
    flags = {
        cond.READY: ready,
        cond.PROGRESSING: not (ready or failed),
        cond.DEGRADED: verdict.phase == "Degraded",
    }
    result = [dict(c) for c in previous]
    for type_, flag in flags.items():
        result = cond.merge(result, _make(type_, flag, verdict.reason, verdict.message, now, generation))
    spec = (cond.REASON_SPEC_INVALID, verdict.message) if failed else (cond.REASON_SPEC_VALID, "The spec is valid")
    result = cond.merge(result, _make(cond.INVALID_SPEC, failed, *spec, now, generation))
    if verdict.phase == "WaitingForModel" or any(c.get("type") == cond.WAITING_FOR_MODEL for c in previous):
        waiting = verdict.phase == "WaitingForModel"
        reason = verdict.reason if waiting else cond.REASON_MODEL_READY
        message = verdict.message if waiting else "The model is verified on the selected nodes"
        result = cond.merge(result, _make(cond.WAITING_FOR_MODEL, waiting, reason, message, now, generation))
    return result


def _generation(generation: int | None, previous: Mapping[str, Any]) -> int | None:
    """The generation conditions speak of: the one just acted on, else the last observed."""
    if generation is not None:
        return generation
    observed = previous.get("observedGeneration")
    return int(observed) if observed is not None else None


def _make(type_: str, flag: bool, reason: str, message: str, now: str, generation: int | None) -> cond.Condition:
    return cond.make(
        type=type_,
        status=cond.TRUE if flag else cond.FALSE,
        reason=reason,
        message=message,
        now=now,
        generation=generation or 0,
    )


def swarm_for(
    report: Mapping[str, Any],
    *,
    agents: swarm_module.Agents | None,
    previous: Mapping[str, Any],
    now: str,
    degraded_after: float,
) -> swarm_module.Swarm:
    """The per-node view of a tracker report (``agents`` None: the DaemonSet's view is unknown)."""
    unknown = swarm_module.Agents(desired=None, nodes=None, rolled_out=False, pod_problems={})
    return swarm_module.swarm_of(
        report, agents or unknown, previous=previous.get("nodes") or [], now=now, stuck_after=degraded_after
    )


def md_status(
    *,
    reach: Reach,
    swarm: swarm_module.Swarm | None = None,
    generation: int | None,
    previous: Mapping[str, Any],
    now: str,
    degraded_after: float,
) -> dict[str, Any]:
    """The status merge patch of a ModelDistribution (empty during a brief silence of the tracker).

    ``swarm``: :func:`swarm_for` of the report (made here, without the DaemonSet's view, if None)."""
    if brief_silence(reach, degraded_after=degraded_after):
        return {}
    report = reach.report
    if report is not None and swarm is None:
        swarm = swarm_for(report, agents=None, previous=previous, now=now, degraded_after=degraded_after)
    verdict = md_verdict(reach, swarm=swarm, degraded_after=degraded_after)
    result: dict[str, Any] = {"phase": verdict.phase, "message": verdict.message}
    if report is not None and swarm is not None:
        result.update(
            {
                "totalBytes": int(report.get("total_bytes") or 0),
                "totalChunks": int(report.get("total_chunks") or 0),
                "nodesReady": swarm.ready,
                "nodesTotal": swarm.total,
                "nodesFailed": len(failing_nodes(swarm)),
                "bytesFromOrigin": int(report.get("bytes_from_origin") or 0),
                "percent": md_percent(swarm),
                "throughput": human_bytes_per_second(report.get("throughput_bps")),
                "eta": human_duration(report.get("eta_seconds")),
                "revision": swarm.revision,
                "nodes": swarm.listed(),
                "revisions": swarm.revisions(),
            }
        )
        if report.get("manifest_digest"):
            result["manifestDigest"] = report["manifest_digest"]
    return _with_conditions(
        result, verdict, done_phases=("Complete",), now=now, generation=generation, previous=previous
    )


def tg_status(
    *,
    reach: Reach,
    generation: int | None,
    previous: Mapping[str, Any],
    now: str,
    min_peers: int,
    degraded_after: float,
    waiting: Verdict | None,
) -> dict[str, Any]:
    """The status merge patch of a TrainingGroup; ``waiting`` when its model is not Complete yet
    (empty during a brief silence of the coordinator)."""
    if waiting is None and brief_silence(reach, degraded_after=degraded_after):
        return {}
    verdict = tg_verdict(
        reach, min_peers=min_peers, previous_phase=previous.get("phase"), degraded_after=degraded_after, waiting=waiting
    )
    result: dict[str, Any] = {"phase": verdict.phase, "message": verdict.message}
    report = reach.report
    if report is not None and waiting is None:
        last = report.get("last_all_reduce")
        result.update(
            {
                "peers": int(report.get("peers") or 0),
                "worldSize": int(report.get("world_size") or 0),
                "ringOrder": [str(p) for p in report.get("ring_order") or []],
                "collectivePhase": str(report.get("phase") or ""),
                "lastAllReduce": None
                if not last
                else {"bytes": int(last.get("bytes") or 0), "busbwGbps": float(last.get("busbw_gbps") or 0.0)},
            }
        )
    return _with_conditions(
        result, verdict, done_phases=("Running",), now=now, generation=generation, previous=previous
    )


def _with_conditions(
    result: dict[str, Any],
    verdict: Verdict,
    *,
    done_phases: tuple[str, ...],
    now: str,
    generation: int | None,
    previous: Mapping[str, Any],
) -> dict[str, Any]:
    """Add the conditions for ``verdict`` and ``observedGeneration`` to a status patch."""
    result["conditions"] = conditions_for(
        verdict,
        done_phases=done_phases,
        now=now,
        generation=_generation(generation, previous),
        previous=previous.get("conditions") or [],
    )
    if generation is not None:
        result["observedGeneration"] = generation
    return result


def invalid_status(
    *, field: str, problem: str, generation: int | None, previous: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """Phase Failed with an InvalidSpec condition naming the field and the problem."""
    verdict = Verdict("Failed", cond.REASON_SPEC_INVALID, f"{field}: {problem}")
    result: dict[str, Any] = {"phase": "Failed", "message": verdict.message}
    return _with_conditions(result, verdict, done_phases=(), now=now, generation=generation, previous=previous)


def phase_event(*, previous: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """``(type, reason, message)`` of the Event to post when the phase changed, else None.

    A resource's first phase is news only when it is a Warning (Failed): "Pending" right after a
    create says nothing ``kubectl get`` does not (and is one request per new resource saved)."""
    old, new = previous.get("phase"), current.get("phase")
    if not new or old == new:
        return None
    kind = "Warning" if new in ("Degraded", "Failed") else "Normal"
    if old is None and kind == "Normal":
        return None
    message = f"Phase changed from {old or 'none'} to {new}: {current.get('message', '')}".rstrip(": ")
    return kind, f"Phase{new}", message


MAX_NODE_EVENTS = 10  # per status update; a mass failure is summed up in the last one


def node_events(*, previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(type, reason, message)`` of a Warning Event for each node that became stuck (its reason
    held for ``degraded_after``) since the previous status; the reason is the node's own."""
    before = {str(n.get("name")): n for n in previous.get("nodes") or [] if isinstance(n, Mapping)}
    fresh = [
        n
        for n in current.get("nodes") or []
        if n.get("stuck")
        and not (before.get(n["name"], {}).get("stuck") and before[n["name"]].get("reason") == n["reason"])
    ]
    events = [
        ("Warning", str(n["reason"]), f"Node {n['name']}: {n.get('message') or n['reason']} (since {n.get('since')})")
        for n in fresh[:MAX_NODE_EVENTS]
    ]
    if len(fresh) > MAX_NODE_EVENTS:
        rest = ", ".join(sorted(str(n["name"]) for n in fresh[MAX_NODE_EVENTS:]))
        events[-1] = (events[-1][0], events[-1][1], f"{events[-1][2]}; also stuck: {rest}"[:1024])
    return events
