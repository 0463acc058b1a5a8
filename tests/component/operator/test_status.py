"""Status from masters reaches the resources; invalid specs yield their condition; node labels follow."""

from __future__ import annotations

import base64
import secrets
from typing import Any

from ringseed.api import conditions, constants
from ringseed.master import tracker
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
    serve,
    tracker_report,
)
from tests.waiting import eventually


def status_of(kmock: Any, name: str) -> dict[str, Any]:
    return dict((get(kmock, MD_RES, name) or {}).get("status") or {})


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


def events_about(kmock: Any, name: str) -> list[tuple[str, str]]:
    return [
        (obj["type"], obj["reason"])
        for (resource, _, _), obj in kmock.objects.items()
        if resource.plural == "events" and not obj.deleted and obj["involvedObject"]["name"] == name
    ]


def phase_is(kmock: Any, name: str, phase: str) -> dict[str, Any] | None:
    status = status_of(kmock, name)
    return status if status.get("phase") == phase else None


async def test_tracker_progress_reaches_status_events_and_node_labels(operator: Operator) -> None:
    kmock, fake = operator.kmock, operator.fake
    for node in ("node-0", "node-1"):
        kmock.objects["v1/nodes", None, node] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    await create(kmock, MD_RES, model_distribution("llama"))
    await eventually(lambda: phase_is(kmock, "llama", "Pending"), what="Pending while the tracker is down")

    await schedule_agents(kmock, "llama", ["node-0", "node-1"])  # the DaemonSet wants both nodes
    fake.reports[NS, "llama"] = tracker_report(total=2, ready=0, held=250)
    status = await eventually(lambda: phase_is(kmock, "llama", "Downloading"), what="Downloading")
    assert (status["nodesReady"], status["nodesTotal"], status["percent"]) == (0, 2, 25)
    assert status["throughput"] == "2.0 MiB/s" and status["eta"] == "1m30s"
    assert condition(status, conditions.PROGRESSING)["status"] == "True"
    token = get(kmock, "v1/secrets", "llama-token")["data"][constants.TOKEN_KEY]  # type: ignore[index]
    assert fake.tokens[NS, "llama"] == base64.b64decode(token).decode()  # the Secret's token

    fake.reports[NS, "llama"] = tracker_report(total=2, ready=1, verified=("node-0",))
    await eventually(lambda: phase_is(kmock, "llama", "Distributing"), what="Distributing")
    key, value = builders.model_node_label(namespace=NS, name="llama")
    await eventually(
        lambda: get(kmock, "v1/nodes", "node-0", None)["metadata"].get("labels", {}).get(key) == value,  # type: ignore[index]
        what="node-0 labelled as holding a verified copy",
    )
    assert key not in (get(kmock, "v1/nodes", "node-1", None) or {}).get("metadata", {}).get("labels", {})

    fake.reports[NS, "llama"] = tracker_report(total=2, ready=2, verified=("node-0", "node-1"))
    status = await eventually(lambda: phase_is(kmock, "llama", "Complete"), what="Complete")
    assert condition(status, conditions.READY)["status"] == "True"
    assert condition(status, conditions.READY)["reason"] == "DistributionComplete"
    assert status["percent"] == 100

    fake.reports[NS, "llama"] = None  # the tracker goes silent for longer than degraded_after (1 s)
    status = await eventually(lambda: phase_is(kmock, "llama", "Degraded"), what="Degraded")
    assert condition(status, conditions.DEGRADED)["reason"] == "MasterUnreachable"
    assert status["nodesReady"] == 2  # the last figures stay
    await eventually(lambda: ("Warning", "PhaseDegraded") in events_about(kmock, "llama"), what="a Degraded Event")
    reasons = [reason for _, reason in events_about(kmock, "llama")]
    assert reasons == [f"Phase{p}" for p in ("Downloading", "Distributing", "Complete", "Degraded")]


async def test_status_from_the_real_tracker(operator: Operator) -> None:
    kmock = operator.kmock
    token = secrets.token_urlsafe(32)
    secret = builders.token_secret(body=model_distribution("real"), token=token)
    await create(kmock, "v1/secrets", secret)  # the operator keeps an existing token Secret
    app = tracker.create_app(token=token, offline_after=10, heartbeat_interval=1, seeders=1)
    async with serve(app) as url:
        operator.mapping[f"{NS}/real"] = url
        await create(kmock, MD_RES, model_distribution("real"))
        status = await eventually(
            lambda: status_of(kmock, "real").get("nodesTotal") == 0 and status_of(kmock, "real"),
            what="the tracker's figures",
        )
        # Read with the Secret's token (a wrong one gets 401 and no figures at all).
        assert status["phase"] == "Pending"
        assert condition(status, conditions.PROGRESSING)["reason"] == "NoNodesSelected"


async def test_invalid_spec_yields_its_condition_and_no_children(operator: Operator) -> None:
    kmock = operator.kmock
    await create(kmock, MD_RES, model_distribution("bad", uri="ftp://nowhere/model"))
    status = await eventually(lambda: phase_is(kmock, "bad", "Failed"), what="Failed")
    invalid = condition(status, conditions.INVALID_SPEC)
    assert invalid["status"] == "True" and invalid["reason"] == "SpecInvalid"
    assert invalid["message"].startswith("spec.source.uri: ")
    assert status["observedGeneration"] == 1
    assert get(kmock, "apps/v1/daemonsets", "bad-agent") is None
    await eventually(lambda: ("Warning", "PhaseFailed") in events_about(kmock, "bad"), what="a Failed Event")

    await patch(kmock, MD_RES, "bad", {"spec": {"source": {"uri": "s3://models/fixed"}}})
    await eventually(lambda: get(kmock, "apps/v1/daemonsets", "bad-agent"), what="children after the fix")
    status = await eventually(lambda: phase_is(kmock, "bad", "Pending"), what="Pending after the fix")
    assert condition(status, conditions.INVALID_SPEC)["status"] == "False"
    assert status["observedGeneration"] == 2
