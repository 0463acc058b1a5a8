"""Children of a TrainingGroup's node cache (``spec.checkpoints`` / ``spec.data``): cache master and cache agents.

Owns how the cache part of a TrainingGroup becomes Kubernetes objects, and what the group's
worker pods get to reach it. Pure: spec and config in, dicts out.

Objects (all owned by the TrainingGroup ``<name>``):
- ServiceAccount, Role and RoleBinding ``<name>-cache``: the cache master may get, create and
  patch Leases in its namespace (leader election; nothing else).
- Deployment ``<name>-cache`` with **two** replicas (``ringseed master --role cache --lease
  <name>-cache``): the Lease picks the leader, the other follows; Service ``<name>-cache`` on
  8470 selects both (a follower answers 503 with the leader's pod URL, which agents use).
- DaemonSet ``<name>-cache-agent`` (``ringseed agent --role cache``) on the group's nodes, with
  the sink Secret's keys as environment (``AWS_*``).

Node paths, each a hostPath mounted at the same path in the agent and in every worker container
(the agent names chunk files by absolute path, so the paths must agree):
- memory tier ``/dev/shm/ringseed/<ns>/<name>`` (tmpfs; workers write their buffers here, so
  it is mounted read-write: the trust boundary is the group, whose pods share the token);
- SSD tier ``<ssdPath or dataRoot/pcache>/<ns>/<name>`` (read-only in workers);
- the agent's socket ``/run/ringseed/<ns>/<name>/cache.sock`` (``RINGSEED_CACHE_SOCKET``).
The memory budget is ``checkpoints.memoryBytes + data.memoryBytes`` (likewise SSD): one cache
serves both, and unpersisted checkpoints are never evicted for data.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ringseed.api import constants, types
from ringseed.operator import builders_common as common
from ringseed.operator import builders_md
from ringseed.operator import config as config_module

OWNER = constants.TG_KIND
SUFFIX = "cache"
AGENT_SUFFIX = "cache-agent"
MEMORY_VOLUME = "ringseed-cache-memory"
SSD_VOLUME = "ringseed-cache-ssd"
SOCKET_VOLUME = "ringseed-cache-socket"
DATA_MOUNT_VOLUME = "ringseed-data-mount"
_SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}


@dataclass(frozen=True)
class CachePaths:
    memory: str
    ssd: str
    socket_dir: str

    @property
    def socket(self) -> str:
        return f"{self.socket_dir}/cache.sock"


def wanted(spec: types.TrainingGroupSpec) -> bool:
    return spec.checkpoints is not None or spec.data is not None


def node_paths(
    *, spec: types.TrainingGroupSpec, config: config_module.OperatorConfig, namespace: str, name: str
) -> CachePaths:
    ssd_root = (spec.checkpoints.ssd_path if spec.checkpoints else None) or f"{config.data_root}/pcache"
    return CachePaths(
        memory=f"{constants.CACHE_SHM_ROOT}/{namespace}/{name}",
        ssd=f"{ssd_root}/{namespace}/{name}",
        socket_dir=f"{constants.CACHE_SOCKET_ROOT}/{namespace}/{name}",
    )


def cache_url(*, namespace: str, name: str) -> str:
    """The cache master Service of TrainingGroup ``namespace/name``."""
    return f"http://{name}-{SUFFIX}.{namespace}.svc:{constants.CACHE_MASTER_PORT}"


def budgets(spec: types.TrainingGroupSpec) -> tuple[int, int]:
    """(memory, SSD) bytes of each node's cache."""
    parts = [p for p in (spec.checkpoints, spec.data) if p is not None]
    return sum(p.memory_bytes for p in parts), sum(p.ssd_bytes for p in parts)


def children(
    *, body: common.Body, spec: types.TrainingGroupSpec, config: config_module.OperatorConfig
) -> list[dict[str, Any]]:
    if not wanted(spec):
        return []
    return [
        master_deployment(body=body, spec=spec, config=config),
        common.master_service(body=body, owner_kind=OWNER, suffix=SUFFIX, component=constants.COMPONENT_CACHE),
        agent_daemonset(body=body, spec=spec, config=config),
    ]


