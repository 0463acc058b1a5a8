"""Read-only views of the tracker state: the ``/v1/status`` body and per-node summaries.

Owns the status shape of the tracker role (docs/contracts.md, "Master status"). Pure: reads a
:class:`ringseed.protocol.tracker.Tracker` and the time it is given; never changes it.

Rules: ``complete`` comes from what the tracker knows a node holds (availability), ``verified``
from the node's own report that it materialised a model whose manifest digest equals the
tracker's, of the current revision, once that revision is confirmed from the source (a copy
cached from an older source never counts) and while the node holds every chunk.
``reason``/``message`` are the node's current blocking problem (null when it has
none), ``revision`` the source revision of the copy it holds; the top-level ``revision`` is the
one the swarm distributes (``revision_confirmed`` once the origin-duty node took it from the
source) and ``nodes_problem`` counts the nodes with a problem. ``penalised``
and ``discredited`` are the trust judgements (:mod:`ringseed.protocol.trust`). ``eta_seconds``
is the bytes still missing on online nodes over their summed throughput (null while unknown,
0 when nothing is missing). Departed (purged) nodes stay listed with ``online: false`` and count
as failed until they come back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringseed.protocol.tracker import NodeState, Tracker


def node_entry(tracker: Tracker, state: NodeState, *, online: bool) -> dict[str, Any]:
    """One node's line in the status."""
    total = tracker.layout.chunk_count if tracker.layout is not None else -1
    digest = tracker.digest
    held = tracker.holdings.held_count(state.name)
    complete = held == total
    current = tracker.confirmed and state.revision in (None, tracker.revision)
    return {
        "chunks": held,
        "bytes": state.have_bytes,
        "complete": complete,
        "verified": complete and current and digest is not None and state.verified_digest == digest,
        "online": online,
        "throughput_bps": round(state.throughput, 1) if online else 0.0,
        "origin_duty": state.name in tracker.duty,
        "penalised": state.name in tracker.penalised,
        "discredited": state.name in tracker.discredited,
        "bytes_fetched": state.fetched_bytes,
        "bytes_from_origin": state.origin_bytes,
        "reason": state.problem.reason if state.problem is not None else None,
        "message": state.problem.message if state.problem is not None else None,
        "revision": state.revision,
    }


def status(tracker: Tracker, *, now: float) -> dict[str, Any]:
    """The tracker role's ``/v1/status`` body."""
    layout = tracker.layout
    nodes = {name: node_entry(tracker, s, online=True) for name, s in sorted(tracker.nodes.items())}
    for name, entry in tracker.departed.items():
        nodes.setdefault(name, entry)
    total_bytes = layout.total_size if layout is not None else 0
    throughput = sum(e["throughput_bps"] for e in nodes.values() if e["online"])
    missing = sum(total_bytes - e["bytes"] for e in nodes.values() if e["online"])
    eta: float | None = None
    if layout is not None and nodes:
        eta = 0.0 if missing == 0 else (round(missing / throughput, 1) if throughput > 0 else None)
    origin = tracker.origin_bytes_gone + sum(s.origin_bytes for s in tracker.nodes.values())
    return {
        "role": "tracker",
        "total_bytes": total_bytes,
        "total_chunks": layout.chunk_count if layout is not None else 0,
        "hashes_known": tracker.hashes_known,
        "nodes_total": len(nodes),
        "nodes_ready": sum(1 for e in nodes.values() if e["verified"]),
        "nodes_failed": sum(1 for e in nodes.values() if not e["online"]),
        "bytes_from_origin": origin,
        "throughput_bps": round(throughput, 1),
        "eta_seconds": eta,
        "manifest_digest": tracker.digest,
        "revision": tracker.revision,
        "revision_confirmed": tracker.confirmed,
        "nodes_problem": sum(1 for e in nodes.values() if e["reason"] is not None),
        "origin_duty": list(tracker.duty),
        "nodes": nodes,
    }
