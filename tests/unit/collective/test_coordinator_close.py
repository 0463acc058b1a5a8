"""A coordinator shutting down answers the calls it holds (no shutdown waits on a peer that left)."""

from __future__ import annotations

import asyncio

from ringseed.master import coordinator


async def test_closing_answers_every_held_call_at_once() -> None:
    c = coordinator.Coordinator(heartbeat_interval=1.0, heartbeat_timeout=3.0, optimize_topology=False, min_peers=2)
    held = [asyncio.create_task(c.wait_for(lambda: None, wait=coordinator.MAX_WAIT)) for _ in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)  # each call is now waiting for a change
    assert not any(task.done() for task in held)
    c.close()
    for _ in range(10):  # loop turns, not time: the wake-up is the change event
        await asyncio.sleep(0)
    assert all(task.done() for task in held)
    assert [task.result() for task in held] == [None, None, None]
    assert await c.wait_for(lambda: None, wait=coordinator.MAX_WAIT) is None  # a call after close returns too