def master_deployment(
    *, body: common.Body, spec: types.TrainingGroupSpec, config: config_module.OperatorConfig
) -> dict[str, Any]:
    name = common.name_of(body)
    checkpoints = spec.checkpoints or types.CheckpointSpec()
    flags = [
        "--advertise-url", f"http://$(POD_IP):{constants.CACHE_MASTER_PORT}",
        "--lease", f"{name}-{SUFFIX}",
        "--replicas", str(checkpoints.replicas),
        "--keep", str(checkpoints.keep),
        "--offline-after", str(config.offline_after_seconds),
        "--heartbeat-interval", str(config.heartbeat_seconds),
    ]  # fmt: skip
    if checkpoints.sink is not None:
        flags += ["--sink", checkpoints.sink.uri]
    deployment = common.master_deployment(
        body=body, owner_kind=OWNER, role="cache", flags=flags, config=config,
        suffix=SUFFIX, component=constants.COMPONENT_CACHE, replicas=2,
    )  # fmt: skip
    return common.with_lease_identity(deployment)


def agent_daemonset(
    *, body: common.Body, spec: types.TrainingGroupSpec, config: config_module.OperatorConfig
) -> dict[str, Any]:
    name, namespace = common.name_of(body), common.namespace_of(body)
    paths = node_paths(spec=spec, config=config, namespace=namespace, name=name)
    checkpoints = spec.checkpoints or types.CheckpointSpec()
    memory, ssd = budgets(spec)
    command = [
        "ringseed", "agent", "--role", "cache",
        "--master-url", cache_url(namespace=namespace, name=name),
        "--node-name", "$(NODE_NAME)",
        "--advertise-host", "$(POD_IP)",
        "--port", str(constants.CACHE_AGENT_PORT),
        "--token-file", constants.TOKEN_PATH,
        "--group", name,
        "--socket", paths.socket,
        "--memory-dir", paths.memory,
        "--memory-bytes", str(memory),
        "--chunk-size", str(checkpoints.chunk_size),
    ]  # fmt: skip
    if ssd:
        command += ["--ssd-dir", paths.ssd, "--ssd-bytes", str(ssd)]
    if checkpoints.sink is not None:
        command += ["--sink", checkpoints.sink.uri]
    if checkpoints.persist_rate_limit is not None:
        command += ["--persist-rate-limit", str(checkpoints.persist_rate_limit)]
    if spec.data is not None:
        for source in spec.data.sources:
            command += ["--data", f"{source.name}={source.uri}"]
        command += ["--list-ttl", str(max(1, spec.data.list_ttl_seconds))]
        if spec.data.warmup:
            command += ["--warmup", *(f"--warmup-path={p}" for p in spec.data.warmup_paths)]
    volumes = [(MEMORY_VOLUME, paths.memory), (SOCKET_VOLUME, paths.socket_dir)]
    if ssd:
        volumes.append((SSD_VOLUME, paths.ssd))
    mounts = [{"name": v, "mountPath": p} for v, p in volumes]
    agent = common.ringseed_container(name="cache-agent", config=config, command=command)
    agent.update(
        env=common.replica_env(),
        ports=[{"name": "peer", "containerPort": constants.CACHE_AGENT_PORT, "protocol": "TCP"}],
        readinessProbe=common.http_probe(port="peer", period=5, failures=3),
        livenessProbe=common.http_probe(port="peer", period=10, failures=6),
        resources=copy.deepcopy(config.agent_resources),
        volumeMounts=[dict(common.TOKEN_MOUNT), *copy.deepcopy(mounts), dict(common.TMP_MOUNT)],
    )
    secrets = {s for s in (checkpoints.sink.secret_name if checkpoints.sink else None,) if s}
    secrets |= {s.secret_name for s in (spec.data.sources if spec.data else ()) if s.secret_name}
    if secrets:
        agent["envFrom"] = [{"secretRef": {"name": s}} for s in sorted(secrets)]
    chown = builders_md._CHOWN.format(uid=constants.RUNTIME_UID)
    prepare = common.ringseed_container(
        name="prepare-dirs", config=config, command=["python", "-c", chown, *(p for _, p in volumes)]
    )
    prepare.update(
        securityContext=builders_md._root_security(add=["CHOWN"]),
        resources=copy.deepcopy(_SMALL),
        volumeMounts=copy.deepcopy(mounts),
    )
    pod = {**common.pod_basics(config=config), "terminationGracePeriodSeconds": 30}
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    pod.update(
        initContainers=[prepare],
        containers=[agent],
        volumes=[
            common.token_volume(body=body),
            *({"name": v, "hostPath": {"path": p, "type": "DirectoryOrCreate"}} for v, p in volumes),
            copy.deepcopy(common.TMP_VOLUME),
        ],
    )
    component = constants.COMPONENT_CACHE_AGENT
    return common.with_spec_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": common.metadata(body=body, suffix=AGENT_SUFFIX, component=component, owner_kind=OWNER),
            "spec": {
                "selector": {"matchLabels": common.selector_labels(instance=name, component=component)},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": common.labels(body=body, component=component, owner_kind=OWNER)},
                    "spec": pod,
                },
            },
        }
    )


