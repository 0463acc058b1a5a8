"""Status that tells the truth: the nodes the agent DaemonSet wants, what each holds, why not."""

from __future__ import annotations

from typing import Any

import pytest

from ringseed.api import conditions
from ringseed.operator import status, swarm

T0, T30, T90, T100 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:30Z", "2026-01-01T00:01:30Z", "2026-01-01T00:01:40Z"
DS_UID = "ds-uid"


def node(*, verified: bool = False, online: bool = True, held: int = 0, **extra: Any) -> dict[str, Any]:
    return {"bytes": 1000 if verified else held, "verified": verified, "online": online, **extra}


def report(nodes: dict[str, dict[str, Any]], *, revision: str | None = "r1") -> dict[str, Any]:
    return {"role": "tracker", "total_bytes": 1000, "total_chunks": 1, "revision": revision, "nodes": nodes}


def wanted(*names: str, desired: int | None = None, rolled_out: bool = True, **problems: Any) -> swarm.Agents:
    return swarm.Agents(
        desired=len(names) if desired is None else desired,
        nodes=frozenset(names),
        rolled_out=rolled_out,
        pod_problems=problems,
    )


def md(tracker: dict[str, Any], agents: swarm.Agents, *, now: str = T0, previous: Any = None) -> dict[str, Any]:
    previous = previous or {}
    view = status.swarm_for(tracker, agents=agents, previous=previous, now=now, degraded_after=60)
    return status.md_status(
        reach=status.Reach(report=tracker), swarm=view, generation=1, previous=previous, now=now, degraded_after=60
    )


def cond(result: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in result["conditions"] if c["type"] == type_)


def listed(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in result["nodes"] if n["name"] == name)


def test_complete_needs_every_node_the_daemonset_wants_not_every_node_that_registered() -> None:
    tracker = report({"a": node(verified=True), "b": node(verified=True)})
    result = md(tracker, wanted("a", "b", "c"))  # c has an agent pod that has not registered
    assert (result["phase"], result["nodesReady"], result["nodesTotal"]) == ("Distributing", 2, 3)
    assert listed(result, "c")["reason"] == swarm.NOT_REGISTERED
    assert md(tracker, wanted("a", "b", desired=3))["phase"] == "Distributing"  # a pod not even created yet
    assert md(tracker, wanted("a", "b"))["phase"] == "Complete"


def test_nodes_that_left_are_dropped_from_the_count() -> None:
    tracker = report({"a": node(verified=True), "b": node(verified=True), "gone": node(online=False, held=300)})
    result = md(tracker, wanted("a", "b"))
    assert (result["phase"], result["nodesReady"], result["nodesTotal"], result["nodesFailed"]) == ("Complete", 2, 2, 0)
    assert [n["name"] for n in result["nodes"]] == ["a", "b"]


def test_a_wanted_node_offline_is_degraded_and_named() -> None:
    result = md(report({"a": node(verified=True), "b": node(online=False, held=300)}), wanted("a", "b"))
    assert (result["phase"], result["nodesFailed"]) == ("Degraded", 1)
    degraded = cond(result, conditions.DEGRADED)
    assert degraded["reason"] == conditions.REASON_NODES_FAILED
    assert "b Offline" in degraded["message"]


def test_a_node_stuck_on_its_own_failure_is_visible_at_once_and_degraded_after_a_while() -> None:
    tracker = report({"a": node(verified=True), "b": node(held=400, reason="DiskFull", message="no space left")})
    first = md(tracker, wanted("a", "b"), now=T0)
    entry = listed(first, "b")
    assert (entry["reason"], entry["message"], entry["since"], entry["stuck"]) == (
        "DiskFull",
        "no space left",
        T0,
        False,
    )
    assert first["phase"] == "Distributing" and first["nodes"][0]["name"] == "b"  # problems listed first
    assert status.node_events(previous={}, current=first) == []

    later = md(tracker, wanted("a", "b"), now=T90, previous=first)
    assert listed(later, "b")["since"] == T0 and listed(later, "b")["stuck"] is True
    assert later["phase"] == "Degraded" and later["nodesFailed"] == 1
    degraded = cond(later, conditions.DEGRADED)
    assert degraded["reason"] == conditions.REASON_NODES_STUCK
    assert "b DiskFull (no space left)" in degraded["message"]
    [(kind, reason, message)] = status.node_events(previous=first, current=later)
    assert (kind, reason) == ("Warning", "DiskFull") and message.startswith("Node b: no space left")
    again = md(tracker, wanted("a", "b"), now=T100, previous=later)
    assert status.node_events(previous=later, current=again) == []  # one Event per episode


