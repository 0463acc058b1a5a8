"""The cache master's leader and follower: every acknowledged write is on the follower; it takes over; agents follow."""

from __future__ import annotations

import asyncio
import os

from tests.component.cache.cluster import Cluster, MiB
from tests.component.cache.test_checkpoints import write


async def two_masters(cluster: Cluster) -> None:
    first = await cluster.start_master(replicas=2)
    await cluster.wait_until(lambda: first.state.leading, what="first master leads")
    second = await cluster.start_master(replicas=2)
    await cluster.wait_until(lambda: first.state.follower_in_sync, what="follower in sync")
    assert not second.state.leading


async def test_acknowledged_writes_are_on_the_follower_and_survive_the_leaders_loss(cluster: Cluster) -> None:
    await two_masters(cluster)
    for name in ("n0", "n1", "n2"):
        await cluster.start_node(name)
    old, follower = cluster.masters
    data = os.urandom(10 * MiB)
    await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "step-1/model.pt", data)
    assert "step-1/model.pt" in follower.state.meta.objects  # acknowledged => replicated
    assert follower.state.meta.snapshot() == old.state.meta.snapshot()
    await cluster.stop_master(old)  # releases the lock, as a dead process would
    await cluster.wait_until(lambda: follower.state.leading, what="the follower to take over")
    assert follower.state.term == old.state.term + 1
    fs = cluster.nodes["n2"].fs(cluster.token)
    back = await asyncio.to_thread(lambda: fs.open("step-1/model.pt", "rb").read())
    assert back == data  # agents re-registered with the new leader, which knows the holders again
    await asyncio.to_thread(write, fs, "step-2/model.pt", b"after the switch")
    assert await asyncio.to_thread(lambda: fs.cat("step-2/model.pt")) == b"after the switch"


async def test_a_save_in_flight_while_the_leader_dies_completes_on_the_new_leader(cluster: Cluster) -> None:
    await two_masters(cluster)
    for name in ("n0", "n1"):
        await cluster.start_node(name)
    old, follower = cluster.masters
    fs = cluster.nodes["n0"].fs(cluster.token)
    data = os.urandom(20 * MiB)

    def half_then_rest(switched: asyncio.Event, loop: asyncio.AbstractEventLoop) -> dict[str, object]:
        with fs.open("step-9/model.pt", "wb") as f:
            f.write(data[: 10 * MiB])
            loop.call_soon_threadsafe(switched.set)
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result()
            while not follower.state.leading:
                pass
            f.write(data[10 * MiB :])
        return f.result  # type: ignore[return-value]

    switched = asyncio.Event()
    saving = asyncio.create_task(asyncio.to_thread(half_then_rest, switched, asyncio.get_running_loop()))
    await switched.wait()
    await cluster.stop_master(old)
    result = await saving
    assert result["copies"] == ["n0", "n1"]
    assert follower.state.meta.get("step-9/model.pt").size == len(data)
    assert await asyncio.to_thread(lambda: fs.cat("step-9/model.pt")) == data


async def test_a_follower_that_missed_writes_never_takes_over_while_the_state_lives_elsewhere(cluster: Cluster) -> None:
    await two_masters(cluster)
    await cluster.start_node("n0")
    await cluster.start_node("n1")
    old, follower = cluster.masters
    await cluster.stop_master(follower)  # the follower goes away; the leader goes on alone
    await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "solo/x", b"written without a follower")
    record = await old.state.lock.read()
    assert record.sync == ""  # the stale follower is not named in sync any more
    late = await cluster.start_master(replicas=2, takeover_grace=3600.0)
    await cluster.wait_until(lambda: old.state.follower_in_sync, what="the new follower to catch up")
    assert "solo/x" in late.state.meta.objects
