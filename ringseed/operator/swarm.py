"""Which nodes should hold a model, which hold it, and what keeps the others from it. Pure.

Owns the per-node truth of a ModelDistribution's status. Inputs: the agent DaemonSet and its pods
as the API server reports them (:func:`agents_of`), the tracker's ``/v1/status`` (docs/contracts.md,
"Master status", with the per-node ``reason``/``message``/``revision``), the previous status' node
list and the time. No I/O, no clock. Rules:
- The nodes that should hold the model are the DaemonSet's: ``desiredNumberScheduled`` is the
  total, the nodes its pods are bound to are the names. A node the tracker knows but the
  DaemonSet no longer wants (it left the selector, it was drained) is dropped, not counted as
  failed. When the pods are unknown (none listed, or no live one), the tracker's online nodes
  stand in for the names; the total is still the DaemonSet's.
- A node is ready when the tracker reports its copy verified and of the revision the swarm
  distributes (a copy of an older revision is ``StaleRevision``, never ready).
- A node that is not ready has a reason: the tracker's (``DigestMismatch``, ``DiskFull``, ...),
  else its agent pod's (``ImagePullBackOff``, ``CrashLoopBackOff``, ...), else ``Offline`` (no
  heartbeats), ``NotRegistered`` (no agent has registered from it) or ``StaleRevision``; a node
  still pulling without trouble has none. ``since`` is when the current reason first appeared (kept
  from the previous status while the reason stays); a reason older than ``stuck_after`` makes the
  node stuck.
- The status lists at most :data:`MAX_LISTED` nodes, those with a reason first; ``revisions``
  counts the nodes per revision over all of them.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_LISTED = 100

OFFLINE = "Offline"
NOT_REGISTERED = "NotRegistered"
STALE_REVISION = "StaleRevision"


@dataclass(frozen=True)
class Agents:
    """The agent DaemonSet as its controller reports it."""

    desired: int | None  # status.desiredNumberScheduled; None: the controller has not reported yet
    nodes: frozenset[str] | None  # nodes its live pods are bound to; None: the pods are unknown
    rolled_out: bool  # every scheduled pod runs the current template
    pod_problems: Mapping[str, tuple[str, str]]  # node -> (reason, message) of a waiting agent container


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool
    revision: str | None
    percent: int
    reason: str | None
    message: str | None
    since: str | None  # RFC 3339, when ``reason`` first appeared
    stuck: bool

    def to_status(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "ready": self.ready, "percent": self.percent}
        entry.update({k: v for k, v in (("revision", self.revision), ("reason", self.reason)) if v is not None})
        if self.reason is not None:
            entry.update(message=self.message or "", since=self.since, stuck=self.stuck)
        return entry


@dataclass(frozen=True)
class Swarm:
    total: int  # nodes that should hold the model
    known: bool  # the DaemonSet reported how many nodes it wants
    rolled_out: bool
    nodes: tuple[NodeView, ...]  # one per node that should hold the model (sorted by name)
    revision: str | None  # what the swarm distributes

    @property
    def ready(self) -> int:
        return sum(1 for n in self.nodes if n.ready)

    @property
    def offline(self) -> tuple[NodeView, ...]:
        return tuple(n for n in self.nodes if n.reason == OFFLINE)

    @property
    def stuck(self) -> tuple[NodeView, ...]:
        return tuple(n for n in self.nodes if n.stuck)

    @property
    def complete(self) -> bool:
        return self.known and self.rolled_out and self.total > 0 and self.ready >= self.total

    def listed(self) -> list[dict[str, Any]]:
        """The status' node list: nodes with a reason first, at most :data:`MAX_LISTED`."""
        ordered = sorted(self.nodes, key=lambda n: (n.reason is None, n.name))
        return [n.to_status() for n in ordered[:MAX_LISTED]]

    def revisions(self) -> list[dict[str, Any]]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            if node.revision is not None:
                counts[node.revision] = counts.get(node.revision, 0) + 1
        return [{"revision": r, "nodes": c} for r, c in sorted(counts.items(), key=lambda rc: (-rc[1], rc[0]))]


def agents_of(daemonset: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]] | None) -> Agents:
    """What the agent DaemonSet wants, from the DaemonSet and the pods it owns (``None``: unknown).

    The controller's counts are taken only once it has observed the DaemonSet's current generation
    (an ``observedGeneration`` behind ``generation`` speaks of the previous template)."""
    if daemonset is None:
        return Agents(desired=None, nodes=None, rolled_out=False, pod_problems={})
    ds_status = daemonset.get("status") or {}
    meta = daemonset.get("metadata") or {}
    generation, observed = meta.get("generation"), ds_status.get("observedGeneration")
    behind = generation is not None and observed is not None and int(observed) < int(generation)
    desired = None if behind or "desiredNumberScheduled" not in ds_status else int(ds_status["desiredNumberScheduled"])
    updated = ds_status.get("updatedNumberScheduled")
    rolled_out = desired is not None and (updated is None or int(updated) >= desired)
    if pods is None:
        return Agents(desired=desired, nodes=None, rolled_out=rolled_out, pod_problems={})
    live = [p for p in pods if _owned_by(p, meta.get("uid")) and _live_on_node(p)]
    problems = {str(p["spec"]["nodeName"]): w for p in live if (w := _waiting(p)) is not None}
    # No live pod at all tells nothing the count does not (none created yet, or an API that keeps
    # no pods): the names are then unknown, and the tracker's online nodes stand in.
    nodes = frozenset(str(p["spec"]["nodeName"]) for p in live) or None
    return Agents(desired=desired, nodes=nodes, rolled_out=rolled_out, pod_problems=problems)