def test_a_new_reason_starts_a_new_episode() -> None:
    first = md(report({"b": node(reason="DiskFull", message="full")}), wanted("b"), now=T0)
    second = md(
        report({"b": node(reason="DigestMismatch", message="bad chunk 3")}), wanted("b"), now=T30, previous=first
    )
    assert listed(second, "b")["since"] == T30 and listed(second, "b")["stuck"] is False


def test_a_source_change_is_a_new_revision_and_status_says_which_each_node_holds() -> None:
    tracker = report(
        {
            "a": node(verified=True, revision="r2"),
            "b": node(verified=True, revision="r1"),
            "c": node(held=500, revision="r2"),
        },
        revision="r2",
    )
    result = md(tracker, wanted("a", "b", "c"))
    assert result["revision"] == "r2"
    assert (listed(result, "a")["ready"], listed(result, "a")["revision"]) == (True, "r2")
    stale = listed(result, "b")
    assert (stale["ready"], stale["revision"], stale["reason"]) == (False, "r1", swarm.STALE_REVISION)
    assert result["revisions"] == [{"revision": "r2", "nodes": 2}, {"revision": "r1", "nodes": 1}]
    assert result["nodesReady"] == 1 and result["phase"] == "Distributing"


@pytest.mark.parametrize(
    "agents",
    [
        wanted("a", "b", rolled_out=False),  # a pod still runs the previous template
        swarm.Agents(desired=None, nodes=frozenset({"a", "b"}), rolled_out=False, pod_problems={}),  # not observed
    ],
)
def test_not_complete_until_the_daemonset_has_rolled_out(agents: swarm.Agents) -> None:
    result = md(report({"a": node(verified=True), "b": node(verified=True)}), agents)
    assert result["phase"] == "Distributing" and result["nodesReady"] == 2


def test_an_agent_pod_that_cannot_start_names_its_reason() -> None:
    problem = ("ImagePullBackOff", "agent container agent: Back-off pulling image ringseed:0.1.0")
    result = md(report({"a": node(verified=True)}), wanted("a", "b", b=problem))
    assert (listed(result, "b")["reason"], listed(result, "b")["message"]) == problem


def test_without_the_pods_the_trackers_online_nodes_stand_in() -> None:
    agents = swarm.Agents(desired=2, nodes=None, rolled_out=True, pod_problems={})
    tracker = report({"a": node(verified=True), "b": node(verified=True), "gone": node(online=False)})
    assert md(tracker, agents)["phase"] == "Complete"


def test_the_node_list_is_bounded_with_problems_first_and_revisions_count_all() -> None:
    nodes = {f"n{i:03d}": node(verified=True, revision="r1") for i in range(150)}
    nodes["n149"] = node(held=10, revision="r1", reason="WriteFailed", message="EIO")
    result = md(report(nodes), wanted(*nodes))
    assert len(result["nodes"]) == swarm.MAX_LISTED
    assert result["nodes"][0]["name"] == "n149"
    assert result["revisions"] == [{"revision": "r1", "nodes": 150}]


def _pod(name: str, node_name: str, *, owner: str = DS_UID, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "ownerReferences": [{"kind": "DaemonSet", "uid": owner}]}
    meta.update(extra.pop("metadata", {}))
    return {"metadata": meta, "spec": {"nodeName": node_name}, **extra}


def test_agents_of_reads_the_daemonset_controller_and_its_pods() -> None:
    daemonset = {
        "metadata": {"uid": DS_UID, "generation": 2},
        "status": {"observedGeneration": 2, "desiredNumberScheduled": 3, "updatedNumberScheduled": 3},
    }
    waiting = {"containerStatuses": [{"name": "agent", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
    pods = [
        _pod("x-agent-1", "a"),
        _pod("x-agent-2", "b", status=waiting),
        _pod("x-agent-3", "c", metadata={"deletionTimestamp": T0}),  # on its way out
        _pod("other", "d", owner="someone-else"),  # same labels, another owner
    ]
    agents = swarm.agents_of(daemonset, pods)
    assert (agents.desired, agents.nodes, agents.rolled_out) == (3, frozenset({"a", "b"}), True)
    assert agents.pod_problems == {"b": ("CrashLoopBackOff", "agent container agent: CrashLoopBackOff")}
    behind = {**daemonset, "status": {**daemonset["status"], "observedGeneration": 1}}
    assert swarm.agents_of(behind, pods).desired is None
    rolling = {**daemonset, "status": {**daemonset["status"], "updatedNumberScheduled": 2}}
    assert swarm.agents_of(rolling, pods).rolled_out is False
    assert swarm.agents_of(daemonset, None).nodes is None
    assert swarm.agents_of(daemonset, []).nodes is None  # no pod at all: names unknown, count known
    assert swarm.agents_of(daemonset, []).desired == 3
    assert swarm.agents_of(None, pods) == swarm.Agents(desired=None, nodes=None, rolled_out=False, pod_problems={})
