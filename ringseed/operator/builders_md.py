"""Children of a ModelDistribution: the tracker master, the agent DaemonSet and the cleanup DaemonSet.

Owns how a ModelDistribution spec becomes ``ringseed agent`` pods on the selected nodes (node
paths, flags, privileges). Pure: spec and config in, dicts out.

Node paths (all under the operator's data root, mounted at the same path in the container):
- model: ``<root>/models/<namespace>/<name>`` (the agent's ``--data-dir`` is ``<root>/models``
  and the agent writes only below ``<namespace>/<name>``; only that directory is mounted, so an
  agent can never touch another distribution's model);
- cache: ``<ssdPath or root/cache>/<namespace>/<name>`` (one cache per distribution).

Privileges: the agent runs as uid 10001 with no capabilities, no privilege escalation and a
read-only root filesystem. hostPath directories made by kubelet (``DirectoryOrCreate``) belong to
root and fsGroup does not apply to hostPath, so an init container ``prepare-dirs`` runs as uid 0
with only ``CAP_CHOWN`` to hand the two directories to uid 10001, then exits. That is less than
running the agent itself as root. hostPath volumes still need a namespace whose Pod Security
level allows them (``privileged``).

Cleanup (``retainPolicy: Delete``): ``cleanup_daemonset`` removes the model and cache directories
in two init containers (first as uid 10001, which owns the files, then as uid 0 without
capabilities to remove the now empty directories from root-owned parents) and then idles; when
its pods are ready on every node, the handler deletes it.
"""

from __future__ import annotations

import copy
from typing import Any

from ringseed.api import constants, types, validation
from ringseed.operator import builders_common as common
from ringseed.operator import config as config_module

OWNER = constants.MD_KIND
_CHOWN = "import os, sys\nfor path in sys.argv[1:]:\n    os.chown(path, {uid}, {uid})\n"
_REMOVE_FILES = "import shutil, sys\nfor path in sys.argv[1:]:\n    shutil.rmtree(path, ignore_errors=True)\n"
_REMOVE_DIRS = (
    "import os, sys\nfor path in sys.argv[1:]:\n    try:\n        os.rmdir(path)\n"
    "    except OSError as exc:\n        print('kept', path, exc)\n"
)
_IDLE = "import time\nwhile True:\n    time.sleep(3600)\n"
_SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}


def model_dir(*, config: config_module.OperatorConfig, namespace: str, name: str) -> str:
    return f"{config.models_root}/{namespace}/{name}"


def cache_dir(
    *, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig, namespace: str, name: str
) -> str:
    return f"{spec.cache.ssd_path or config.cache_root}/{namespace}/{name}"


def children(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> list[dict[str, Any]]:
    """Deployment and Service ``<name>-master`` (tracker) and DaemonSet ``<name>-agent``."""
    _check(body=body, spec=spec, config=config)
    flags = [
        "--offline-after", str(config.offline_after_seconds),
        "--heartbeat-interval", str(config.heartbeat_seconds),
        "--seeders", str(spec.seeders),
    ]  # fmt: skip
    return [
        common.master_deployment(body=body, owner_kind=OWNER, role="tracker", flags=flags, config=config),
        common.master_service(body=body, owner_kind=OWNER),
        agent_daemonset(body=body, spec=spec, config=config),
    ]


def agent_daemonset(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> dict[str, Any]:
    """DaemonSet ``<name>-agent``: one ``ringseed agent`` per selected node."""
    name, namespace = common.name_of(body), common.namespace_of(body)
    models, cache = (
        model_dir(config=config, namespace=namespace, name=name),
        cache_dir(spec=spec, config=config, namespace=namespace, name=name),
    )
    agent = common.ringseed_container(
        name="agent", config=config, command=_agent_command(body=body, spec=spec, config=config)
    )
    agent.update(
        env=_agent_env(spec=spec),
        ports=[{"name": "peer", "containerPort": constants.AGENT_PORT, "protocol": "TCP"}],
        readinessProbe=common.http_probe(port="peer", period=5, failures=3),
        livenessProbe=common.http_probe(port="peer", period=10, failures=6),
        resources=copy.deepcopy(config.agent_resources),
        volumeMounts=[
            dict(common.TOKEN_MOUNT),
            _mount("model", models),
            _mount("cache", cache),
            dict(common.TMP_MOUNT),
        ],
    )
    if spec.source.secret_name:
        agent["envFrom"] = [{"secretRef": {"name": spec.source.secret_name}}]
    prepare = common.ringseed_container(
        name="prepare-dirs",
        config=config,
        command=["python", "-c", _CHOWN.format(uid=constants.RUNTIME_UID), models, cache],
    )
    prepare.update(
        securityContext=_root_security(add=["CHOWN"]),
        resources=copy.deepcopy(_SMALL),
        volumeMounts=[_mount("model", models), _mount("cache", cache)],
    )
    volumes = [
        common.token_volume(body=body),
        _host("model", models),
        _host("cache", cache),
        copy.deepcopy(common.TMP_VOLUME),
    ]
    pod = {**common.pod_basics(config=config), **_placement(spec), "terminationGracePeriodSeconds": 30}
    pod.update(initContainers=[prepare], containers=[agent], volumes=volumes)
    return _daemonset(body=body, suffix="agent", component=constants.COMPONENT_AGENT, pod=pod)


def cleanup_daemonset(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> dict[str, Any]:
    """DaemonSet ``<name>-cleanup``: removes this distribution's node data, then idles until deleted."""
    _check(body=body, spec=spec, config=config)
    name, namespace = common.name_of(body), common.namespace_of(body)
    models, cache = (
        model_dir(config=config, namespace=namespace, name=name),
        cache_dir(spec=spec, config=config, namespace=namespace, name=name),
    )
    parents = [models.rsplit("/", 1)[0], cache.rsplit("/", 1)[0]]
    mounts = [_mount("models-parent", parents[0]), _mount("cache-parent", parents[1])]
    remove_files = common.ringseed_container(
        name="remove-files", config=config, command=["python", "-c", _REMOVE_FILES, models, cache]
    )
    remove_files.update(resources=copy.deepcopy(_SMALL), volumeMounts=mounts)
    remove_dirs = common.ringseed_container(
        name="remove-dirs", config=config, command=["python", "-c", _REMOVE_DIRS, models, cache]
    )
    remove_dirs.update(
        securityContext=_root_security(add=[]), resources=copy.deepcopy(_SMALL), volumeMounts=copy.deepcopy(mounts)
    )
    idle = common.ringseed_container(name="idle", config=config, command=["python", "-c", _IDLE])
    idle["resources"] = copy.deepcopy(_SMALL)
    volumes = [_host("models-parent", parents[0]), _host("cache-parent", parents[1])]
    pod = {**common.pod_basics(config=config), **_placement(spec), "terminationGracePeriodSeconds": 1}
    pod.update(initContainers=[remove_files, remove_dirs], containers=[idle], volumes=volumes)
    return _daemonset(body=body, suffix="cleanup", component=constants.COMPONENT_CLEANUP, pod=pod)


def _check(*, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig) -> None:
    validation.check_name(common.name_of(body))
    if spec.cache.ssd_path is not None:
        validation.check_ssd_path(spec.cache.ssd_path, data_root=config.data_root)


def _agent_command(
    *, body: common.Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
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
        "--data-dir", config.models_root,
        "--cache-dir", cache_dir(spec=spec, config=config, namespace=namespace, name=name),
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
        "capabilities": {"drop": ["ALL"], **({"add": add} if add else {})},
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
