"""Fixtures for the operator's component tests: KMock (our emulator), fake masters, a running operator.

The operator under test is the real one (``ringseed.operator.command.operate``: kopf with
ringseed's handlers) talking HTTP to KMock on loopback; masters are HTTP servers on loopback
speaking the master's ``/v1/status`` API (:class:`FakeMasters`, or the real tracker app).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kmock as kmock_lib
import kopf
import pytest
from aiohttp import web

from ringseed.api import constants
from ringseed.operator import command, masters
from ringseed.operator import config as config_module
from tests.component.operator.emulator import Emulator
from tests.waiting import eventually

NS = "ml"
INTERVAL = 0.2  # status timer interval in these tests
MD_RES = f"{constants.GROUP}/{constants.VERSION}/{constants.MD_PLURAL}"
TG_RES = f"{constants.GROUP}/{constants.VERSION}/{constants.TG_PLURAL}"
VERBS = {"list", "watch", "get", "create", "patch", "update", "delete"}
BUILTINS = {
    "v1/namespaces": ("Namespace", False),
    "v1/events": ("Event", True),
    "v1/nodes": ("Node", False),
    "v1/secrets": ("Secret", True),
    "v1/services": ("Service", True),
    "v1/pods": ("Pod", True),
    "apps/v1/deployments": ("Deployment", True),
    "apps/v1/daemonsets": ("DaemonSet", True),
    "monitoring.coreos.com/v1/podmonitors": ("PodMonitor", True),
    "v1/serviceaccounts": ("ServiceAccount", True),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True),
}


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any], request: pytest.FixtureRequest) -> dict[str, Any]:
    """Our :class:`Emulator`, unless the test's ``kmock`` mark names another class."""
    marked = [m.kwargs["cls"] for m in request.node.iter_markers("kmock") if "cls" in m.kwargs]
    return {**kmock_options, "cls": marked[0] if marked else Emulator}


def declare(kmock: Any) -> None:
    """Declare every resource the operator uses, with the verbs kopf checks."""
    for path, (kind, namespaced) in BUILTINS.items():
        kmock.resources[path] = kmock_lib.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS)
    for path, kind, short in ((MD_RES, constants.MD_KIND, "md"), (TG_RES, constants.TG_KIND, "tg")):
        kmock.resources[path] = kmock_lib.ResourceInfo(
            kind=kind, namespaced=True, verbs=VERBS, subresources={"status"}, shortnames={short}
        )
    kmock.objects["v1/namespaces", None, NS] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}


@dataclass
class FakeMasters:
    """One HTTP server answering ``/<namespace>/<name>/v1/status`` like the masters would.

    ``reports[(ns, name)]`` is the JSON to answer; a missing entry or ``None`` answers 503 (the
    master is down). ``tokens[(ns, name)]`` records the bearer token of the last request.
    """

    reports: dict[tuple[str, str], Mapping[str, Any] | None] = field(default_factory=dict)
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        self.tokens[key] = request.headers.get("Authorization", "").removeprefix("Bearer ")
        report = self.reports.get(key)
        if report is None:
            return web.json_response({"error": "down", "reason": "the test says so"}, status=503)
        return web.json_response(dict(report))


@pytest.fixture
async def fake_masters() -> AsyncIterator[FakeMasters]:
    fake = FakeMasters()
    app = web.Application()
    app.router.add_get("/{namespace}/{name}/v1/status", fake.handle)
    async with serve(app) as url:
        fake.url = url
        yield fake


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def tune(settings: Any) -> None:
    """Short kopf retry backoffs, so that stopping never waits on a sleeping retry."""
    settings.networking.error_backoffs = [0.1, 0.2, 0.5]


@dataclass
class Operator:
    """A running operator in its own thread and event loop; ``restart`` starts a fresh one.

    Its own loop because kopf, when stopping, waits for (then cancels) every task of its loop,
    which would include KMock's and the fake masters' server tasks.
    """

    kmock: Any
    fake: FakeMasters
    mapping: dict[str, str]
    thread: threading.Thread | None = None
    errors: list[BaseException] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[None] | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # OperatorConfig fields to override

    async def start(self) -> None:
        config = config_module.OperatorConfig(status_interval_seconds=INTERVAL, **self.settings)
        locator = masters.Locator(template=f"{self.fake.url}/{{namespace}}/{{name}}", mapping=self.mapping)
        server = str(self.kmock.url).rstrip("/")
        ready = threading.Event()
        coroutine = command.operate(
            config=config,
            login=lambda: kopf.ConnectionInfo(server=server),
            namespaces=[],  # cluster-wide: KMock 0.8 cannot parse GET /api/v1/namespaces
            locator=locator,
            degraded_after=1.0,
            cleanup_timeout=3.0,
            ready_flag=ready,
            tune=tune,
        )
        self.thread = threading.Thread(target=self._run, args=(coroutine,), name="operator", daemon=True)
        self.thread.start()
        assert await asyncio.to_thread(ready.wait, 20), "the operator did not get ready in 20 s"

    def _run(self, coroutine: Any) -> None:
        loop = asyncio.new_event_loop()
        self.loop, self.task = loop, loop.create_task(coroutine)
        try:
            loop.run_until_complete(self.task)
        except BaseException as exc:  # reported by halt()
            self.errors.append(exc)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def halt(self) -> None:
        """Cancel the operator (kopf then cancels its pending tasks at once, where a stop flag
        would give kopf's in-flight API retries 5 s to finish)."""
        if self.thread is None or self.loop is None or self.task is None:
            return
        self.loop.call_soon_threadsafe(self.task.cancel)
        await asyncio.to_thread(self.thread.join, 20)
        assert not self.thread.is_alive(), "the operator did not stop in 20 s"
        self.thread = None
        assert not [e for e in self.errors if not isinstance(e, asyncio.CancelledError)], self.errors

    async def restart(self) -> None:
        await self.halt()
        await self.start()


