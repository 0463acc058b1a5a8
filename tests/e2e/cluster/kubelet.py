"""One pod on one node, run as podman containers: volumes, init containers, restarts, probes.

Owns a pod's life on its node once the kubelet decided to run it (test harness, not product code):
its volumes on the host, its init containers in order, its containers under supervision
(restarted when they exit, with a short back-off), its probes, and the status a kubelet reports.
The pod's plan comes from :mod:`podspec` (which refuses what cannot be honoured).

Why ``podman run`` per container and not ``podman kube play``: kube play (podman 4.3) takes Pods
and Deployments but not DaemonSets, cannot resolve the downward API fields the operator uses
(``spec.nodeName``, ``status.podIP``), reads Secrets only from podman's own secret store, and
restarts containers itself, out of the harness's sight; the harness needs each of these exact.
Containers of a pod share its netns (``--network ns:...``) as they share a pod sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.cluster import network, podspec
from tests.e2e.cluster.process import ProcessTimeout, run_process
from tests.e2e.images import PODMAN

log = logging.getLogger("e2e.kubelet")

BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)  # a kubelet's is 10 s doubling to 5 min; shortened for tests


class PodmanError(RuntimeError):
    pass


async def podman(*args: str, check: bool = True, within: float = 120.0, merge: bool = False) -> str:
    """podman's stdout (with its stderr after ``merge``: ``podman logs`` replays a container's stderr there)."""
    try:
        done = await run_process(*PODMAN, *args, within=within, merge_stderr=merge)
    except ProcessTimeout:
        raise PodmanError(f"podman {' '.join(args[:3])}... timed out after {within}s") from None
    if check and done.returncode != 0:
        detail = (done.err or done.out).decode().strip()[-2000:]
        raise PodmanError(f"podman {' '.join(args[:2])} exited {done.returncode}: {detail}")
    return done.out.decode()


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerState:
    name: str
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    ready: bool = False
    restarts: int = 0
    last: dict[str, Any] | None = None

    def status(self, image: str) -> dict[str, Any]:
        status = {
            "name": self.name,
            "image": image,
            "ready": self.ready,
            "restartCount": self.restarts,
            "state": self.state,
        }
        if self.last is not None:
            status["lastState"] = {"terminated": self.last}
        return status


@dataclass
class PodRuntime:
    """A pod running on its node; ``start`` it, read ``status()``, ``stop`` it."""

    pod: dict[str, Any]
    plan: podspec.PodPlan
    net: network.PodNet
    pod_dir: Path
    node_root: Path
    hosts_file: Path
    ca_pem: bytes
    label: str
    on_change: Callable[[], None]
    errors: list[str]
    states: dict[str, ContainerState] = field(default_factory=dict)
    timeline: dict[str, float] = field(default_factory=dict)  # first time (epoch s) of "pod", "<c>:run", ...
    phase: str = "Pending"
    initialized: bool = False
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _mounted: list[Path] = field(default_factory=list)
    _stopping: bool = False

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def container_name(self, container: str) -> str:
        return f"{self.net.netns}-{container}"

    def mark(self, event: str) -> None:
        """Record when ``event`` first happened: ``pod`` (kubelet took it), ``<container>:run`` (podman
        run called), ``<container>:running`` (it returned), ``<container>:exited``, ``ready``."""
        self.timeline.setdefault(event, time.time())

    def start(self) -> None:
        self.mark("pod")
        self._prepare_volumes()
        for plan in (*self.plan.init_containers, *self.plan.containers):
            self.states[plan.name] = ContainerState(name=plan.name)
        self._tasks.append(asyncio.create_task(self._run(), name=f"pod {self.key}"))

    async def _run(self) -> None:
        try:
            for init in self.plan.init_containers:
                await self._init_container(init)
            self.initialized = True
            self.phase = "Running"
            for plan in self.plan.containers:
                self._tasks.append(asyncio.create_task(self._supervise(plan), name=f"{self.key} {plan.name}"))
                for probe, readiness in ((plan.readiness, True), (plan.liveness, False)):
                    if probe is not None:
                        self._tasks.append(asyncio.create_task(self._probe(plan, probe, readiness=readiness)))
            self.on_change()
        except Exception as exc:  # a harness failure: the test reports it
            self.errors.append(f"{self.key}: {type(exc).__name__}: {exc}")
            raise

    def _args(self, plan: podspec.ContainerPlan) -> list[str]:
        mounts = [
            f"--mount=type=bind,source={self._volume_path(source)},destination={target}" + (",ro=true" if ro else "")
            for source, target, ro in plan.mounts
        ]
        return [
            "run",
            "-d",
            "--replace",  # the previous run of this container (a restart), in the same podman call
            "--pull=never",
            f"--name={self.container_name(plan.name)}",
            f"--label={self.label}",
            f"--network=ns:{self.net.path}",
            "--no-hosts",
            "--dns=none",
            f"--mount=type=bind,source={self.hosts_file},destination=/etc/hosts,ro=true",
            f"--hostname={self.pod['metadata']['name'][:63]}",
            f"--stop-timeout={plan.stop_timeout}",
            *mounts,
            *plan.args,
        ]

    async def _start_container(self, plan: podspec.ContainerPlan) -> None:
        self.mark(f"{plan.name}:run")
        await podman(*self._args(plan))
        self.mark(f"{plan.name}:running")
        self.states[plan.name].state = {"running": {"startedAt": now()}}
        self.on_change()

    async def _wait(self, plan: podspec.ContainerPlan) -> int:
        out = await podman("wait", self.container_name(plan.name), within=10**7)
        code = int(out.strip().splitlines()[-1])
        self.mark(f"{plan.name}:exited")
        state = self.states[plan.name]
        state.last = {"exitCode": code, "finishedAt": now(), "reason": "Completed" if code == 0 else "Error"}
        state.state = {"terminated": state.last}
        state.ready = False
        self.on_change()
        return code

    async def _init_container(self, plan: podspec.ContainerPlan) -> None:
        attempt = 0
        while True:
            await self._start_container(plan)
            code = await self._wait(plan)
            if code == 0:
                return
            logs = await self.logs(plan.name, tail=20)
            log.warning("init container %s of %s exited %d: %s", plan.name, self.key, code, logs[-1000:])
            self.states[plan.name].restarts += 1
            await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            attempt += 1

    async def _supervise(self, plan: podspec.ContainerPlan) -> None:
        attempt = 0
        while not self._stopping:
            try:
                await self._start_container(plan)
            except PodmanError as exc:
                self.errors.append(f"{self.key} container {plan.name}: {exc}")
                raise
            if plan.readiness is None:
                self.states[plan.name].ready = True
                self.on_change()
            await self._wait(plan)
            if self._stopping:
                return
            self.states[plan.name].restarts += 1
            await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            attempt += 1

    async def _probe(self, plan: podspec.ContainerPlan, probe: podspec.Probe, *, readiness: bool) -> None:
        await asyncio.sleep(probe.initial_delay)
        failures = successes = 0
        state = self.states[plan.name]
        while not self._stopping:
            ok = "running" in state.state and await probe_once(self.net, probe)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if readiness:
                ready = state.ready
                if ok and successes >= probe.successes:
                    ready = True
                elif not ok and failures >= probe.failures:
                    ready = False
                if ready != state.ready:
                    state.ready = ready
                    self.on_change()
            elif failures >= probe.failures and "running" in state.state:
                log.warning("liveness probe of %s %s failed %d times; restarting it", self.key, plan.name, failures)
                await podman("kill", self.container_name(plan.name), check=False)
                failures = 0
            await asyncio.sleep(min(probe.period, 1.0) if not ok and readiness else probe.period)

    def ready(self) -> bool:
        ready = self.initialized and all(self.states[c.name].ready for c in self.plan.containers)
        if ready:
            self.mark("ready")
        return ready

    def status(self) -> dict[str, Any]:
        images = {c.name: c.image for c in (*self.plan.init_containers, *self.plan.containers)}
        ready = "True" if self.ready() else "False"
        return {
            "phase": self.phase,
            "podIP": self.net.address,
            "podIPs": [{"ip": self.net.address}],
            "hostIP": self.pod["status"].get("hostIP") if "status" in self.pod else None,
            "conditions": [
                {"type": "Initialized", "status": "True" if self.initialized else "False"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ],
            "initContainerStatuses": [self.states[c.name].status(images[c.name]) for c in self.plan.init_containers],
            "containerStatuses": [self.states[c.name].status(images[c.name]) for c in self.plan.containers],
        }

    async def kill(self, container: str, *, signal: str = "KILL") -> None:
        """A fault: the container's process dies by ``signal`` (the pod restarts it)."""
        await podman("kill", f"--signal={signal}", self.container_name(container))

    async def logs(self, container: str, *, tail: int = 50) -> str:
        """The last ``tail`` lines the container wrote to stdout and stderr (podman 4.3's ``logs
        --tail`` prints nothing for short logs, so the tail is taken here)."""
        out = await podman("logs", self.container_name(container), check=False, merge=True)
        return "\n".join(out.splitlines()[-tail:])

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        names = [self.container_name(c.name) for c in (*self.plan.init_containers, *self.plan.containers)]
        await podman("rm", "-f", "-t", str(self.plan.containers[0].stop_timeout), *names, check=False)
        await asyncio.to_thread(self._remove_volumes)

    def _remove_volumes(self) -> None:
        for path in reversed(self._mounted):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        shutil.rmtree(self.pod_dir, ignore_errors=True)

    def _volume_path(self, source: str) -> Path:
        name, _, sub = source.partition("/")
        volume = next(v for v in self.plan.volumes if v.name == name)
        base = self.node_root / volume.host_path.lstrip("/") if volume.kind == "hostPath" else self.pod_dir / name
        return base / sub if sub else base

    def _prepare_volumes(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        for volume in self.plan.volumes:
            path = self._volume_path(volume.name)
            if volume.kind == "hostPath":
                _host_path(path, volume.host_type, where=f"{self.key} volume {volume.name}")
                continue
            path.mkdir(parents=True, exist_ok=True)
            if volume.kind == "emptyDir":
                if volume.size_bytes is not None:
                    subprocess.run(
                        ["mount", "-t", "tmpfs", "-o", f"size={volume.size_bytes}", "tmpfs", str(path)], check=True
                    )
                    self._mounted.append(path)
                os.chmod(path, 0o2777 if volume.group is not None else 0o777)
            files = dict(volume.files)
            if volume.kind == "serviceAccount":
                files["ca.crt"] = (self.ca_pem, 0o644)
            for relative, (data, mode) in files.items():
                target = path / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                os.chmod(target, mode)
                if volume.group is not None:
                    os.chown(target, -1, volume.group)
            if volume.group is not None:
                os.chown(path, -1, volume.group)


def _host_path(path: Path, kind: str, *, where: str) -> None:
    if kind in ("", "DirectoryOrCreate"):
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "Directory" and not path.is_dir():
        raise podspec.Missing(f"{where}: hostPath directory {path} does not exist")
    elif kind == "File" and not path.is_file():
        raise podspec.Missing(f"{where}: hostPath file {path} does not exist")
    elif kind == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)


async def probe_once(net: network.PodNet, probe: podspec.Probe) -> bool:
    """One probe of ``net``'s pod from its own netns, as the kubelet probes the pod IP."""
    try:
        if probe.kind == "tcp":
            async with asyncio.timeout(probe.timeout):
                sock = await connect_in(net.netns, net.address, probe.port)
            sock.close()
            return True
        status, _ = await http_get_in(net.netns, net.address, probe.port, probe.path, within=probe.timeout)
    except (OSError, TimeoutError, ValueError):
        return False
    return 200 <= status < 400


async def connect_in(netns_name: str, host: str, port: int) -> Any:
    """A TCP socket connected to ``host:port`` from inside netns ``netns_name``."""
    sock = await asyncio.to_thread(network.socket_in, netns_name)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def http_get_in(
    netns_name: str, host: str, port: int, path: str, *, within: float = 5.0, token: str | None = None
) -> tuple[int, bytes]:
    """``GET path`` from inside netns ``netns_name``: (status, body)."""
    async with asyncio.timeout(within):
        sock = await connect_in(netns_name, host, port)
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            auth = f"Authorization: Bearer {token}\r\n" if token else ""
            writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n{auth}\r\n".encode())
            response = await reader.read()
        finally:
            writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), body