def _owned_by(pod: Mapping[str, Any], uid: Any) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid for r in refs)


def _live_on_node(pod: Mapping[str, Any]) -> bool:
    """Bound to a node and not on its way out."""
    return bool((pod.get("spec") or {}).get("nodeName")) and not (pod.get("metadata") or {}).get("deletionTimestamp")


def _waiting(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The reason a container of the pod is waiting (ImagePullBackOff, CrashLoopBackOff, ...), if any."""
    pod_status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in pod_status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating", "PodInitializing"):
                text = waiting.get("message") or waiting["reason"]
                return str(waiting["reason"]), f"agent container {container.get('name')}: {text}"
    return None


def swarm_of(
    report: Mapping[str, Any],
    agents: Agents,
    *,
    previous: Sequence[Mapping[str, Any]],
    now: str,
    stuck_after: float,
) -> Swarm:
    """The per-node view of a tracker report against what the DaemonSet wants."""
    entries: Mapping[str, Any] = report.get("nodes") or {}
    if agents.nodes is not None:
        names = sorted(agents.nodes)
    else:
        names = sorted(n for n, e in entries.items() if isinstance(e, Mapping) and e.get("online", True))
    revision = report.get("revision")
    before = {str(p.get("name")): p for p in previous if isinstance(p, Mapping)}
    total_bytes = int(report.get("total_bytes") or 0)
    nodes = tuple(
        _view(
            name,
            entries.get(name),
            pod_problem=agents.pod_problems.get(name),
            revision=None if revision is None else str(revision),
            total_bytes=total_bytes,
            before=before.get(name),
            now=now,
            stuck_after=stuck_after,
        )
        for name in names
    )
    return Swarm(
        total=agents.desired if agents.desired is not None else len(names),
        known=agents.desired is not None,
        rolled_out=agents.rolled_out,
        nodes=nodes,
        revision=None if revision is None else str(revision),
    )


def _view(
    name: str,
    entry: Any,
    *,
    pod_problem: tuple[str, str] | None,
    revision: str | None,
    total_bytes: int,
    before: Mapping[str, Any] | None,
    now: str,
    stuck_after: float,
) -> NodeView:
    entry = entry if isinstance(entry, Mapping) else None
    held = None if entry is None or entry.get("revision") is None else str(entry["revision"])
    current = revision is None or held is None or held == revision
    ready = entry is not None and bool(entry.get("verified")) and current
    reason, message = (None, None) if ready else _problem(entry, pod_problem, held=held, revision=revision)
    since = None
    if reason is not None:
        kept = before is not None and before.get("reason") == reason and before.get("since")
        since = str(before["since"]) if kept and before is not None else now
    held_bytes = 0 if entry is None else min(int(entry.get("bytes") or 0), total_bytes)
    return NodeView(
        name=name,
        ready=ready,
        revision=held,
        percent=100 if ready else (held_bytes * 100 // total_bytes if total_bytes else 0),
        reason=reason,
        message=message,
        since=since,
        stuck=since is not None and seconds_between(since, now) >= stuck_after,
    )


def _problem(
    entry: Mapping[str, Any] | None, pod_problem: tuple[str, str] | None, *, held: str | None, revision: str | None
) -> tuple[str | None, str | None]:
    """Why a node is not ready: the tracker's reason, its pod's, or what the report shows."""
    if entry is not None and entry.get("reason"):
        return str(entry["reason"]), str(entry.get("message") or entry["reason"])
    if pod_problem is not None:
        return pod_problem
    if entry is None:
        return NOT_REGISTERED, "no agent on this node has registered with the tracker"
    if not entry.get("online", True):
        return OFFLINE, "the agent on this node stopped sending heartbeats"
    if entry.get("verified") and held is not None and revision is not None and held != revision:
        return STALE_REVISION, f"holds revision {held}; the source is at revision {revision}"
    return None, None


def seconds_between(earlier: str, later: str) -> float:
    """Seconds from one RFC 3339 time to another (``2026-01-01T00:00:00Z``)."""
    return (_parse(later) - _parse(earlier)).total_seconds()


def _parse(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def problems_text(nodes: Sequence[NodeView], *, limit: int = 5) -> str:
    """``node-2 DiskFull (no space left); node-5 Offline (...)``, at most ``limit`` nodes named."""
    parts = [f"{n.name} {n.reason} ({n.message})" for n in nodes[:limit]]
    more = len(nodes) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
