"""Reconciling a ModelDistribution: children, status from its tracker, node labels, deletion.

Owns what the operator does for ``ModelDistribution`` objects; ``handlers`` only routes kopf's
causes here. Rules:
- create/update/resume: parse the spec (invalid: Failed + InvalidSpec, no retries), make the
  token Secret once, apply master Deployment + Service and agent DaemonSet (create if missing,
  merge-patch when the spec hash differs), then record ``observedGeneration``.
- timer: with an invalid spec, (re)write Failed + InvalidSpec; else read the tracker's
  ``/v1/status``, patch the status when it changed, post an Event on a
  phase change, and label each node whose copy the tracker reports verified with
  ``builders.model_node_label`` (and unlabel it when it is no longer verified).
- delete: unlabel the nodes and delete the children; with ``retainPolicy: Delete`` run
  ``builders.cleanup_daemonset`` until all its pods are ready (the data is gone) or
  ``cleanup_timeout`` passed, then delete it. ``Retain`` keeps node data.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from ringseed.api import constants, types, validation
from ringseed.operator import builders, kube, runtime, status

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
    await runtime.apply_children(rt, body=body, children=children, logger=logger, fresh=fresh)
    # The phase is the timer's (the only writer that knows the tracker's state); this records that
    # the spec was acted upon, which also lets the timer take over from an earlier Failed.
    await runtime.write_status(rt, body=body, new={"observedGeneration": runtime.generation_of(body)})


async def observe(rt: runtime.Runtime, *, body: Mapping[str, Any], logger: Logger) -> None:
    """The status timer: tracker report -> status, Events, node labels."""
    previous = body.get("status") or {}
    try:
        parse(rt, body)
    except validation.SpecError as exc:  # no master to ask; keep saying why (heals a racing write)
        await runtime.write_status(rt, body=body, new=runtime.invalid(body=body, error=exc))
        return
    reach = await runtime.read_master(rt, body=body)
    new = status.md_status(
        reach=reach, generation=None, previous=previous, now=runtime.now_text(), degraded_after=rt.degraded_after
    )
    await runtime.write_status(rt, body=body, new=new)
    if reach.report is not None:
        await sync_node_labels(rt, body=body, report=reach.report, logger=logger)


async def sync_node_labels(
    rt: runtime.Runtime, *, body: Mapping[str, Any], report: Mapping[str, Any], logger: Logger
) -> None:
    namespace, name = runtime.ident(body)
    key, value = builders.model_node_label(namespace=namespace, name=name)
    done = rt.labelled.setdefault((namespace, name), set())
    nodes = report.get("nodes") or {}
    verified = {node for node, entry in nodes.items() if isinstance(entry, Mapping) and entry.get("verified")}
    for node in sorted(verified - done):
        if await kube.label_node(rt.kube, node=node, key=key, value=value):
            logger.info("Labelled Node %s with %s=%s", node, key, value)
        done.add(node)
    for node in sorted(n for n in done - verified if n in nodes):
        await kube.label_node(rt.kube, node=node, key=key, value=None)
        logger.info("Unlabelled Node %s: its copy is no longer verified", node)
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
