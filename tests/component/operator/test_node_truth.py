"""Status that tells the truth, with the real operator (kopf) against KMock and a scripted tracker.

Complete counts the nodes the agent DaemonSet wants; a node's own failure shows in status.nodes,
as an Event and as Degraded once it has held; a source change is a new revision, and a copy of
the old one is never counted (or labelled) as verified.
"""

from __future__ import annotations

from typing import Any

from ringseed.api import conditions
from ringseed.operator import builders
from tests.component.operator.conftest import (
    MD_RES,
    NS,
    Operator,
    create,
    get,
    model_distribution,
    patch,
    schedule_agents,
)
from tests.waiting import eventually

NODES = ("node-0", "node-1", "node-2")


def status_of(kmock: Any, name: str) -> dict[str, Any]:
    return dict((get(kmock, MD_RES, name) or {}).get("status") or {})


def phase_is(kmock: Any, name: str, phase: str) -> dict[str, Any] | None:
    status = status_of(kmock, name)
    return status if status.get("phase") == phase else None


def entry(status: dict[str, Any], node: str) -> dict[str, Any]:
    return next(n for n in status["nodes"] if n["name"] == node)


def labelled(kmock: Any, name: str) -> set[str]:
    key, value = builders.model_node_label(namespace=NS, name=name)
    return {
        node
        for node in NODES
        if (get(kmock, "v1/nodes", node, None) or {}).get("metadata", {}).get("labels", {}).get(key) == value
    }


def warnings_about(kmock: Any, name: str) -> list[tuple[str, str]]:
    return [
        (obj["reason"], obj["message"])
        for (resource, _, _), obj in list(kmock.objects.items())
        if resource.plural == "events"
        and not obj.deleted
        and obj["involvedObject"]["name"] == name
        and obj["type"] == "Warning"
    ]


def tracker(nodes: dict[str, dict[str, Any]], *, revision: str = "r1") -> dict[str, Any]:
    """The tracker's /v1/status (contract: per node reason/message/revision, top-level revision)."""
    full = {
        name: {"chunks": 0, "bytes": 0, "complete": False, "verified": False, "online": True, "throughput_bps": 0.0}
        | {"reason": None, "message": None, "revision": None}
        | fields
        for name, fields in nodes.items()
    }
    return {
        "role": "tracker",
        "total_bytes": 1000,
        "total_chunks": 1,
        "nodes_total": len(full),
        "nodes_ready": sum(1 for n in full.values() if n["verified"]),
        "nodes_failed": sum(1 for n in full.values() if not n["online"]),
        "nodes_problem": sum(1 for n in full.values() if n["reason"]),
        "bytes_from_origin": 1000,
        "throughput_bps": 0.0,
        "eta_seconds": None,
        "manifest_digest": revision,
        "revision": revision,
        "nodes": full,
    }


def held(revision: str = "r1") -> dict[str, Any]:
    return {"bytes": 1000, "chunks": 1, "complete": True, "verified": True, "revision": revision}


async def add_nodes(kmock: Any) -> None:
    for node in NODES:
        kmock.objects["v1/nodes", None, node] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}


async def test_complete_counts_the_nodes_the_daemonset_wants_and_drops_those_that_left(operator: Operator) -> None:
    kmock, fake = operator.kmock, operator.fake
    await add_nodes(kmock)
    await create(kmock, MD_RES, model_distribution("llama"))
    await schedule_agents(kmock, "llama", NODES)
    # Two copies verified, the third node's agent still pulling: 2 of 3, whatever the tracker counts.
    fake.reports[NS, "llama"] = tracker({"node-0": held(), "node-1": held(), "node-2": {"bytes": 500}})
    status = await eventually(lambda: phase_is(kmock, "llama", "Distributing"), what="Distributing")
    assert (status["nodesReady"], status["nodesTotal"], status["percent"]) == (2, 3, 83)

    # node-2 leaves the DaemonSet (drained, or its label removed): its agent is gone from the tracker
    # (offline) and from the count; the two others are all there is to wait for.
    await schedule_agents(kmock, "llama", ["node-0", "node-1"])
    fake.reports[NS, "llama"] = tracker({"node-0": held(), "node-1": held(), "node-2": {"online": False}})
    status = await eventually(lambda: phase_is(kmock, "llama", "Complete"), what="Complete without node-2")
    assert (status["nodesReady"], status["nodesTotal"], status["nodesFailed"]) == (2, 2, 0)
    assert [n["name"] for n in status["nodes"]] == ["node-0", "node-1"]
    await eventually(lambda: labelled(kmock, "llama") == {"node-0", "node-1"}, what="node-0 and node-1 labelled")


