"""A TrainingGroup with spec.checkpoints against real kopf + KMock: cache children, lastCheckpoint status, deletion."""

from __future__ import annotations

from typing import Any

from tests.component.operator.conftest import NS, TG_RES, Operator, create, delete, get, training_group
from tests.waiting import eventually

CACHE_CHILDREN = (
    ("apps/v1/deployments", "ckpt-cache"),
    ("v1/services", "ckpt-cache"),
    ("apps/v1/daemonsets", "ckpt-cache-agent"),
    ("v1/serviceaccounts", "ringseed-master"),  # the namespace's master identity, made for the cache masters
    ("rbac.authorization.k8s.io/v1/roles", "ringseed-master"),
    ("rbac.authorization.k8s.io/v1/rolebindings", "ringseed-master"),
)


def with_checkpoints(name: str) -> dict[str, Any]:
    group = training_group(name, min_peers=1)
    group["spec"]["checkpoints"] = {"sink": {"uri": "s3://bucket/ckpt"}, "replicas": 2, "memoryBytes": "1Gi"}
    return group


def cache_report(*, persisted: bool) -> dict[str, Any]:
    return {
        "role": "cache", "leading": True, "term": 1, "seq": 4, "follower_in_sync": True,
        "last_checkpoint": {"name": "step-200", "files": 3, "bytes": 123456, "copies": 2, "persisted": persisted,
                            "committed_at": 1_790_000_000.0},
    }  # fmt: skip


async def test_checkpoints_bring_the_cache_children_and_status_shows_the_last_checkpoint(operator: Operator) -> None:
    kmock, fake = operator.kmock, operator.fake
    fake.reports[NS, "ckpt"] = {
        "role": "coordinator",
        "peers": 1,
        "world_size": 1,
        "ring_order": ["n0"],
        "phase": "Idle",
    }
    fake.reports[NS, "ckpt-cache"] = cache_report(persisted=False)
    await create(kmock, TG_RES, with_checkpoints("ckpt"))
    for resource, name in CACHE_CHILDREN:
        await eventually(lambda r=resource, n=name: get(kmock, r, n), what=f"{resource} {name}")
    worker = get(kmock, "apps/v1/daemonsets", "ckpt-worker")
    assert worker is not None
    env = {e["name"] for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "RINGSEED_CACHE_SOCKET" in env

    def last() -> dict[str, Any] | None:
        status = (get(kmock, TG_RES, "ckpt") or {}).get("status") or {}
        return status.get("lastCheckpoint")

    shown = await eventually(last, what="status.lastCheckpoint")
    assert shown == {
        "name": "step-200", "files": 3, "bytes": 123456, "copies": 2, "persisted": False, "time": "2026-09-21T14:13:20Z"
    }  # fmt: skip
    assert fake.tokens[NS, "ckpt-cache"]  # asked with the group's token
    fake.reports[NS, "ckpt-cache"] = cache_report(persisted=True)
    await eventually(lambda: (last() or {}).get("persisted"), what="persisted shown")

    await delete(kmock, TG_RES, "ckpt")
    await eventually(lambda: get(kmock, TG_RES, "ckpt") is None, what="the group gone")
    for resource, name in CACHE_CHILDREN:
        assert get(kmock, resource, name) is None, name
