"""A ModelDistribution yields its children; spec changes patch them; an unchanged spec sends nothing."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import pytest

from bench import kmock_lean
from ringseed.api import constants
from tests.component.operator.conftest import MD_RES, NS, Operator, create, delete, get, model_distribution, patch
from tests.waiting import eventually

SECRETS, DEPLOYMENTS, SERVICES, DAEMONSETS = "v1/secrets", "apps/v1/deployments", "v1/services", "apps/v1/daemonsets"
MONITORS = "monitoring.coreos.com/v1/podmonitors"


def children(kmock: Any, name: str) -> dict[str, dict[str, Any] | None]:
    return {
        "secret": get(kmock, SECRETS, f"{name}-token"),
        "deployment": get(kmock, DEPLOYMENTS, f"{name}-master"),
        "service": get(kmock, SERVICES, f"{name}-master"),
        "daemonset": get(kmock, DAEMONSETS, f"{name}-agent"),
    }


def status_of(kmock: Any, name: str) -> dict[str, Any]:
    return dict((get(kmock, MD_RES, name) or {}).get("status") or {})


def status_for(kmock: Any, name: str, *, generation: int) -> dict[str, Any] | None:
    """The status once it speaks of ``generation`` and carries a phase (the handler records the
    generation, the status timer the phase: either may come first)."""
    status = status_of(kmock, name)
    return status if status.get("observedGeneration") == generation and status.get("phase") else None


def command_of(workload: dict[str, Any]) -> list[str]:
    return [str(part) for part in workload["spec"]["template"]["spec"]["containers"][0]["command"]]


def patches_to_children(kmock: Any) -> list[str]:
    return [
        str(request.url.path)
        for request in list(kmock)
        if request.method.value == "PATCH"
        and any(
            f"/{plural}/" in str(request.url.path) for plural in ("secrets", "deployments", "services", "daemonsets")
        )
    ]


async def test_model_distribution_yields_owned_children(operator: Operator) -> None:
    kmock = operator.kmock
    await create(kmock, MD_RES, model_distribution("llama", uri="s3://models/llama"))
    found = await eventually(
        lambda: all(children(kmock, "llama").values()) and children(kmock, "llama"), what="all four children"
    )
    md = get(kmock, MD_RES, "llama")
    assert md is not None
    for child in found.values():
        refs = child["metadata"]["ownerReferences"]
        assert [(r["kind"], r["name"], r["uid"]) for r in refs] == [
            ("ModelDistribution", "llama", md["metadata"]["uid"])
        ]
        assert refs[0]["controller"] is True
    token = base64.b64decode(found["secret"]["data"][constants.TOKEN_KEY]).decode()
    assert len(token) >= 32
    deployment = command_of(found["deployment"])
    assert "--role" in deployment and deployment[deployment.index("--role") + 1] == "tracker"
    agent = command_of(found["daemonset"])
    assert agent[agent.index("--source") + 1] == "s3://models/llama"
    assert found["service"]["spec"]["ports"][0]["port"] == constants.MASTER_PORT
    for kind in ("deployment", "service", "daemonset"):
        assert constants.SPEC_HASH_ANNOTATION in found[kind]["metadata"]["annotations"]
    status = await eventually(lambda: status_for(kmock, "llama", generation=1), what="a status for generation 1")
    assert status["phase"] == "Pending"  # no tracker answers in this test


async def test_spec_change_patches_children_and_unchanged_spec_sends_nothing(operator: Operator) -> None:
    kmock = operator.kmock
    await create(kmock, MD_RES, model_distribution("llama", uri="s3://models/v1"))
    first = await eventually(
        lambda: all(children(kmock, "llama").values()) and children(kmock, "llama"), what="children"
    )
    await eventually(
        lambda: get(kmock, MD_RES, "llama")["status"]["observedGeneration"] == 1,  # type: ignore[index]
        what="observedGeneration 1",
    )
    assert patches_to_children(kmock) == []

    await patch(kmock, MD_RES, "llama", {"spec": {"source": {"uri": "s3://models/v2"}}})
    await eventually(
        lambda: "s3://models/v2" in command_of(get(kmock, DAEMONSETS, "llama-agent")),  # type: ignore[arg-type]
        what="the agent DaemonSet patched with the new source",
    )
    await eventually(
        lambda: get(kmock, MD_RES, "llama")["status"]["observedGeneration"] == 2,  # type: ignore[index]
        what="observedGeneration 2",
    )
    second = children(kmock, "llama")
    assert second["secret"]["data"] == first["secret"]["data"]  # type: ignore[index]  # the token stays
    hash_key = constants.SPEC_HASH_ANNOTATION
    assert (
        second["daemonset"]["metadata"]["annotations"][hash_key]
        != first["daemonset"]["metadata"]["annotations"][hash_key]
    )  # type: ignore[index]
    patched = patches_to_children(kmock)
    assert f"/apis/apps/v1/namespaces/{NS}/daemonsets/llama-agent" in patched
    assert not any("/secrets/" in path for path in patched)

    # A restart resumes the same spec: children are read, nothing is patched. kopf handles one
    # object's causes one after the other, so once a later spec change has been handled, the
    # resumed handler has finished too: the only patch since the restart is the later change's.
    before = len(patches_to_children(kmock))
    await operator.restart()
    await eventually(
        lambda: any(
            r.method.value == "GET" and "/daemonsets/llama-agent" in str(r.url.path) for r in list(kmock)[-200:]
        ),
        what="the resumed handler reading its children",
    )
    await patch(kmock, MD_RES, "llama", {"spec": {"source": {"uri": "s3://models/v3"}}})
    await eventually(
        lambda: get(kmock, MD_RES, "llama")["status"]["observedGeneration"] == 3,  # type: ignore[index]
        what="observedGeneration 3",
    )
    assert patches_to_children(kmock)[before:] == [f"/apis/apps/v1/namespaces/{NS}/daemonsets/llama-agent"]


@pytest.mark.kmock(cls=kmock_lean.LeanEmulator)
async def test_lean_emulator_of_the_benchmark_serves_the_operator_alike(operator: Operator) -> None:
    """bench/operator.py's emulator (no request log, remembered reaction matching, lookups by key,
    no tracebacks in errors) gives the operator the same children and status."""
    kmock = operator.kmock
    assert isinstance(kmock, kmock_lean.LeanEmulator)
    await create(kmock, MD_RES, model_distribution("llama", uri="s3://models/llama"))
    found = await eventually(
        lambda: all(children(kmock, "llama").values()) and children(kmock, "llama"), what="all four children"
    )
    status = await eventually(lambda: status_for(kmock, "llama", generation=1), what="a status for generation 1")
    assert status["phase"] == "Pending"
    agent = command_of(found["daemonset"])  # type: ignore[arg-type]
    assert agent[agent.index("--source") + 1] == "s3://models/llama"
    async with aiohttp.ClientSession(base_url=str(kmock.url)) as session:
        async with session.get(f"/api/v1/namespaces/{NS}/secrets/llama-token") as response:
            assert response.status == 200
            assert (await response.json())["metadata"]["name"] == "llama-token"
        async with session.get(f"/api/v1/namespaces/{NS}/secrets/other-token") as response:
            assert response.status == 404
            assert (await response.json())["details"] == {}


async def test_pod_monitors_come_and_go_with_their_resource(operator: Operator) -> None:
    """With metrics.podMonitor.enabled (RINGSEED_POD_MONITOR), each resource gets its PodMonitor."""
    kmock = operator.kmock
    operator.settings["pod_monitor"] = True
    operator.settings["pod_monitor_labels"] = {"release": "prometheus"}
    await operator.restart()
    await create(kmock, MD_RES, model_distribution("llama"))
    monitor = await eventually(lambda: get(kmock, MONITORS, "llama-metrics"), what="the PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["metadata"]["ownerReferences"][0]["name"] == "llama"
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["http", "peer"]
    await delete(kmock, MD_RES, "llama")
    await eventually(lambda: get(kmock, MD_RES, "llama") is None, what="the resource gone")
    assert get(kmock, MONITORS, "llama-metrics") is None
