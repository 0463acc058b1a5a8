"""A cluster-free node cache on 127.0.0.1: two cache master replicas and N cache agents as OS processes.

Owns the processes of ``ringseed local checkpoint`` and of the cache fault tests: start, SIGKILL
and restart agents and masters, find the leader, read status, and give a writer process what
it needs to reach its node (``env_for``). Child processes, logs, kills and cleanup are
:class:`ringseed.local.swarm.LocalSwarm`'s (this extends it).

Rules:
- Masters ``master-0`` and ``master-1`` share a lock directory (``<workdir>/lock``): the one
  holding the lock leads, the other follows. Agents are given both URLs.
- Node ``node-<i>`` keeps its memory tier under ``<shm>/node-<i>`` (``/dev/shm`` when it exists,
  so the memory tier is really memory) and its SSD tier under ``<workdir>/nodes/node-<i>/ssd``;
  its socket is ``<sockets>/node-<i>.sock`` (a short path: Unix socket names are limited).
  A restarted agent finds its chunks again. :meth:`close` removes the shm and socket directories.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ringseed.local import swarm

MiB = 1 << 20


class CacheSwarm(swarm.LocalSwarm):
    """Cache masters + agents as child processes; use as a context manager."""

    def __init__(
        self,
        *,
        nodes: int,
        workdir: Path,
        replicas: int = 2,
        memory_bytes: int = 512 * MiB,
        ssd_bytes: int = 1024 * MiB,
        chunk_size: int = 32 * MiB,
        sink: str | None = None,
        persist_rate_limit: int | None = None,
        masters: int = 2,
        keep: int = 0,
        heartbeat_interval: float = 0.25,
        offline_after: float = 3.0,
        data: dict[str, str] | None = None,
        list_ttl: float | None = None,
    ) -> None:
        super().__init__(
            source="",
            nodes=nodes,
            workdir=workdir,
            chunk_size=chunk_size,
            memory_bytes=memory_bytes,
            heartbeat_interval=heartbeat_interval,
            offline_after=offline_after,
        )
        self.replicas = replicas
        self.ssd_bytes = ssd_bytes
        self.sink = sink
        self.persist_rate_limit = persist_rate_limit
        self.keep = keep
        self.data = dict(data or {})
        self.list_ttl = list_ttl
        self.master_ports = [swarm.free_port() for _ in range(masters)]
        self.master_urls = [f"http://127.0.0.1:{p}" for p in self.master_ports]
        self.agent_ports = {name: swarm.free_port() for name in self.names}
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        self.shm_dir = Path(tempfile.mkdtemp(prefix="ringseed-cache-", dir=shm))
        self.socket_dir = Path(tempfile.mkdtemp(prefix="rs-"))

    def __enter__(self) -> CacheSwarm:
        return self

    # -- processes ---------------------------------------------------------------------------------

    def start(self) -> None:
        for index in range(len(self.master_ports)):
            self.start_master(index)
        for name in self.names:
            self.start_agent(name)

    def start_master(self, index: int = 0) -> None:
        port = self.master_ports[index]
        argv = ["master", "--role", "cache", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--advertise-url", self.master_urls[index], "--lock-dir", str(self.workdir / "lock")]
        argv += ["--replicas", str(self.replicas), "--keep", str(self.keep), "--follower-timeout", "2"]
        argv += ["--offline-after", str(self.offline_after), "--heartbeat-interval", str(self.heartbeat_interval)]
        if self.sink:
            argv += ["--sink", self.sink]
        self._spawn(f"master-{index}", argv)

    def socket(self, name: str) -> Path:
        return self.socket_dir / f"{name}.sock"

    def agent_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.agent_ports[name]}"

    def start_agent(self, name: str, *, env: Mapping[str, str] | None = None, module: str = "ringseed.cli") -> None:
        argv = ["agent", "--role", "cache", "--master-url", ",".join(self.master_urls), "--node-name", name]
        argv += ["--advertise-host", "127.0.0.1", "--host", "127.0.0.1", "--port", str(self.agent_ports[name])]
        argv += ["--socket", str(self.socket(name)), "--memory-dir", str(self.shm_dir / name)]
        argv += ["--memory-bytes", str(self.memory_bytes), "--chunk-size", str(self.chunk_size)]
        argv += ["--ssd-dir", str(self.node_dir(name) / "ssd"), "--ssd-bytes", str(self.ssd_bytes)]
        if self.sink:
            argv += ["--sink", self.sink]
        if self.persist_rate_limit:
            argv += ["--persist-rate-limit", str(self.persist_rate_limit)]
        for source, uri in self.data.items():
            argv += ["--data", f"{source}={uri}"]
        if self.list_ttl is not None:
            argv += ["--list-ttl", str(self.list_ttl)]
        self._spawn(name, argv, env, module=module)

    def env_for(self, name: str) -> dict[str, str]:
        """What a writer process on node ``name`` needs in its environment."""
        return {"RINGSEED_CACHE_SOCKET": str(self.socket(name)), "RINGSEED_TOKEN": self.token}

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.shm_dir, ignore_errors=True)
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    # -- observation ---------------------------------------------------------------------------------

    def _get(self, url: str, *, timeout: float = 5.0) -> Any:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def leader(self) -> int | None:
        """Index of the leading master replica (None while there is none)."""
        for index, url in enumerate(self.master_urls):
            status = self._get(url + "/v1/status")
            if status and status.get("leading"):
                self.master_url = url
                return index
        return None

    def status(self) -> dict[str, Any] | None:
        if self.leader() is None:
            return None
        return super().status()

    def agent_status(self, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._get(self.agent_url(name) + "/v1/status")
        return result

    def wait_ready(self, *, timeout: float = 60.0, names: list[str] | None = None) -> dict[str, Any]:
        """Until a leader runs and every named agent is registered with it."""
        want = set(names or [n for n in self.names if n in self.procs])
        return self.wait_for(lambda s: want <= set(s.get("nodes", [])), timeout=timeout, what=f"agents {sorted(want)}")

    def wait_follower(self, *, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            index = self.leader()
            status = self._get(self.master_urls[index] + "/v1/status") if index is not None else None
            if status and status.get("follower_in_sync"):
                return
            self.check_alive()
            time.sleep(0.1)
        raise TimeoutError(f"no follower in sync after {timeout:.0f}s")
