"""An in-process cache cluster for the component tests: cache master replica(s) and agents on one event loop.

Owns nothing but test plumbing: each part is the real aiohttp application (the master's cache
role, the agents' peer server on loopback TCP and their local API on a Unix socket); the SDK
(blocking) is called from threads. Process-level faults (SIGKILL) are in ``test_faults.py``
with :mod:`ringseed.local.cacheswarm`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web as aioweb

from ringseed.cache import service
from ringseed.fs import spec
from ringseed.master import cachemeta, cachemeta_api
from ringseed.master import election as locks
from tests import waiting

MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Master:
    runner: aioweb.AppRunner
    url: str
    app: aioweb.Application

    @property
    def state(self) -> cachemeta.CacheMaster:
        return self.app[cachemeta_api.MASTER_KEY]


@dataclass
class Node:
    name: str
    agent: service.CacheAgent
    stop: asyncio.Event
    task: asyncio.Task[None]
    socket: Path

    def fs(self, token: str) -> spec.RingseedFileSystem:
        return spec.RingseedFileSystem(socket=str(self.socket), token=token, skip_instance_cache=True)


@dataclass
class Cluster:
    root: Path
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    masters: list[Master] = field(default_factory=list)
    nodes: dict[str, Node] = field(default_factory=dict)
    lock_dir: Path | None = None

    async def start_master(self, **settings: Any) -> Master:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        self.lock_dir = self.lock_dir or self.root / "lock"
        lock = locks.FileLock(self.lock_dir, "cachemeta")
        app = cachemeta_api.create_app(
            token=self.token,
            lock=lock,
            settings=cachemeta.Settings(url=url, **{"heartbeat_interval": 0.2, "offline_after": 3.0, **settings}),
        )
        runner = aioweb.AppRunner(app, access_log=None)
        await runner.setup()
        await aioweb.TCPSite(runner, "127.0.0.1", port).start()
        master = Master(runner=runner, url=url, app=app)
        self.masters.append(master)
        return master

    async def stop_master(self, master: Master) -> None:
        await master.runner.cleanup()
        self.masters.remove(master)

    async def start_node(self, name: str, **overrides: Any) -> Node:
        # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer
        socket_path = Path(tempfile.mkdtemp(prefix="rs-sock-")) / f"{name}.sock"
        config = service.Config(
            **{
                "master_urls": [m.url for m in self.masters],
                "node_name": name,
                "advertise_host": "127.0.0.1",
                "host": "127.0.0.1",
                "port": 0,
                "token": self.token,
                "socket_path": socket_path,
                "memory_dir": self.root / name / "memory",
                "ssd_dir": self.root / name / "ssd",
                "memory_bytes": 256 * MiB,
                "ssd_bytes": 256 * MiB,
                "chunk_size": 8 * MiB,
                "write_deadline": 10.0,
                **overrides,
            }
        )
        agent = service.CacheAgent(config)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        node = Node(name=name, agent=agent, stop=stop, task=task, socket=socket_path)
        self.nodes[name] = node
        done, _ = await asyncio.wait({task, asyncio.create_task(agent.registered.wait())}, timeout=10.0,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if task in done:
            task.result()
        assert agent.registered.is_set(), f"{name} did not register"
        return node

    async def stop_node(self, name: str) -> None:
        node = self.nodes.pop(name)
        node.stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(node.task, timeout=10.0)

    async def close(self) -> None:
        for name in list(self.nodes):
            await self.stop_node(name)
        for master in list(self.masters):
            await self.stop_master(master)

    async def wait_until(self, predicate: Any, *, within: float = 10.0, what: str = "condition") -> None:
        await waiting.eventually(predicate, within=within, what=what)

    def leader(self) -> Master:
        leaders = [m for m in self.masters if m.state.leading]
        assert len(leaders) == 1, f"{len(leaders)} leaders"
        return leaders[0]
