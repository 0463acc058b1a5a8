"""The emulated cluster: controllers and kubelets over KMock, pods as podman containers in netns.

Owns the control loops a real cluster would run around the API server (test harness, not
product code): it watches KMock over HTTP (list + watch, as informers do) and
- schedules Deployment pods (one per replica; Recreate on a template change) and DaemonSet pods
  (one per node whose labels match the node selector, including labels the operator sets later;
  RollingUpdate one node at a time), creating Pod objects bound to nodes;
- runs each node's pods (:mod:`kubelet`, :mod:`podspec`) and writes Pod, Deployment and DaemonSet
  status back (phase, podIP, container states and restart counts, ``desiredNumberScheduled``,
  ``numberReady``, ready replicas, ``observedGeneration``);
- resolves Service names to the ready pods behind them (a hosts file every container mounts), with
  the Service port equal to the target port (anything else is a harness error);
- deletes objects whose owners are gone (the garbage collector; background propagation), with
  pods owned by their Deployment directly (no ReplicaSets).

Anything a pod spec asks for that cannot be honoured lands in ``errors`` (the test fails on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets as secrets_lib
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.cluster import apiserver, kubelet, network, podspec

log = logging.getLogger("e2e.cluster")
WATCHED = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "services": "/api/v1/services",
    "secrets": "/api/v1/secrets",
    "configmaps": "/api/v1/configmaps",
    "deployments": "/apis/apps/v1/deployments",
    "daemonsets": "/apis/apps/v1/daemonsets",
    "modeldistributions": "/apis/ringseed.io/v1alpha1/modeldistributions",
    "traininggroups": "/apis/ringseed.io/v1alpha1/traininggroups",
}
OWNED = ("pods", "services", "secrets", "configmaps", "deployments", "daemonsets")
GC_GRACE = 2.0
ALLOCATABLE_CPU, ALLOCATABLE_MEMORY = 16.0, 64 << 30  # each node's, as its Node object says


def key_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])


def template_hash(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def path_of(resource: str, namespace: str | None, name: str | None = None) -> str:
    base = WATCHED[resource]
    if namespace:
        group, plural = base.rsplit("/", 1)
        base = f"{group}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


@dataclass
class Informer:
    """A list + watch of one resource into ``objects`` (namespace, name) -> object."""

    session: aiohttp.ClientSession
    base: str
    path: str
    on_event: Callable[[], None]
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    seen: dict[tuple[str, str], float] = field(default_factory=dict)  # when each object was first seen (epoch s)
    synced: bool = False

    async def run(self) -> None:
        while True:
            try:
                async with self.session.get(self.base + self.path) as response:
                    body = await response.json()
                self.objects = {key_of(o): o for o in body.get("items", [])}
                for key in self.objects:
                    self.seen.setdefault(key, time.time())
                self.synced = True
                self.on_event()
                params = {"watch": "true", "resourceVersion": body["metadata"]["resourceVersion"]}
                timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
                async with self.session.get(self.base + self.path, params=params, timeout=timeout) as response:
                    async for line in response.content:
                        if line.strip():
                            self._apply(json.loads(line))
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.debug("watch %s broke (%s); listing again", self.path, exc)
                await asyncio.sleep(0.2)

    def _apply(self, event: Mapping[str, Any]) -> None:
        obj = event["object"]
        if event["type"] == "DELETED" or (
            obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers")
        ):
            self.objects.pop(key_of(obj), None)
        else:
            self.objects[key_of(obj)] = obj
            self.seen.setdefault(key_of(obj), time.time())
        self.on_event()


@dataclass
class Cluster:
    """Controllers and kubelets for ``net``'s nodes against the API at ``api_url`` (KMock)."""

    net: network.ClusterNetwork
    api_url: str
    work: Path
    certs: apiserver.Certificates
    tokens: apiserver.Tokens
    label: str
    image_ids: Mapping[str, str] = field(default_factory=dict)  # image name -> ID (what the nodes "pulled")
    errors: list[str] = field(default_factory=list)
    informers: dict[str, Informer] = field(default_factory=dict)
    runtimes: dict[str, kubelet.PodRuntime] = field(default_factory=dict)  # pod uid -> runtime
    waiting: dict[str, str] = field(default_factory=dict)  # pod uid -> why it cannot start yet
    _session: aiohttp.ClientSession | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stops: list[asyncio.Task[None]] = field(default_factory=list)  # pods being stopped: awaited, never cancelled
    _written: dict[str, Any] = field(default_factory=dict)
    _orphaned_since: dict[str, float] = field(default_factory=dict)
    _image_users: dict[str, str] = field(default_factory=dict)
    _hosts: str = ""

    @property
    def hosts_file(self) -> Path:
        return self.work / "hosts"

    async def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.hosts_file.write_text("127.0.0.1 localhost\n")
        self._session = aiohttp.ClientSession(headers={"Content-Type": "application/json"})
        for node in self.net.node_names():
            await self.create("nodes", None, _node(node, self.net.node_address(node)))
        for resource, path in WATCHED.items():
            informer = Informer(self._session, self.api_url, path, self._wake.set)
            self.informers[resource] = informer
            self._tasks.append(asyncio.create_task(informer.run(), name=f"informer {resource}"))
        self._tasks.append(asyncio.create_task(self._loop(), name="controllers"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        await asyncio.gather(*self._stops, return_exceptions=True)
        await asyncio.gather(*(runtime.stop() for runtime in self.runtimes.values()), return_exceptions=True)
        self.runtimes.clear()
        await asyncio.to_thread(unmount_under, self.work)
        if self._session is not None:
            await self._session.close()

    # --- API calls -----------------------------------------------------------------------------
    async def _call(self, method: str, path: str, body: Any = None, *, merge: bool = False) -> dict[str, Any]:
        assert self._session is not None
        headers = {"Content-Type": "application/merge-patch+json"} if merge else {}
        async with self._session.request(method, self.api_url + path, json=body, headers=headers) as response:
            text = await response.text()
            if response.status >= 300 and not (method == "DELETE" and response.status == 404):
                raise RuntimeError(f"{method} {path}: HTTP {response.status}: {text[:500]}")
            return json.loads(text) if text else {}

    async def create(self, resource: str, namespace: str | None, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self._call("POST", path_of(resource, namespace), obj)

    async def patch(self, resource: str, namespace: str | None, name: str, body: Mapping[str, Any]) -> None:
        await self._call("PATCH", path_of(resource, namespace, name), body, merge=True)

    async def delete(self, resource: str, namespace: str | None, name: str) -> None:
        await self._call("DELETE", path_of(resource, namespace, name))

    def objects(self, resource: str) -> Iterable[dict[str, Any]]:
        return list(self.informers[resource].objects.values())

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.informers[resource].objects.get((namespace, name))

    # --- the loop ------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not all(i.synced for i in self.informers.values()):
                continue
            try:
                await self._reconcile()
            except Exception as exc:
                log.exception("reconcile failed")
                self.errors.append(f"reconcile: {type(exc).__name__}: {exc}")
            await asyncio.sleep(0.05)
            if self.waiting:
                asyncio.get_running_loop().call_later(0.5, self._wake.set)

    async def _reconcile(self) -> None:
        await self._deployments()
        await self._daemonsets()
        await self._kubelets()
        await self._pod_statuses()
        await self._owner_statuses()
        self._services()
        await self._collect_garbage()

    def _owned_pods(self, owner: Mapping[str, Any]) -> list[dict[str, Any]]:
        uid = owner["metadata"]["uid"]
        return [
            p
            for p in self.objects("pods")
            if any(ref.get("uid") == uid for ref in p["metadata"].get("ownerReferences", []))
        ]

    def _nodes_for(self, pod_spec: Mapping[str, Any]) -> list[str]:
        selector = pod_spec.get("nodeSelector", {})
        return sorted(
            n["metadata"]["name"] for n in self.objects("nodes") if matches(selector, n["metadata"].get("labels", {}))
        )

    async def _new_pod(self, owner: Mapping[str, Any], kind: str, *, node: str, revision: str) -> None:
        template = owner["spec"]["template"]
        namespace, name = key_of(owner)
        labels = {**template.get("metadata", {}).get("labels", {}), "controller-revision-hash": revision}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{revision[:5]}-{secrets_lib.token_hex(3)}",
                "namespace": namespace,
                "labels": labels,
                "annotations": dict(template.get("metadata", {}).get("annotations", {})),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": kind,
                        "name": name,
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {**template["spec"], "nodeName": node},
            "status": {"phase": "Pending", "hostIP": self.net.node_address(node)},
        }
        await self.create("pods", namespace, pod)

    async def _deployments(self) -> None:
        for deployment in self.objects("deployments"):
            revision = template_hash(deployment["spec"]["template"])
            pods = self._owned_pods(deployment)
            old = [p for p in pods if p["metadata"]["labels"].get("controller-revision-hash") != revision]
            for pod in old:  # Recreate: the old pods go before a new one starts
                await self.delete("pods", *key_of(pod))
            current = [p for p in pods if p not in old]
            missing = int(deployment["spec"].get("replicas", 1)) - len(current)
            if old or missing <= 0:
                continue
            candidates = self._nodes_for(deployment["spec"]["template"]["spec"])
            if not candidates:
                continue
            load = {n: sum(1 for p in self.objects("pods") if p["spec"].get("nodeName") == n) for n in candidates}
            for _ in range(missing):
                node = min(candidates, key=lambda n: (load[n], n))
                load[node] += 1
                await self._new_pod(deployment, "Deployment", node=node, revision=revision)

    async def _daemonsets(self) -> None:
        for daemonset in self.objects("daemonsets"):
            revision = template_hash(daemonset["spec"]["template"])
            wanted = set(self._nodes_for(daemonset["spec"]["template"]["spec"]))
            pods = self._owned_pods(daemonset)
            on_node: dict[str, list[dict[str, Any]]] = {}
            for pod in pods:
                on_node.setdefault(pod["spec"]["nodeName"], []).append(pod)
            for node, node_pods in on_node.items():
                extra = node_pods if node not in wanted else node_pods[1:]
                for pod in extra:
                    await self.delete("pods", *key_of(pod))
            for node in sorted(wanted - set(on_node)):
                await self._new_pod(daemonset, "DaemonSet", node=node, revision=revision)
            outdated = [
                p
                for n, ps in on_node.items()
                if n in wanted
                for p in ps[:1]
                if p["metadata"]["labels"].get("controller-revision-hash") != revision
            ]
            unready = [p for p in pods if not self._pod_ready(p)]
            if outdated and not [p for p in unready if p not in outdated]:  # maxUnavailable 1
                await self.delete("pods", *key_of(outdated[0]))

    def _pod_ready(self, pod: Mapping[str, Any]) -> bool:
        runtime = self.runtimes.get(pod["metadata"]["uid"])
        return runtime is not None and runtime.ready()

    # --- kubelets ------------------------------------------------------------------------------
    async def _kubelets(self) -> None:
        nodes = set(self.net.node_names())
        live = {p["metadata"]["uid"]: p for p in self.objects("pods") if p["spec"].get("nodeName") in nodes}
        for uid in list(self.runtimes):
            if uid not in live:
                runtime = self.runtimes.pop(uid)
                self._stops.append(asyncio.create_task(self._stop(runtime, uid)))
        for uid, pod in live.items():
            if uid not in self.runtimes:
                await self._start_pod(pod)

    async def _stop(self, runtime: kubelet.PodRuntime, uid: str) -> None:
        await runtime.stop()
        self.net.remove_pod(uid)

    async def _start_pod(self, pod: dict[str, Any]) -> None:
        uid, node = pod["metadata"]["uid"], pod["spec"]["nodeName"]
        namespace = pod["metadata"].get("namespace", "default")
        for image in {c["image"] for c in (*pod["spec"].get("initContainers", []), *pod["spec"]["containers"])}:
            if image not in self._image_users:
                ref = self.image_ids.get(image, image)
                out = await kubelet.podman("image", "inspect", "--format", "{{.Config.User}}", ref, check=False)
                self._image_users[image] = out.strip()
        account = pod["spec"].get("serviceAccountName") or "default"
        facts = podspec.NodeFacts(
            node=node,
            host_ip=self.net.node_address(node),
            node_root=str(self._node_root(node)),
            api_host=self.net.control_address,
            api_port=apiserver.PORT,
        )
        net = self.net.add_pod(uid, node=node)
        inputs = podspec.Inputs(
            pod=pod,
            node=facts,
            pod_ip=net.address,
            secrets={n: o for (ns, n), o in self.informers["secrets"].objects.items() if ns == namespace},
            config_maps={n: o for (ns, n), o in self.informers["configmaps"].objects.items() if ns == namespace},
            services=[_service_link(s) for s in self.objects("services") if key_of(s)[0] == namespace],
            image_users=self._image_users,
            image_ids=self.image_ids,
            service_account_token=self.tokens.token_for(namespace, account),
        )
        try:
            plan = podspec.plan(inputs)
            runtime = kubelet.PodRuntime(
                pod=pod,
                plan=plan,
                net=net,
                pod_dir=self.work / "pods" / uid,
                node_root=self._node_root(node),
                hosts_file=self.hosts_file,
                ca_pem=self.certs.ca.read_bytes(),
                label=self.label,
                on_change=self._wake.set,
                errors=self.errors,
            )
            runtime.start()
        except podspec.Missing as exc:
            self.net.remove_pod(uid)
            self.waiting[uid] = str(exc)
            return
        except podspec.Unsupported as exc:
            self.net.remove_pod(uid)
            if str(exc) not in self.errors:
                self.errors.append(str(exc))
            return
        self.waiting.pop(uid, None)
        self.runtimes[uid] = runtime
        self._check_requests(node)

    def _check_requests(self, node: str) -> None:
        """Resource requests are a scheduler's business: the pods of a node must fit its allocatable."""
        here = [r for r in self.runtimes.values() if r.net.node == node]
        cpu, memory = sum(r.plan.cpu_request for r in here), sum(r.plan.memory_request for r in here)
        if cpu > ALLOCATABLE_CPU or memory > ALLOCATABLE_MEMORY:
            self.errors.append(f"{node}: pods request {cpu} CPUs and {memory} bytes, more than it has")

    def _node_root(self, node: str) -> Path:
        return self.work / "nodes" / node

    def node_path(self, node: str, path: str) -> Path:
        """Where node path ``path`` (a hostPath) lies on this machine."""
        return self._node_root(node) / path.lstrip("/")

    # --- status --------------------------------------------------------------------------------
    async def _write_status(self, resource: str, obj: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        marker = f"{resource}/{obj['metadata']['uid']}"
        if self._written.get(marker) == status:
            return
        self._written[marker] = status
        try:
            namespace, name = key_of(obj)
            await self._call(
                "PATCH", path_of(resource, namespace, name) + "/status", {"status": dict(status)}, merge=True
            )
        except RuntimeError as exc:  # deleted meanwhile
            log.debug("status of %s not written: %s", marker, exc)

    async def _pod_statuses(self) -> None:
        for pod in self.objects("pods"):
            runtime = self.runtimes.get(pod["metadata"]["uid"])
            if runtime is not None:
                await self._write_status("pods", pod, runtime.status())
            elif pod["metadata"]["uid"] in self.waiting:
                status = {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "ContainerCreating",
                            "message": self.waiting[pod["metadata"]["uid"]],
                        }
                    ],
                }
                await self._write_status("pods", pod, status)

    async def _owner_statuses(self) -> None:
        for daemonset in self.objects("daemonsets"):
            revision = template_hash(daemonset["spec"]["template"])
            pods = self._owned_pods(daemonset)
            wanted = set(self._nodes_for(daemonset["spec"]["template"]["spec"]))
            ready = [p for p in pods if self._pod_ready(p)]
            updated = [p for p in pods if p["metadata"]["labels"].get("controller-revision-hash") == revision]
            status = {
                "desiredNumberScheduled": len(wanted),
                "currentNumberScheduled": len({p["spec"]["nodeName"] for p in pods} & wanted),
                "numberMisscheduled": len({p["spec"]["nodeName"] for p in pods} - wanted),
                "numberReady": len(ready),
                "numberAvailable": len(ready),
                "numberUnavailable": max(0, len(wanted) - len(ready)),
                "updatedNumberScheduled": len(updated),
                "observedGeneration": daemonset["metadata"].get("generation", 1),
            }
            await self._write_status("daemonsets", daemonset, status)
        for deployment in self.objects("deployments"):
            pods = self._owned_pods(deployment)
            ready = [p for p in pods if self._pod_ready(p)]
            status = {
                "replicas": len(pods),
                "readyReplicas": len(ready),
                "availableReplicas": len(ready),
                "updatedReplicas": len(pods),
                "observedGeneration": deployment["metadata"].get("generation", 1),
            }
            await self._write_status("deployments", deployment, status)

    # --- services and the garbage collector ----------------------------------------------------
    def _services(self) -> None:
        lines = [
            "127.0.0.1 localhost",
            f"{self.net.control_address} kubernetes kubernetes.default kubernetes.default.svc",
        ]
        for service in self.objects("services"):
            namespace, name = key_of(service)
            selector = service["spec"].get("selector") or {}
            ready = [
                p
                for p in self.objects("pods")
                if key_of(p)[0] == namespace
                and self._pod_ready(p)
                and matches(selector, p["metadata"].get("labels", {}))
            ]
            if not selector or not ready:
                continue
            pod = sorted(ready, key=lambda p: p["metadata"]["name"])[0]
            self._check_ports(service, pod)
            address = self.runtimes[pod["metadata"]["uid"]].net.address
            lines.append(f"{address} {name}.{namespace} {name}.{namespace}.svc {name}.{namespace}.svc.cluster.local")
        text = "\n".join(lines) + "\n"
        if text != self._hosts:
            with open(self.hosts_file, "r+") as f:  # in place: containers bind-mount this very file
                f.write(text)
                f.truncate()
            self._hosts = text

    def _check_ports(self, service: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
        named = {
            p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", []) if "name" in p
        }
        for port in service["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            number = named.get(target) if isinstance(target, str) else int(target)
            if number != port["port"]:
                problem = (
                    f"Service {'/'.join(key_of(service))} port {port['port']} -> targetPort {target!r}: the e2e "
                    "cluster resolves names to pod IPs, so a Service port must equal its target port"
                )
                if problem not in self.errors:
                    self.errors.append(problem)

    async def _collect_garbage(self) -> None:
        alive = {o["metadata"].get("uid") for informer in self.informers.values() for o in informer.objects.values()}
        now = time.monotonic()
        for resource in OWNED:
            for obj in self.objects(resource):
                refs = obj["metadata"].get("ownerReferences") or []
                uid = obj["metadata"]["uid"]
                if not refs or any(ref.get("uid") in alive for ref in refs):
                    self._orphaned_since.pop(uid, None)
                    continue
                since = self._orphaned_since.setdefault(uid, now)
                if now - since >= GC_GRACE:
                    self._orphaned_since.pop(uid, None)
                    await self.delete(resource, *key_of(obj))
                else:
                    asyncio.get_running_loop().call_later(GC_GRACE, self._wake.set)

    # --- for tests -----------------------------------------------------------------------------
    def pods_of(self, namespace: str, owner: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.objects("pods")
            if key_of(p)[0] == namespace
            and any(ref.get("name") == owner for ref in p["metadata"].get("ownerReferences", []))
        ]

    def runtime_of(self, pod: Mapping[str, Any]) -> kubelet.PodRuntime:
        return self.runtimes[pod["metadata"]["uid"]]


def unmount_under(root: Path) -> None:
    """Unmount whatever is still mounted below ``root`` (emptyDir tmpfs of pods cut short)."""
    listing = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False)
    prefix = str(root.resolve()) + "/"
    for target in sorted((t for t in listing.stdout.split() if t.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def _node(name: str, address: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "status": {
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "allocatable": {"cpu": str(int(ALLOCATABLE_CPU)), "memory": str(ALLOCATABLE_MEMORY), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def _service_link(service: Mapping[str, Any]) -> tuple[str, int, dict[str, int]]:
    ports = service["spec"].get("ports", [])
    first = int(ports[0]["port"]) if ports else 0
    return key_of(service)[1], first, {p["name"]: int(p["port"]) for p in ports if "name" in p}
