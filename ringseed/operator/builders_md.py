"""Children of a ModelDistribution: the tracker master, the agent DaemonSet and the cleanup DaemonSet.

Owns how a ModelDistribution spec becomes ``ringseed agent`` pods on the selected nodes (node
paths, flags, privileges). Pure: spec and config in, dicts out.

Node paths (under the operator's data root; each hostPath is mounted at the same path inside):
- ``--data-dir <root>/models``; the agent publishes ``<root>/models/<ns>/<name>/`` by renaming a
  sibling ``.<name>.tmp-<pid>`` into place, so it needs the namespace directory
  ``<root>/models/<ns>`` (one hostPath volume ``models``), not just the model's own directory.
- ``--cache-dir <root>/models/<ns>/.cache`` by default: the agent stages chunks in
  ``<cache-dir>/<ns>/<name>/`` and publishes the model as hard links to the staged files. Hard
  links fail across mounts (even two bind mounts of one file system), when the agent copies
  instead and a model takes twice its size on disk; keeping staging inside the ``models``
  volume avoids that. With ``cache.ssdPath`` (it must lie under the root) the cache is the
  separate volume ``<ssdPath>/<ns>`` and publishing copies unless the files can be linked.
- Mounting per namespace means an agent can never touch another namespace's models.
  (``.cache`` and ``.<name>.*`` can never clash with a model: names start with a letter.)

Privileges: the agent runs as uid 10001 with no capabilities, no privilege escalation and a
read-only root filesystem. hostPath directories made by kubelet (``DirectoryOrCreate``) belong to
root and fsGroup does not apply to hostPath, so an init container ``prepare-dirs`` runs as uid 0
with only ``CAP_CHOWN`` to hand the namespace directories to uid 10001, then exits. That is
less than running the agent itself as root. hostPath volumes still need a namespace whose Pod
Security level allows them (``privileged``).

Sources on the node (``file://``): a file source (and a ``file://`` manifest) names a node path,
such as a share mounted on every node; each agent may get origin duty, so every agent mounts that
path read-only at the same path (hostPath volume ``source``, ``source-manifest``), or the agent in
its container would find nothing there.

Cleanup (``retainPolicy: Delete``): ``cleanup_daemonset`` mounts the same directories and, as uid
10001 (which owns them), removes the model, its staging and any ``.<name>.tmp-*``/``.old-*``
leftovers in an init container, then idles; when its pods are Ready on every node, the handler
deletes it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ringseed.api import constants, types, validation
from ringseed.operator import builders_common as common
from ringseed.operator import config as config_module

OWNER = constants.MD_KIND
_CHOWN = "import os, sys\nfor path in sys.argv[1:]:\n    os.chown(path, {uid}, {uid})\n"
_REMOVE = (
    "import glob, shutil, sys\n"
    "for pattern in sys.argv[1:]:\n"
    "    for path in glob.glob(pattern, include_hidden=True):\n"
    "        shutil.rmtree(path, ignore_errors=True)\n"
    "        print('removed', path, flush=True)\n"
)
_IDLE = "import time\nwhile True:\n    time.sleep(3600)\n"
_SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}


@dataclass(frozen=True)
class NodePaths:
    """The node directories of one distribution (see the module docstring)."""

    data_dir: str  # --data-dir
    cache_dir: str  # --cache-dir
    volumes: tuple[tuple[str, str], ...]  # (volume name, host path), mounted at the same path
    model: str  # the published model
    staging: str  # where the agent stages chunks

    @property
    def leftovers(self) -> tuple[str, ...]:
        """Glob patterns of everything the distribution leaves on a node."""
        parent, name = self.model.rsplit("/", 1)
        return (self.model, f"{parent}/.{name}.tmp-*", f"{parent}/.{name}.old-*", self.staging)


def node_paths(
    *, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig, namespace: str, name: str
) -> NodePaths:
    models = f"{config.models_root}/{namespace}"
    volumes: tuple[tuple[str, str], ...] = (("models", models),)
    cache = f"{models}/.cache"
    if spec.cache.ssd_path is not None:
        cache = f"{spec.cache.ssd_path}/{namespace}"
        volumes += (("cache", cache),)
    return NodePaths(
        data_dir=config.models_root,
        cache_dir=cache,
        volumes=volumes,
        model=f"{models}/{name}",
        staging=f"{cache}/{namespace}/{name}",
    )


def model_dir(*, config: config_module.OperatorConfig, namespace: str, name: str) -> str:
    """Where the verified model of ``namespace/name`` lies on a node."""
    return f"{config.models_root}/{namespace}/{name}"


def children(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> list[dict[str, Any]]:
    """Deployment and Service ``<name>-master`` (tracker) and DaemonSet ``<name>-agent``; with more
    than one tracker replica the Deployment runs as the namespace's master identity, which the
    operator makes once per namespace (``common.master_identity``)."""
    _check(body=body, spec=spec, config=config)
    return [
        master_deployment(body=body, spec=spec, config=config),
        common.master_service(body=body, owner_kind=OWNER),
        agent_daemonset(body=body, spec=spec, config=config),
    ]


def master_deployment(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> dict[str, Any]:
    """Deployment ``<name>-master``: ``config.tracker_replicas`` tracker replicas (2 by default).

    Replicas elect a leader with the Lease ``<name>-master`` (``ringseed master --lease``); the
    follower takes over within ``--offline-after`` when the leader dies and agents re-register
    with it (tracker state is soft). ``/readyz`` answers 200 only on the leader, so the Service
    ``<name>-master`` (which selects every replica) routes to the leader within a second; a
    follower reached meanwhile answers 503 naming the leader's pod URL, which agents follow."""
    flags = [
        "--offline-after", str(config.offline_after_seconds),
        "--heartbeat-interval", str(config.heartbeat_seconds),
        "--seeders", str(spec.seeders),
    ]  # fmt: skip
    name = common.name_of(body)
    replicated = config.tracker_replicas > 1
    if replicated:
        flags += ["--advertise-url", f"http://$(POD_IP):{constants.MASTER_PORT}", "--lease", f"{name}-master"]
    deployment = common.master_deployment(
        body=body, owner_kind=OWNER, role="tracker", flags=flags, config=config, replicas=config.tracker_replicas
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"] = common.http_probe(port="http", period=1, failures=1, path="/readyz", timeout=1)
    if replicated:
        return common.with_lease_identity(deployment)
    return common.with_spec_hash(deployment)


def agent_daemonset(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> dict[str, Any]:
    """DaemonSet ``<name>-agent``: one ``ringseed agent`` per selected node."""
    paths = _paths(body=body, spec=spec, config=config)
    mounts = [_mount(volume, path) for volume, path in paths.volumes]
    agent = common.ringseed_container(
        name="agent", config=config, command=_agent_command(body=body, spec=spec, config=config, paths=paths)
    )
    agent.update(
        env=_agent_env(spec=spec),
        ports=[{"name": "peer", "containerPort": constants.AGENT_PORT, "protocol": "TCP"}],
        readinessProbe=common.http_probe(port="peer", period=5, failures=3),
        livenessProbe=common.http_probe(port="peer", period=10, failures=6),
        resources=copy.deepcopy(config.agent_resources),
        volumeMounts=[dict(common.TOKEN_MOUNT), *copy.deepcopy(mounts), dict(common.TMP_MOUNT)],
    )
    if spec.source.secret_name:
        agent["envFrom"] = [{"secretRef": {"name": spec.source.secret_name}}]
    chown = _CHOWN.format(uid=constants.RUNTIME_UID)
    prepare = common.ringseed_container(
        name="prepare-dirs", config=config, command=["python", "-c", chown, *(path for _, path in paths.volumes)]
    )
    prepare.update(securityContext=_root_security(add=["CHOWN"]), resources=copy.deepcopy(_SMALL), volumeMounts=mounts)
    volumes = [common.token_volume(body=body), *_hosts(paths), copy.deepcopy(common.TMP_VOLUME)]
    for volume, path in _node_sources(spec):
        volumes.append({"name": volume, "hostPath": {"path": path}})
        agent["volumeMounts"].append({"name": volume, "mountPath": path, "readOnly": True})
    pod = {**common.pod_basics(config=config), **_placement(spec), "terminationGracePeriodSeconds": 30}
    pod.update(initContainers=[prepare], containers=[agent], volumes=volumes)
    return _daemonset(body=body, suffix="agent", component=constants.COMPONENT_AGENT, pod=pod)


def cleanup_daemonset(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> dict[str, Any]:
    """DaemonSet ``<name>-cleanup``: removes this distribution's node data, then idles until deleted."""
    _check(body=body, spec=spec, config=config)
    paths = _paths(body=body, spec=spec, config=config)
    remove = common.ringseed_container(
        name="remove-data", config=config, command=["python", "-c", _REMOVE, *paths.leftovers]
    )
    remove.update(
        resources=copy.deepcopy(_SMALL), volumeMounts=[_mount(volume, path) for volume, path in paths.volumes]
    )
    idle = common.ringseed_container(name="idle", config=config, command=["python", "-c", _IDLE])
    idle["resources"] = copy.deepcopy(_SMALL)
    pod = {**common.pod_basics(config=config), **_placement(spec), "terminationGracePeriodSeconds": 1}
    pod.update(initContainers=[remove], containers=[idle], volumes=_hosts(paths))
    return _daemonset(body=body, suffix="cleanup", component=constants.COMPONENT_CLEANUP, pod=pod)


def _paths(*, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig) -> NodePaths:
    return node_paths(spec=spec, config=config, namespace=common.namespace_of(body), name=common.name_of(body))


def _node_sources(spec: types.ModelDistributionSpec) -> list[tuple[str, str]]:
    """(volume, node path) of ``file://`` sources, which agents read on their node (module docstring)."""
    found: list[tuple[str, str]] = []
    for volume, uri in (("source", spec.source.uri), ("source-manifest", spec.source.manifest_uri)):
        if uri and uri.startswith("file://"):
            path = uri.removeprefix("file://").rstrip("/") or "/"
            if not any(path == held or path.startswith(held + "/") for _, held in found):
                found.append((volume, path))
    return found


def _hosts(paths: NodePaths) -> list[dict[str, Any]]:
    return [_host(volume, path) for volume, path in paths.volumes]


def _check(*, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig) -> None:
    validation.check_name(common.name_of(body))
    if spec.cache.ssd_path is not None:
        validation.check_ssd_path(spec.cache.ssd_path, data_root=config.data_root)


def _agent_command(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig, paths: NodePaths
) -> list[str]:
    name, namespace = common.name_of(body), common.namespace_of(body)
    command = [
        "ringseed", "agent",
        "--master-url", common.master_url(namespace=namespace, name=name),
        "--node-name", "$(NODE_NAME)",
        "--advertise-host", "$(POD_IP)",
        "--port", str(constants.AGENT_PORT),
        "--token-file", constants.TOKEN_PATH,
        "--source", spec.source.uri,
    ]  # fmt: skip
    if spec.source.manifest_uri:
        command += ["--manifest-uri", spec.source.manifest_uri]
    memory = spec.cache.memory_bytes if spec.cache.memory_bytes is not None else config.agent_memory_bytes
    command += [
        "--chunk-size", str(spec.chunk_size),
        "--data-dir", paths.data_dir,
        "--cache-dir", paths.cache_dir,
        "--model-name", f"{namespace}/{name}",
        "--memory-bytes", str(memory),
    ]  # fmt: skip
    if spec.cache.ssd_bytes is not None:
        command += ["--ssd-bytes", str(spec.cache.ssd_bytes)]
    if spec.origin_rate_limit is not None:
        command += ["--origin-rate-limit", str(spec.origin_rate_limit)]
    return command


def _agent_env(*, spec: types.ModelDistributionSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if spec.source.digest:
        env.append({"name": "RINGSEED_EXPECTED_DIGEST", "value": spec.source.digest})
    return env


def _placement(spec: types.ModelDistributionSpec) -> dict[str, Any]:
    placement: dict[str, Any] = {}
    if spec.node_selector:
        placement["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        placement["tolerations"] = copy.deepcopy(list(spec.tolerations))
    return placement


def _root_security(*, add: list[str]) -> dict[str, Any]:
    """uid 0 for a short init step on root-owned hostPath dirs: no escalation, only the capabilities in ``add``."""
    return {
        "runAsNonRoot": False,
        "runAsUser": 0,
        "runAsGroup": 0,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": add},
    }


def _mount(volume: str, path: str) -> dict[str, Any]:
    return {"name": volume, "mountPath": path}


def _host(volume: str, path: str) -> dict[str, Any]:
    return {"name": volume, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def _daemonset(*, body: common.Body, suffix: str, component: str, pod: dict[str, Any]) -> dict[str, Any]:
    return common.with_spec_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": common.metadata(body=body, suffix=suffix, component=component, owner_kind=OWNER),
            "spec": {
                "selector": {"matchLabels": common.selector_labels(instance=common.name_of(body), component=component)},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": common.labels(body=body, component=component, owner_kind=OWNER)},
                    "spec": pod,
                },
            },
        }
    )