async def test_a_registered_node_that_the_daemonset_wants_but_that_is_not_there_blocks_complete(
    operator: Operator,
) -> None:
    kmock, fake = operator.kmock, operator.fake
    await create(kmock, MD_RES, model_distribution("llama"))
    await schedule_agents(kmock, "llama", NODES)
    fake.reports[NS, "llama"] = tracker({"node-0": held(), "node-1": held()})  # node-2 never registered
    status = await eventually(
        lambda: (s := status_of(kmock, "llama")).get("nodesTotal") == 3 and s, what="the DaemonSet's count"
    )
    assert status["phase"] != "Complete" and entry(status, "node-2")["reason"] == "NotRegistered"
    # It stays so for longer than degraded-after (1 s here): Degraded, the node and reason named.
    status = await eventually(lambda: phase_is(kmock, "llama", "Degraded"), what="Degraded")
    degraded = next(c for c in status["conditions"] if c["type"] == conditions.DEGRADED)
    assert degraded["reason"] == conditions.REASON_NODES_STUCK and "node-2 NotRegistered" in degraded["message"]


async def test_a_nodes_own_failure_is_in_status_an_event_and_degraded_once_it_holds(operator: Operator) -> None:
    kmock, fake = operator.kmock, operator.fake
    await create(kmock, MD_RES, model_distribution("llama"))
    await schedule_agents(kmock, "llama", ["node-0", "node-1"])
    full = {"bytes": 400, "reason": "DiskFull", "message": "no space left on /var/lib/ringseed (needs 1.0 KiB)"}
    fake.reports[NS, "llama"] = tracker({"node-0": held(), "node-1": full})
    status = await eventually(
        lambda: (s := status_of(kmock, "llama")).get("nodes") and s["nodes"][0].get("reason") and s,
        what="node-1's reason in status",
    )
    first = entry(status, "node-1")
    assert (first["reason"], first["message"], first["ready"]) == ("DiskFull", full["message"], False)

    status = await eventually(lambda: phase_is(kmock, "llama", "Degraded"), what="Degraded once it held")
    assert entry(status, "node-1")["since"] == first["since"]  # the same episode
    degraded = next(c for c in status["conditions"] if c["type"] == conditions.DEGRADED)
    assert "node-1 DiskFull" in degraded["message"] and status["nodesFailed"] == 1
    [(reason, message)] = await eventually(
        lambda: [w for w in warnings_about(kmock, "llama") if w[0] == "DiskFull"], what="a DiskFull Event"
    )
    assert message.startswith("Node node-1: no space left")

    fake.reports[NS, "llama"] = tracker({"node-0": held(), "node-1": held()})  # space freed, copy finished
    status = await eventually(lambda: phase_is(kmock, "llama", "Complete"), what="Complete after the fix")
    assert all("reason" not in n for n in status["nodes"])
    assert [w for w in warnings_about(kmock, "llama") if w[0] == "DiskFull"] == [(reason, message)]  # one Event


async def test_a_source_change_is_a_new_revision_and_old_copies_never_count(operator: Operator) -> None:
    kmock, fake = operator.kmock, operator.fake
    await add_nodes(kmock)
    await create(kmock, MD_RES, model_distribution("llama", uri="s3://models/v1"))
    await schedule_agents(kmock, "llama", ["node-0", "node-1"])
    fake.reports[NS, "llama"] = tracker({"node-0": held("r1"), "node-1": held("r1")}, revision="r1")
    status = await eventually(lambda: phase_is(kmock, "llama", "Complete"), what="Complete at r1")
    assert status["revision"] == "r1" and [entry(status, n)["revision"] for n in ("node-0", "node-1")] == ["r1", "r1"]
    await eventually(lambda: labelled(kmock, "llama") == {"node-0", "node-1"}, what="both labelled")

    # The source changes. Until the DaemonSet controller has rolled the new template out, the
    # tracker's report (still all verified at r1) must not keep the status at Complete.
    await patch(kmock, MD_RES, "llama", {"spec": {"source": {"uri": "s3://models/v2"}}})
    await eventually(lambda: phase_is(kmock, "llama", "Distributing"), what="Distributing after the change")

    await schedule_agents(kmock, "llama", ["node-0", "node-1"])  # rolled out (observedGeneration 2)
    fake.reports[NS, "llama"] = tracker({"node-0": held("r2"), "node-1": held("r1")}, revision="r2")
    status = await eventually(
        lambda: (s := status_of(kmock, "llama")).get("revision") == "r2" and s, what="revision r2 in status"
    )
    assert status["phase"] == "Distributing" and status["nodesReady"] == 1
    stale = entry(status, "node-1")
    assert (stale["ready"], stale["revision"], stale["reason"]) == (False, "r1", "StaleRevision")
    assert status["revisions"] == [{"revision": "r1", "nodes": 1}, {"revision": "r2", "nodes": 1}]
    await eventually(lambda: labelled(kmock, "llama") == {"node-0"}, what="node-1 unlabelled (old copy)")

    fake.reports[NS, "llama"] = tracker({"node-0": held("r2"), "node-1": held("r2")}, revision="r2")
    await eventually(lambda: phase_is(kmock, "llama", "Complete"), what="Complete at r2")
    await eventually(lambda: labelled(kmock, "llama") == {"node-0", "node-1"}, what="both labelled again")
