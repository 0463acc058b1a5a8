"""Tracker replicas over HTTP: one leads under a file lock, the follower answers 503 naming it,
clients follow; when the leader goes the follower leads with a new epoch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import tracker_client
from ringseed.local import swarm
from ringseed.master import election as locks
from ringseed.master import tracker
from ringseed.protocol import digests
from tests.waiting import eventually

TOKEN = "t0ken"
H = "ab" * 32
LAYOUT = {"version": 1, "chunk_size": 1 << 20, "files": [{"path": "m.bin", "size": 4 << 20, "mode": 0o644}]}


@contextlib.asynccontextmanager
async def serve(app: aioweb.Application, port: int) -> AsyncIterator[aioweb.AppRunner]:
    runner = aioweb.AppRunner(app, access_log=None)
    await runner.setup()
    await aioweb.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield runner
    finally:
        await runner.cleanup()


async def test_the_follower_names_the_leader_and_leads_when_it_goes(tmp_path: Path) -> None:
    ports = [swarm.free_port(), swarm.free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    apps = [
        tracker.create_app(
            token=TOKEN,
            offline_after=3.0,
            heartbeat_interval=0.5,
            seeders=1,
            lock=locks.FileLock(tmp_path, "tracker"),
            url=url,
        )
        for url in urls
    ]
    seats = [app[tracker.REPLICA_KEY] for app in apps]
    async with serve(apps[0], ports[0]) as first, serve(apps[1], ports[1]) as second:
        runners = [first, second]
        await eventually(lambda: any(s.leading for s in seats), within=10.0, what="a leader")
        lead = next(i for i, s in enumerate(seats) if s.leading)
        follower = seats[1 - lead]
        await eventually(lambda: follower.leader_url == urls[lead], within=10.0, what="the follower naming the leader")
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with http.get(urls[1 - lead] + "/v1/status", headers=headers) as response:
                assert response.status == 503 and response.headers[web.LEADER_HEADER] == urls[lead]
                assert (await response.json())["error"] == "not_leader"
            async with http.get(urls[1 - lead] + "/readyz") as response:
                assert response.status == 503
            async with http.get(urls[lead] + "/readyz") as response:
                assert response.status == 200 and (await response.json())["leading"] is True
            client = tracker_client.TrackerClient(
                urls=[urls[1 - lead], urls[lead]], token=TOKEN, node="n", session=http
            )
            epoch = (await client.register(url="http://n", session="s", chunks={0: H}, layout=LAYOUT))["epoch"]
            assert client.leader == urls[lead]  # the follower's 503 sent it on
            await runners[lead].cleanup()  # the leader goes; its lock is released (as on SIGKILL)
            await eventually(lambda: follower.leading, within=10.0, what="the follower leading")
            assert follower.term == seats[lead].term + 1
            with pytest.raises(tracker_client.UnknownNode):  # fresh state: register again
                await client.heartbeat({"since": None, "epoch": epoch})
            again = await client.register(url="http://n", session="s", chunks={0: H}, layout=LAYOUT)
            assert client.leader == urls[1 - lead] and again["epoch"] != epoch and again["rejected"] == []


async def test_a_watch_is_answered_by_a_new_copy_and_otherwise_by_its_deadline() -> None:
    port = swarm.free_port()
    url = f"http://127.0.0.1:{port}"
    app = tracker.create_app(token=TOKEN, offline_after=30.0, heartbeat_interval=0.5, seeders=1)
    async with serve(app, port), aiohttp.ClientSession() as http:
        puller = tracker_client.TrackerClient(urls=[url], token=TOKEN, node="a", session=http)
        waiter = tracker_client.TrackerClient(urls=[url], token=TOKEN, node="b", session=http)
        await puller.register(url="http://a", session="s", chunks={}, layout=LAYOUT)
        await puller.put_manifest(layout=LAYOUT, chunk_hashes=None)
        epoch = (await waiter.register(url="http://b", session="s", chunks={}, layout=LAYOUT))["epoch"]
        view = await waiter.heartbeat({"since": None, "epoch": epoch})
        assert view["full"] and view["availability"] == [0, 0, 0, 0]
        body = {"since": view["version"], "epoch": epoch, "chunks": [0], "wait": 30}
        watching = asyncio.create_task(waiter.watch(body, wait=30))
        quiet = await waiter.watch({**body, "chunks": None, "wait": 0.3}, wait=0.3)  # nothing new: its deadline
        assert quiet == {"epoch": epoch, "version": view["version"], "full": False}
        assert not watching.done()
        await puller.heartbeat({"chunks": [[0, H, None]]})  # on origin duty: the first copy of chunk 0
        news = await asyncio.wait_for(watching, timeout=10)  # woken by the copy, long before 30 s
        assert news["avail"] == {"1": [0]} and digests.unpack(news["hash_runs"]) == {0: H}
