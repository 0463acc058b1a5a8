"""The node cache part of reconciling a TrainingGroup: status from the cache master, deletion.

Owns what the operator reads from a group's cache master (``<name>-cache``, ``GET /v1/status``,
docs/contracts.md "Node cache") and writes into the group's status:
``status.lastCheckpoint`` ``{name, files, bytes, copies, persisted, time}`` (null before the
first checkpoint), ``status.data`` ``{cachedBytes, totalBytes, percent, hitRatio, warmedUp}``
(bytes some node caches, over all datasets; warmed up: every node holds every dataset) and
``status.cacheMaster`` (``Leading``, ``NoLeader``, ``Unreachable``). A silent cache
master leaves ``lastCheckpoint`` as it was (the checkpoint did not go away). Only called for
groups with ``spec.checkpoints`` or ``spec.data``.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

from ringseed.operator import builders_cache, masters, runtime

CHILD_KINDS = (
    ("apps/v1", "Deployment", builders_cache.SUFFIX),
    ("v1", "Service", builders_cache.SUFFIX),
    ("apps/v1", "DaemonSet", builders_cache.AGENT_SUFFIX),
)


def checkpoint_status(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``status.lastCheckpoint`` from the cache master's report (None: no checkpoint yet)."""
    last = (report or {}).get("last_checkpoint")
    if not isinstance(last, Mapping):
        return None
    committed = datetime.datetime.fromtimestamp(float(last.get("committed_at") or 0.0), tz=datetime.UTC)
    return {
        "name": str(last.get("name", "")),
        "files": int(last.get("files") or 0),
        "bytes": int(last.get("bytes") or 0),
        "copies": int(last.get("copies") or 0),
        "persisted": bool(last.get("persisted")),
        "time": committed.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def data_status(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``status.data`` from the cache master's report (None when it reports no dataset yet)."""
    data = (report or {}).get("data")
    sources = data.get("sources") if isinstance(data, Mapping) else None
    if not isinstance(sources, Mapping) or not sources:
        return None
    cached = sum(int(s.get("cached_bytes") or 0) for s in sources.values())
    total = sum(int(s.get("total_bytes") or 0) for s in sources.values())
    nodes = len((report or {}).get("nodes") or [])
    ratio = data.get("hit_ratio") if isinstance(data, Mapping) else None
    return {
        "cachedBytes": cached,
        "totalBytes": total,
        "percent": int(100 * cached // max(1, total)),
        "hitRatio": round(float(ratio), 4) if isinstance(ratio, int | float) else None,
        "warmedUp": bool(nodes) and all(int(s.get("nodes_complete") or 0) >= nodes for s in sources.values()),
    }


async def status_fields(rt: runtime.Runtime, *, body: Mapping[str, Any]) -> dict[str, Any]:
    """The cache part of the group's status patch."""
    namespace, name = runtime.ident(body)
    url = rt.locator.url(namespace=namespace, name=name, service=f"{name}-{builders_cache.SUFFIX}")
    try:
        token = await runtime.token_of(rt, namespace=namespace, name=name)
        report = await rt.reader.status(url=url, token=token)
    except masters.MasterError:
        return {"cacheMaster": "Unreachable"}
    fields: dict[str, Any] = {"cacheMaster": "Leading" if report.get("leading") else "NoLeader"}
    last = checkpoint_status(report)
    if last is not None:
        fields["lastCheckpoint"] = last
    data = data_status(report)
    if data is not None:
        fields["data"] = data
    return fields


async def delete_children(rt: runtime.Runtime, *, body: Mapping[str, Any]) -> None:
    namespace, name = runtime.ident(body)
    await asyncio.gather(
        *(
            rt.kube.delete(api_version=api_version, kind=kind, namespace=namespace, name=f"{name}-{suffix}")
            for api_version, kind, suffix in CHILD_KINDS
        )
    )