def worker_parts(
    *, body: common.Body, spec: types.TrainingGroupSpec, config: config_module.OperatorConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """What each worker container gets to reach its node's cache: ``(env, mounts, volumes)``."""
    if not wanted(spec):
        return [], [], []
    name, namespace = common.name_of(body), common.namespace_of(body)
    paths = node_paths(spec=spec, config=config, namespace=namespace, name=name)
    env = [{"name": "RINGSEED_CACHE_SOCKET", "value": paths.socket}]
    mounts: list[dict[str, Any]] = [
        {"name": MEMORY_VOLUME, "mountPath": paths.memory},
        {"name": SOCKET_VOLUME, "mountPath": paths.socket_dir},
    ]
    volumes = [
        {"name": MEMORY_VOLUME, "hostPath": {"path": paths.memory, "type": "DirectoryOrCreate"}},
        {"name": SOCKET_VOLUME, "hostPath": {"path": paths.socket_dir, "type": "DirectoryOrCreate"}},
    ]
    if budgets(spec)[1]:
        mounts.append({"name": SSD_VOLUME, "mountPath": paths.ssd, "readOnly": True})
        volumes.append({"name": SSD_VOLUME, "hostPath": {"path": paths.ssd, "type": "DirectoryOrCreate"}})
    if spec.data is not None and spec.data.mount_path:
        mounts.append({"name": DATA_MOUNT_VOLUME, "mountPath": spec.data.mount_path, "readOnly": True,
                       "mountPropagation": "HostToContainer"})  # fmt: skip
        volumes.append({"name": DATA_MOUNT_VOLUME, "emptyDir": {}})
    return env, mounts, volumes


def mount_sidecars(
    *,
    body: common.Body,
    spec: types.TrainingGroupSpec,
    config: config_module.OperatorConfig,
    env: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """With ``data.mountPath``: a container that FUSE-mounts ``ringseed://data`` there for its pod.

    The mount is made in the sidecar on an emptyDir with Bidirectional propagation (which needs a
    privileged container: FUSE mounts are host mounts) and reaches the user's containers through
    the same emptyDir with HostToContainer propagation (read-only). The project's image has what it
    needs (fusepy, libfuse2, fusermount; tests/e2e/test_image.py checks).
    """
    if spec.data is None or not spec.data.mount_path:
        return []
    _, mounts, _ = worker_parts(body=body, spec=spec, config=config)
    own = [dict(m, mountPropagation="Bidirectional", readOnly=False) if m["name"] == DATA_MOUNT_VOLUME else dict(m)
           for m in mounts]  # fmt: skip
    # the staleness period is said here for the fusepy fallback (the agent may not answer yet when the
    # sidecar starts); the libfuse3 driver is told of changes and keeps names longer (mount_command)
    ttl = str(max(1, spec.data.list_ttl_seconds))
    command = ["ringseed", "mount", spec.data.mount_path, "--root", "data", "--list-ttl", ttl]
    sidecar = common.ringseed_container(name="ringseed-data-mount", config=config, command=command)
    sidecar.update(
        env=copy.deepcopy(env),
        volumeMounts=own,
        securityContext={"privileged": True, "runAsUser": 0, "runAsNonRoot": False},
        resources={"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        lifecycle={"preStop": {"exec": {"command": ["fusermount", "-u", spec.data.mount_path]}}},
    )
    return [sidecar]
