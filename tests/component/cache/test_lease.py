"""The cache master's Kubernetes Lease lock against KMock over HTTP, through the official client."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock as kmock_lib
import pytest

from ringseed.master import election as locks
from ringseed.protocol import election
from tests.component.operator.emulator import Emulator

NS = "ml"
LEASES = "coordination.k8s.io/v1/leases"


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return {**kmock_options, "cls": Emulator}


def lease_lock(kmock: Any, identity: str, *, duration: float) -> locks.LeaseLock:
    from kubernetes import client

    kmock.resources[LEASES] = kmock_lib.ResourceInfo(
        kind="Lease", namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"}
    )
    configuration = client.Configuration(host=str(kmock.url).rstrip("/"))
    api = client.CoordinationV1Api(client.ApiClient(configuration))
    return locks.LeaseLock(api=api, namespace=NS, name="train-cache", identity=identity, duration=duration)


async def test_one_holder_at_a_time_takeover_after_expiry_and_the_record_rides_along(kmock: Any) -> None:
    first = lease_lock(kmock, "a-1", duration=1.0)
    second = lease_lock(kmock, "b-1", duration=1.0)
    assert await first.try_acquire() and first.held()
    assert not await second.try_acquire()  # held and renewed: refused
    record = election.Record(term=1, leader="a-1", leader_url="http://10.0.0.1:8470", sync="b-1", seq=3)
    await first.write(record)
    assert await second.read() == record  # the follower reads the leader's record from the Lease
    assert await first.renew()
    await asyncio.sleep(1.3)  # the holder stops renewing (it died): the Lease runs out
    assert not first.held()
    assert await second.try_acquire() and second.held()
    assert not await first.try_acquire()  # the old holder cannot take it back while b renews
    stored = kmock.objects[LEASES, NS, "train-cache"]
    assert stored["spec"]["holderIdentity"] == "b-1"
    with pytest.raises(locks.LockError):
        await first.write(record)  # only the holder writes the record
