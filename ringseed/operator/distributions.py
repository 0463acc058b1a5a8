"""Reconciling a ModelDistribution: children, status from its tracker, node labels, deletion.

Owns what the operator does for ``ModelDistribution`` objects; ``handlers`` only routes kopf's
causes here. Rules:
- create/update/resume: parse the spec (invalid: Failed + InvalidSpec, no retries), make the
  token Secret once, apply master Deployment + Service and agent DaemonSet (create if missing,
  merge-patch when the spec hash differs), then record ``observedGeneration``.
  A new resource (or one repaired from Failed) gets its first status (Pending, with its
  generation) while its children are made, from the same handler run. Not from the timer, which
  starts earlier: kopf adds its finalizer with a JSON patch that tests the resourceVersion, and a
  status write landing between kopf's read and that patch made it fail (measured: with 50 new
  resources at once, 2 never got their finalizer after kopf's 9 tries).
- timer: with an invalid spec, (re)write Failed + InvalidSpec; before the handler has applied the
  spec (no ``observedGeneration``) nothing; else read the tracker's ``/v1/status`` and, when it
  answered, the agent DaemonSet and its pods (which nodes should hold the model:
  ``swarm.agents_of``), patch the status when it changed, post an Event on a phase change and one
  for each node that got stuck, and label each node that holds a verified copy of the current
  revision with ``builders.model_node_label`` (and unlabel it when it no longer does).
- delete: unlabel the nodes and delete the children; with ``retainPolicy: Delete`` run
  ``builders.cleanup_daemonset`` until all its pods are ready (the data is gone) or
  ``cleanup_timeout`` passed, then delete it. ``Retain`` keeps node data.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from ringseed.api import constants, types, validation
from ringseed.operator import builders, kube, runtime, status
from ringseed.operator import swarm as swarm_module

Logger = logging.Logger | logging.LoggerAdapter[Any]
WORKLOAD = ("apps/v1", "DaemonSet", "agent")


def parse(rt: runtime.Runtime, body: Mapping[str, Any]) -> types.ModelDistributionSpec:
    return validation.parse_model_distribution(
        body.get("spec") or {}, name=body["metadata"]["name"], data_root=rt.config.data_root
    )


def plan(rt: runtime.Runtime, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The children of a valid spec; raises SpecError (from parsing or building) otherwise."""
    return builders.md_children(body=body, spec=parse(rt, body), config=rt.config)


async def apply(rt: runtime.Runtime, *, body: Mapping[str, Any], logger: Logger, fresh: bool = False) -> None:
    children = await runtime.parse_or_fail(rt, body=body, parse=lambda: plan(rt, body))
    previous = body.get("status") or {}
    generation = runtime.generation_of(body)
    if not previous.get("phase") or previous.get("phase") == "Failed":
        # A new (or just repaired) resource: say Pending while its children are being made (the
        # two are independent: one round trip, not two, before both are there).
        first = status.md_status(
            reach=status.Reach(report=None),
            generation=generation,
            previous=previous,
            now=runtime.now_text(),
            degraded_after=rt.degraded_after,
        )
        await asyncio.gather(
            runtime.write_status(rt, body=body, new=first),
            runtime.apply_children(rt, body=body, children=children, logger=logger, fresh=fresh),
        )
        return
    await runtime.apply_children(rt, body=body, children=children, logger=logger, fresh=fresh)
    # Later phases are the timer's (the only writer that knows the tracker's state); this records
    # that the spec was acted upon.
    await runtime.write_status(rt, body=body, new={"observedGeneration": generation})


async def observe(rt: runtime.Runtime, *, body: Mapping[str, Any], logger: Logger) -> None:
    """The status timer: tracker report and agent DaemonSet -> status, Events, node labels."""
    previous = body.get("status") or {}
    try:
        parse(rt, body)
    except validation.SpecError as exc:  # no master to ask; keep saying why (heals a racing write)
        await runtime.write_status(rt, body=body, new=runtime.invalid(body=body, error=exc))
        return
    if previous.get("observedGeneration") is None:
        return  # the handler has not applied the spec yet; it writes the first status
    await runtime.keep_identity(rt, body=body)
    reach = await runtime.read_master(rt, body=body)
    now = runtime.now_text()
    swarm = None
    if reach.report is not None:
        agents = await observe_agents(rt, body=body)
        swarm = status.swarm_for(
            reach.report, agents=agents, previous=previous, now=now, degraded_after=rt.degraded_after
        )
    new = status.md_status(
        reach=reach, swarm=swarm, generation=None, previous=previous, now=now, degraded_after=rt.degraded_after
    )
    if await runtime.write_status(rt, body=body, new=new):
        await runtime.post_events(rt, body=body, events=status.node_events(previous=previous, current=new))
    if swarm is not None:
        await sync_node_labels(rt, body=body, ready={n.name for n in swarm.nodes if n.ready}, logger=logger)