@pytest.fixture
async def operator(kmock: Any, fake_masters: FakeMasters) -> AsyncIterator[Operator]:
    declare(kmock)
    op = Operator(kmock=kmock, fake=fake_masters, mapping={})
    await op.start()
    try:
        yield op
    finally:
        await op.halt()


def get(kmock: Any, resource: str, name: str, namespace: str | None = NS) -> dict[str, Any] | None:
    """The stored object, or None when absent or deleted."""
    try:
        obj = kmock.objects[resource, namespace, name]
    except KeyError:  # KMock's `in` does not parse "group/version/plural" keys; indexing does
        return None
    if obj.deleted:
        return None
    raw: dict[str, Any] = obj.raw
    return raw


async def create(kmock: Any, resource: str, obj: Mapping[str, Any]) -> None:
    """Create an object through the HTTP API (as kubectl would), so watchers see it."""
    group_version, plural = resource.rsplit("/", 1)
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    namespace = obj["metadata"].get("namespace")
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    response = await kmock.post(path, json=dict(obj))
    assert response.status < 300, await response.text()


async def patch(kmock: Any, resource: str, name: str, body: Mapping[str, Any], namespace: str | None = NS) -> None:
    group_version, plural = resource.rsplit("/", 1)
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}/{name}" if namespace else f"{prefix}/{plural}/{name}"
    response = await kmock.patch(path, json=dict(body), headers={"Content-Type": "application/merge-patch+json"})
    assert response.status < 300, await response.text()


async def delete(kmock: Any, resource: str, name: str, namespace: str | None = NS) -> None:
    group_version, plural = resource.rsplit("/", 1)
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}/{name}" if namespace else f"{prefix}/{plural}/{name}"
    response = await kmock.delete(path)
    assert response.status < 300, await response.text()


def model_distribution(name: str, *, uri: str = "s3://models/llama", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.MD_KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"source": {"uri": uri}, **spec},
    }


def training_group(name: str, *, model: str | None = None, min_peers: int = 2) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "minPeers": min_peers,
        "template": {"spec": {"containers": [{"name": "train", "image": "example/train:1", "command": ["python"]}]}},
    }
    if model:
        spec["modelRef"] = {"name": model}
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.TG_KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def tracker_report(
    *, total: int, ready: int, failed: int = 0, verified: tuple[str, ...] = (), total_bytes: int = 1000, held: int = 0
) -> dict[str, Any]:
    nodes = {
        f"node-{i}": {
            "chunks": 0,
            "bytes": total_bytes if f"node-{i}" in verified else held,
            "complete": f"node-{i}" in verified,
            "verified": f"node-{i}" in verified,
            "online": True,
            "throughput_bps": 1.0,
        }
        for i in range(total)
    }
    return {
        "role": "tracker",
        "total_bytes": total_bytes,
        "total_chunks": 10,
        "nodes_total": total,
        "nodes_ready": ready,
        "nodes_failed": failed,
        "bytes_from_origin": 500,
        "throughput_bps": 2 * 1024 * 1024,
        "eta_seconds": 90.0,
        "manifest_digest": "ab" * 32,
        "nodes": nodes,
    }


async def schedule_agents(kmock: Any, name: str, nodes: Sequence[str], *, rolled_out: bool = True) -> None:
    """Play the DaemonSet controller for ``<name>-agent`` (KMock has none): its pods are bound to
    exactly ``nodes`` (pods on other nodes are deleted) and its status says so."""
    daemonset = await eventually(lambda: get(kmock, "apps/v1/daemonsets", f"{name}-agent"), what=f"{name}-agent")
    meta = daemonset["metadata"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    for pod_name, pod in list(pods_of(kmock, meta["uid"]).items()):
        if pod["spec"]["nodeName"] not in nodes:
            await delete(kmock, "v1/pods", pod_name)
    present = {pod["spec"]["nodeName"] for pod in pods_of(kmock, meta["uid"]).values()}
    for node in nodes:
        if node in present:
            continue
        owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta["name"], "uid": meta["uid"]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-agent-{node}", "namespace": NS, "labels": labels, "ownerReferences": [owner]},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "ringseed"}]},
        }
        await create(kmock, "v1/pods", pod)
    count = len(nodes)
    ds_status = {
        "observedGeneration": meta.get("generation", 1),
        "desiredNumberScheduled": count,
        "currentNumberScheduled": count,
        "updatedNumberScheduled": count if rolled_out else max(0, count - 1),
        "numberReady": count,
    }
    await patch(kmock, "apps/v1/daemonsets", f"{name}-agent", {"status": ds_status})


def pods_of(kmock: Any, uid: str) -> dict[str, dict[str, Any]]:
    """Live pods owned by the object with ``uid``, by name."""
    return {
        name: obj.raw
        for (resource, _, name), obj in list(kmock.objects.items())
        if resource.plural == "pods"
        and not obj.deleted
        and any(ref.get("uid") == uid for ref in obj.raw["metadata"].get("ownerReferences", []))
    }
