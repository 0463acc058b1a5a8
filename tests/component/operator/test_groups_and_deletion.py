"""A TrainingGroup waits for its model; deleting resources removes children (and node data on request)."""

from __future__ import annotations

import asyncio
from typing import Any

from ringseed.api import conditions
from ringseed.operator import builders
from tests.component.operator.conftest import (
    MD_RES,
    NS,
    TG_RES,
    Operator,
    create,
    delete,
    get,
    model_distribution,
    patch,
    schedule_agents,
    tracker_report,
    training_group,
)
from tests.waiting import eventually

DAEMONSETS = "apps/v1/daemonsets"


def status_of(kmock: Any, resource: str, name: str) -> dict[str, Any]:
    return dict((get(kmock, resource, name) or {}).get("status") or {})


def phase_is(kmock: Any, resource: str, name: str, phase: str) -> dict[str, Any] | None:
    status = status_of(kmock, resource, name)
    return status if status.get("phase") == phase else None


async def test_training_group_waits_for_its_model(operator: Operator) -> None:
    kmock, fake = operator.kmock, operator.fake
    await create(kmock, MD_RES, model_distribution("llama"))
    await create(kmock, TG_RES, training_group("train", model="llama", min_peers=2))
    status = await eventually(lambda: phase_is(kmock, TG_RES, "train", "WaitingForModel"), what="WaitingForModel")
    waiting = next(c for c in status["conditions"] if c["type"] == conditions.WAITING_FOR_MODEL)
    assert (waiting["status"], waiting["reason"]) == ("True", "ModelNotReady")
    await schedule_agents(kmock, "llama", ["node-0", "node-1"])
    fake.reports[NS, "llama"] = tracker_report(total=2, ready=1, verified=("node-0",))
    await eventually(lambda: phase_is(kmock, MD_RES, "llama", "Distributing"), what="the model Distributing")
    await eventually(
        lambda: status_of(kmock, TG_RES, "train").get("message", "").endswith("Distributing, waiting for Complete"),
        what="the group still waiting",
    )
    assert get(kmock, DAEMONSETS, "train-worker") is None
    assert get(kmock, "apps/v1/deployments", "train-master") is None

    fake.reports[NS, "llama"] = tracker_report(total=2, ready=2, verified=("node-0", "node-1"))
    worker = await eventually(lambda: get(kmock, DAEMONSETS, "train-worker"), what="the worker DaemonSet")
    key, value = builders.model_node_label(namespace=NS, name="llama")
    assert worker["spec"]["template"]["spec"]["nodeSelector"][key] == value  # only nodes with a verified copy
    assert get(kmock, "apps/v1/deployments", "train-master") is not None
    await eventually(lambda: phase_is(kmock, TG_RES, "train", "Starting"), what="Starting")

    fake.reports[NS, "train"] = {
        "role": "coordinator",
        "peers": 2,
        "world_size": 2,
        "ring_order": ["node-0", "node-1"],
        "last_all_reduce": {"bytes": 1 << 20, "busbw_gbps": 1.5},
        "phase": "CollectiveRunning",
    }
    status = await eventually(lambda: phase_is(kmock, TG_RES, "train", "Running"), what="Running")
    assert (status["peers"], status["worldSize"], status["ringOrder"]) == (2, 2, ["node-0", "node-1"])
    assert status["lastAllReduce"] == {"bytes": 1 << 20, "busbwGbps": 1.5}
    fake.reports[NS, "train"] = {**fake.reports[NS, "train"], "peers": 1, "world_size": 1, "ring_order": ["node-0"]}
    status = await eventually(lambda: phase_is(kmock, TG_RES, "train", "Degraded"), what="Degraded below minPeers")
    assert next(c for c in status["conditions"] if c["type"] == "Degraded")["reason"] == "PeersBelowMinimum"


