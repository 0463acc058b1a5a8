"""Reconciling a TrainingGroup: wait for its model, children, status from its coordinator, deletion.

Owns what the operator does for ``TrainingGroup`` objects; ``handlers`` only routes kopf's causes
here. Rules:
- create/update/resume: parse the spec (invalid: Failed + InvalidSpec, no retries). With
  ``modelRef``, wait (phase WaitingForModel, retried by kopf every status interval) until the
  ModelDistribution is Complete; only then make the token Secret and apply the coordinator
  Deployment + Service and the worker DaemonSet (whose pods select nodes labelled as holding a
  verified copy).
- timer: while the group waits for its model the handler owns the status; afterwards read the
  coordinator's ``/v1/status`` and patch the status (peers, world size, ring order, last
  all-reduce) when it changed, with an Event on each phase change.
- delete: delete the children (the garbage collector would too; this does not rely on it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from ringseed.api import constants, types, validation
from ringseed.operator import builders, builders_cache, caches, runtime, status

Logger = logging.Logger | logging.LoggerAdapter[Any]
WORKLOAD = ("apps/v1", "DaemonSet", "worker")


def parse(body: Mapping[str, Any], *, data_root: str | None = None) -> types.TrainingGroupSpec:
    return validation.parse_training_group(body.get("spec") or {}, name=body["metadata"]["name"], data_root=data_root)


async def model_of(
    rt: runtime.Runtime, *, body: Mapping[str, Any], spec: types.TrainingGroupSpec
) -> tuple[types.ModelDistributionSpec | None, status.Verdict | None]:
    """The referenced model's spec once it is Complete, else the WaitingForModel verdict."""
    if spec.model_ref is None:
        return None, None
    namespace, _ = runtime.ident(body)
    model = spec.model_ref.name
    md = await rt.kube.get(api_version=constants.API_VERSION, kind=constants.MD_KIND, namespace=namespace, name=model)
    phase = None if md is None else (md.get("status") or {}).get("phase")
    if md is None or phase != "Complete":
        return None, status.waiting_for_model(model=model, found=md is not None, phase=phase)
    try:
        md_spec = validation.parse_model_distribution(md.get("spec") or {}, data_root=rt.config.data_root)
    except validation.SpecError as exc:
        return None, status.waiting_for_model(model=model, found=True, phase=f"invalid ({exc})")
    return md_spec, None


async def apply(rt: runtime.Runtime, *, body: Mapping[str, Any], logger: Logger, fresh: bool = False) -> None:
    spec = await runtime.parse_or_fail(rt, body=body, parse=lambda: parse(body, data_root=rt.config.data_root))
    model, waiting = await model_of(rt, body=body, spec=spec)
    previous = body.get("status") or {}
    generation = runtime.generation_of(body)
    if waiting is not None:
        new = tg_status(rt, reach=status.Reach(report=None), body=body, spec=spec, waiting=waiting)
        new["observedGeneration"] = generation
        await runtime.write_status(rt, body=body, new=new)
        raise kopf.TemporaryError(waiting.message, delay=rt.config.status_interval_seconds)
    children = await runtime.parse_or_fail(
        rt, body=body, parse=lambda: builders.tg_children(body=body, spec=spec, config=rt.config, model=model)
    )
    await runtime.apply_children(rt, body=body, children=children, logger=logger, fresh=fresh)
    if previous.get("phase") in (None, "Failed", "WaitingForModel"):
        new = tg_status(rt, reach=status.Reach(report=None), body=body, spec=spec, waiting=None)
        new["observedGeneration"] = generation
    else:
        new = {"observedGeneration": generation}
    await runtime.write_status(rt, body=body, new=new)


def tg_status(
    rt: runtime.Runtime,
    *,
    reach: status.Reach,
    body: Mapping[str, Any],
    spec: types.TrainingGroupSpec,
    waiting: status.Verdict | None,
) -> dict[str, Any]:
    return status.tg_status(
        reach=reach,
        generation=None,
        previous=body.get("status") or {},
        now=runtime.now_text(),
        min_peers=spec.min_peers,
        degraded_after=rt.degraded_after,
        waiting=waiting,
    )


async def observe(rt: runtime.Runtime, *, body: Mapping[str, Any], logger: Logger) -> None:
    """The status timer: coordinator report -> status and Events."""
    previous = body.get("status") or {}
    if previous.get("phase") in (None, "WaitingForModel", "Failed"):
        return  # the handler owns the status until the children exist
    await runtime.keep_identity(rt, body=body)
    try:
        spec = parse(body, data_root=rt.config.data_root)
    except validation.SpecError as exc:  # keep saying why (heals a racing write)
        await runtime.write_status(rt, body=body, new=runtime.invalid(body=body, error=exc))
        return
    reach = await runtime.read_master(rt, body=body)
    new = tg_status(rt, reach=reach, body=body, spec=spec, waiting=None)
    if builders_cache.wanted(spec):
        new.update(await caches.status_fields(rt, body=body))
    await runtime.write_status(rt, body=body, new=new)


async def delete(rt: runtime.Runtime, *, body: Mapping[str, Any], logger: Logger) -> None:
    await runtime.delete_children(rt, body=body, workload=WORKLOAD)
    await caches.delete_children(rt, body=body)
    namespace, name = runtime.ident(body)
    logger.info("Deleted the children of TrainingGroup %s/%s", namespace, name)