async def observe_agents(rt: runtime.Runtime, *, body: Mapping[str, Any]) -> swarm_module.Agents:
    """The agent DaemonSet and its pods, as the API server has them (unknown parts: None)."""
    namespace, name = runtime.ident(body)
    daemonset = await rt.kube.get(api_version="apps/v1", kind="DaemonSet", namespace=namespace, name=f"{name}-agent")
    pods = None
    if daemonset is not None:
        selector = ",".join(f"{k}={v}" for k, v in sorted(daemonset["spec"]["selector"]["matchLabels"].items()))
        try:
            pods = await rt.kube.list(api_version="v1", kind="Pod", namespace=namespace, label_selector=selector)
        except kube.ApiError as exc:  # e.g. no RBAC for pods: fall back to the tracker's names
            runtime.log.warning("Could not list the pods of DaemonSet %s-agent: %s", name, exc)
    return swarm_module.agents_of(daemonset, pods)


async def sync_node_labels(rt: runtime.Runtime, *, body: Mapping[str, Any], ready: set[str], logger: Logger) -> None:
    """Label the nodes holding a verified copy of the current revision; unlabel those that no longer do."""
    namespace, name = runtime.ident(body)
    key, value = builders.model_node_label(namespace=namespace, name=name)
    done = rt.labelled.setdefault((namespace, name), set())
    for node in sorted(ready - done):
        if await kube.label_node(rt.kube, node=node, key=key, value=value):
            logger.info("Labelled Node %s with %s=%s", node, key, value)
        done.add(node)
    for node in sorted(done - ready):
        await kube.label_node(rt.kube, node=node, key=key, value=None)
        logger.info("Unlabelled Node %s: it no longer holds a verified copy of the current revision", node)
        done.discard(node)


async def delete(rt: runtime.Runtime, *, body: Mapping[str, Any], runtime_: datetime.timedelta, logger: Logger) -> None:
    """Unlabel nodes, delete children; with retainPolicy Delete, clean node data (bounded)."""
    namespace, name = runtime.ident(body)
    key, value = builders.model_node_label(namespace=namespace, name=name)
    for node in await kube.nodes_labelled(rt.kube, key=key, value=value):
        await kube.label_node(rt.kube, node=node, key=key, value=None)
    rt.labelled.pop((namespace, name), None)
    await runtime.delete_children(rt, body=body, workload=WORKLOAD)
    if (body.get("spec") or {}).get("retainPolicy", constants.RETAIN) != constants.DELETE:
        logger.info("Kept node data of %s/%s (retainPolicy Retain)", namespace, name)
        return
    try:
        spec = parse(rt, body)
    except validation.SpecError as exc:
        logger.warning("Cannot clean node data: the spec is invalid (%s)", exc)
        return
    await clean_node_data(rt, body=body, spec=spec, elapsed=runtime_.total_seconds(), logger=logger)


async def clean_node_data(
    rt: runtime.Runtime, *, body: Mapping[str, Any], spec: types.ModelDistributionSpec, elapsed: float, logger: Logger
) -> None:
    """Run the cleanup DaemonSet until its pods are all ready, or time runs out; then delete it."""
    cleanup = builders.cleanup_daemonset(body=body, spec=spec, config=rt.config)
    meta = cleanup["metadata"]
    if await kube.apply(rt.kube, obj=cleanup) is kube.Applied.CREATED:
        logger.info("Created DaemonSet %s to remove node data", meta["name"])
    current = await rt.kube.get(api_version="apps/v1", kind="DaemonSet", namespace=meta["namespace"], name=meta["name"])
    if not cleaned(current) and elapsed < rt.cleanup_timeout:
        raise kopf.TemporaryError(f"Waiting for DaemonSet {meta['name']} to remove node data", delay=2)
    if not cleaned(current):
        logger.warning("Gave up waiting for DaemonSet %s after %.0fs", meta["name"], elapsed)
    await rt.kube.delete(api_version="apps/v1", kind="DaemonSet", namespace=meta["namespace"], name=meta["name"])
    logger.info("Deleted DaemonSet %s", meta["name"])


def cleaned(daemonset: Mapping[str, Any] | None) -> bool:
    """All scheduled cleanup pods are ready (each became ready only after removing the data)."""
    if daemonset is None:
        return False
    ds_status = daemonset.get("status") or {}
    desired = int(ds_status.get("desiredNumberScheduled") or 0)
    ready = int(ds_status.get("numberReady") or 0)
    generation = daemonset.get("metadata", {}).get("generation")
    observed = ds_status.get("observedGeneration")
    if "desiredNumberScheduled" not in ds_status or (generation and observed is not None and observed < generation):
        return False  # the controller has not looked at this version yet
    return desired == 0 or ready >= desired