async def test_deleting_a_distribution_with_retain_keeps_node_data(operator: Operator) -> None:
    kmock, fake = operator.kmock, operator.fake
    kmock.objects["v1/nodes", None, "node-0"] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-0"}}
    await create(kmock, MD_RES, model_distribution("keep", retainPolicy="Retain"))
    await schedule_agents(kmock, "keep", ["node-0"])
    fake.reports[NS, "keep"] = tracker_report(total=1, ready=1, verified=("node-0",))
    key, _ = builders.model_node_label(namespace=NS, name="keep")
    await eventually(
        lambda: key in get(kmock, "v1/nodes", "node-0", None)["metadata"].get("labels", {}),  # type: ignore[index]
        what="node-0 labelled",
    )
    await delete(kmock, MD_RES, "keep")
    await eventually(lambda: get(kmock, MD_RES, "keep") is None, what="the resource gone (finalizer released)")
    for resource, name in (
        ("v1/secrets", "keep-token"),
        ("apps/v1/deployments", "keep-master"),
        ("v1/services", "keep-master"),
        (DAEMONSETS, "keep-agent"),
    ):
        assert get(kmock, resource, name) is None, name
    assert key not in get(kmock, "v1/nodes", "node-0", None)["metadata"].get("labels", {})  # type: ignore[index]
    assert not any(
        "/daemonsets" in str(r.url.path) and r.method.value == "POST" and b"keep-cleanup" in r.body for r in list(kmock)
    )


async def test_deleting_a_distribution_with_delete_cleans_node_data(operator: Operator) -> None:
    kmock = operator.kmock
    await create(kmock, MD_RES, model_distribution("wipe", retainPolicy="Delete"))
    await eventually(lambda: get(kmock, DAEMONSETS, "wipe-agent"), what="children")
    await delete(kmock, MD_RES, "wipe")
    cleanup = await eventually(lambda: get(kmock, DAEMONSETS, "wipe-cleanup"), what="the cleanup DaemonSet")
    assert cleanup["spec"]["template"]["spec"]["initContainers"]
    assert get(kmock, MD_RES, "wipe") is not None  # held by the finalizer while node data is removed
    # KMock has no DaemonSet controller: report the cleanup pods ready, as the controller would.
    await patch(kmock, DAEMONSETS, "wipe-cleanup", {"status": {"desiredNumberScheduled": 2, "numberReady": 2}})
    await eventually(lambda: get(kmock, MD_RES, "wipe") is None, what="the resource gone after cleanup")
    assert get(kmock, DAEMONSETS, "wipe-cleanup") is None
    assert get(kmock, DAEMONSETS, "wipe-agent") is None


async def test_deleting_a_training_group_removes_its_children(operator: Operator) -> None:
    kmock = operator.kmock
    await create(kmock, TG_RES, training_group("solo", min_peers=1))
    await eventually(lambda: get(kmock, DAEMONSETS, "solo-worker"), what="the worker DaemonSet")
    await delete(kmock, TG_RES, "solo")
    await eventually(lambda: get(kmock, TG_RES, "solo") is None, what="the group gone")
    for resource, name in (
        ("v1/secrets", "solo-token"),
        ("apps/v1/deployments", "solo-master"),
        ("v1/services", "solo-master"),
        (DAEMONSETS, "solo-worker"),
    ):
        assert get(kmock, resource, name) is None, name


IDENTITY = (
    ("v1/serviceaccounts", "ringseed-master"),
    ("rbac.authorization.k8s.io/v1/roles", "ringseed-master"),
    ("rbac.authorization.k8s.io/v1/rolebindings", "ringseed-master"),
)


async def test_the_masters_of_a_namespace_share_one_identity_until_its_last_resource_goes(operator: Operator) -> None:
    kmock = operator.kmock
    await asyncio.gather(*(create(kmock, MD_RES, model_distribution(name)) for name in ("one", "two")))
    for name in ("one", "two"):
        deployment = await eventually(lambda n=name: get(kmock, "apps/v1/deployments", f"{n}-master"), what=name)
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "ringseed-master"
    for resource, name in IDENTITY:
        await eventually(lambda r=resource, n=name: get(kmock, r, n), what=f"{resource} {name}")
    made = [r for r in list(kmock) if r.method.value == "POST" and str(r.url.path).endswith("/serviceaccounts")]
    assert len(made) == 1  # resources applied at once wait for one apply of the identity

    await delete(kmock, MD_RES, "one")
    await eventually(lambda: get(kmock, MD_RES, "one") is None, what="one gone")
    assert all(get(kmock, resource, name) is not None for resource, name in IDENTITY)  # "two" still runs as it

    await delete(kmock, MD_RES, "two")
    await eventually(lambda: get(kmock, MD_RES, "two") is None, what="two gone")
    for resource, name in IDENTITY:
        await eventually(lambda r=resource, n=name: get(kmock, r, n) is None, what=f"{resource} {name} deleted")

    await create(kmock, MD_RES, model_distribution("three"))  # the next resource makes it again
    for resource, name in IDENTITY:
        await eventually(lambda r=resource, n=name: get(kmock, r, n), what=f"{resource} {name} again")
