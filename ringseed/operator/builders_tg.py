"""Children of a TrainingGroup: the coordinator master and the worker DaemonSet built from the user's template.

Owns what ringseed adds to a user's pod template so that ``ringseed.collective`` works inside it
without rebuilding the image. Pure: spec and config in, dicts out.

What the worker DaemonSet adds to the template (everything else is the user's, untouched):
- an init container ``ringseed-runtime`` (the ringseed image) that copies the pure-Python
  ``ringseed`` package into the emptyDir ``ringseed-runtime``, mounted read-only at
  ``/opt/ringseed`` in every container; ``PYTHONPATH`` starts with ``/opt/ringseed`` (a
  ``PYTHONPATH`` the template sets is kept after it; one set only by the image's ENV is
  replaced, so set it in the template). The training image must provide numpy (and torch for
  the torch backend).
- in every container the environment of docs/contracts.md: ``RINGSEED_COORDINATOR_URL``,
  ``RINGSEED_TOKEN`` (from the ``<name>-token`` Secret), ``RINGSEED_PEER_ID`` (node name),
  ``RINGSEED_LISTEN_HOST`` (pod IP; pod IPs are routable between pods, so no hostNetwork),
  ``RINGSEED_LISTEN_PORT`` (8472), ``RINGSEED_MODEL_PATH`` (with ``modelRef``), plus
  ``RINGSEED_QUANTIZATION`` and ``RINGSEED_OPTIMIZE_TOPOLOGY`` from ``collective``; ringseed's
  values win over the template's. The first container also gets containerPort 8472 ``ringseed``.
- with ``modelRef``: the model's node directory as hostPath volume ``ringseed-model``, mounted
  read-only at ``/models/<model>`` in every container, and the node selector
  ``model_node_label(...)`` so pods only land where the operator has seen the copy verified.
  The model's source is recorded in a pod annotation, so workers restart when it changes.
- with ``checkpoints`` or ``data``: the node cache's children (``builders_cache``) and, in every
  container, ``RINGSEED_CACHE_SOCKET`` and the cache's node paths (``builders_cache.worker_parts``).
"""

from __future__ import annotations

import copy
from typing import Any

from ringseed.api import constants, types, validation
from ringseed.operator import builders_cache, builders_md
from ringseed.operator import builders_common as common
from ringseed.operator import config as config_module

OWNER = constants.TG_KIND
RUNTIME_VOLUME = "ringseed-runtime"
MODEL_VOLUME = "ringseed-model"
_COPY_RUNTIME = (
    "import os, shutil, ringseed\n"
    "shutil.copytree(os.path.dirname(ringseed.__file__), '/opt/ringseed/ringseed', dirs_exist_ok=True,\n"
    "                ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))\n"
)


def children(
    *,
    body: common.Body,
    spec: types.TrainingGroupSpec,
    config: config_module.OperatorConfig,
    model: types.ModelDistributionSpec | None,
) -> list[dict[str, Any]]:
    """Deployment and Service ``<name>-master`` (coordinator) and DaemonSet ``<name>-worker``."""
    validation.check_name(common.name_of(body))
    collective = spec.collective
    flags = [
        "--heartbeat-interval", str(collective.heartbeat_seconds or config.heartbeat_seconds),
        "--heartbeat-timeout", str(collective.timeout_seconds or config.offline_after_seconds),
        "--min-peers", str(spec.min_peers),
        "--optimize-topology" if collective.optimize_topology else "--no-optimize-topology",
    ]  # fmt: skip
    return [
        common.master_deployment(body=body, owner_kind=OWNER, role="coordinator", flags=flags, config=config),
        common.master_service(body=body, owner_kind=OWNER),
        worker_daemonset(body=body, spec=spec, config=config, model=model),
        *builders_cache.children(body=body, spec=spec, config=config),
    ]


def worker_daemonset(
    *,
    body: common.Body,
    spec: types.TrainingGroupSpec,
    config: config_module.OperatorConfig,
    model: types.ModelDistributionSpec | None,
) -> dict[str, Any]:
    """DaemonSet ``<name>-worker``: the user's pod template on every selected node, with ringseed added."""
    name, namespace = common.name_of(body), common.namespace_of(body)
    template = copy.deepcopy(spec.template)
    pod: dict[str, Any] = template.setdefault("spec", {})
    meta: dict[str, Any] = template.setdefault("metadata", {})
    meta["labels"] = {
        **meta.get("labels", {}),
        **common.labels(body=body, component=constants.COMPONENT_WORKER, owner_kind=OWNER),
    }
    for drop in ("name", "namespace", "generateName"):
        meta.pop(drop, None)
    cache_env, cache_mounts, cache_volumes = builders_cache.worker_parts(body=body, spec=spec, config=config)
    mounts = [{"name": RUNTIME_VOLUME, "mountPath": constants.RUNTIME_DIR, "readOnly": True}, *cache_mounts]
    env = [*_worker_env(body=body, spec=spec), *cache_env]
    volumes = [{"name": RUNTIME_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}, *cache_volumes]
    selector = {**pod.get("nodeSelector", {}), **spec.node_selector}
    if spec.model_ref is not None:
        model_path = f"{constants.MODEL_MOUNT_ROOT}/{spec.model_ref.name}"
        host_path = builders_md.model_dir(config=config, namespace=namespace, name=spec.model_ref.name)
        mounts.append({"name": MODEL_VOLUME, "mountPath": model_path, "readOnly": True})
        env.append({"name": "RINGSEED_MODEL_PATH", "value": model_path})
        volumes.append({"name": MODEL_VOLUME, "hostPath": {"path": host_path, "type": "Directory"}})
        key, value = common.model_node_label(namespace=namespace, name=spec.model_ref.name)
        selector[key] = value
        if model is not None:
            meta.setdefault("annotations", {})[constants.MODEL_SOURCE_ANNOTATION] = _model_source(model)
    if selector:
        pod["nodeSelector"] = selector
    for index, container in enumerate(pod["containers"]):
        _add_to_container(container, env=env, mounts=mounts, first=index == 0)
    pod["containers"] += builders_cache.mount_sidecars(body=body, spec=spec, config=config, env=env)
    pod["initContainers"] = [_runtime_init(config=config), *pod.get("initContainers", [])]
    pod["volumes"] = [*pod.get("volumes", []), *volumes]
    if config.image_pull_secrets:
        known = {item.get("name") for item in pod.get("imagePullSecrets", [])}
        pod["imagePullSecrets"] = [
            *pod.get("imagePullSecrets", []),
            *({"name": s} for s in config.image_pull_secrets if s not in known),
        ]
    return common.with_spec_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": common.metadata(
                body=body, suffix="worker", component=constants.COMPONENT_WORKER, owner_kind=OWNER
            ),
            "spec": {
                "selector": {
                    "matchLabels": common.selector_labels(instance=name, component=constants.COMPONENT_WORKER)
                },
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": template,
            },
        }
    )


def _worker_env(*, body: common.Body, spec: types.TrainingGroupSpec) -> list[dict[str, Any]]:
    name, namespace = common.name_of(body), common.namespace_of(body)
    return [
        {"name": "RINGSEED_COORDINATOR_URL", "value": common.master_url(namespace=namespace, name=name)},
        {
            "name": "RINGSEED_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": f"{name}-token", "key": constants.TOKEN_KEY}},
        },
        {"name": "RINGSEED_PEER_ID", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "RINGSEED_LISTEN_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "RINGSEED_LISTEN_PORT", "value": str(constants.COLLECTIVE_PORT)},
        {"name": "RINGSEED_QUANTIZATION", "value": spec.collective.quantization},
        {"name": "RINGSEED_OPTIMIZE_TOPOLOGY", "value": "true" if spec.collective.optimize_topology else "false"},
    ]


def _add_to_container(
    container: dict[str, Any], *, env: list[dict[str, Any]], mounts: list[dict[str, Any]], first: bool
) -> None:
    ours = {item["name"] for item in env} | {"PYTHONPATH"}
    theirs = [item for item in container.get("env", []) if item.get("name") not in ours]
    old_path = next((item.get("value") for item in container.get("env", []) if item.get("name") == "PYTHONPATH"), None)
    python_path = constants.RUNTIME_DIR + (f":{old_path}" if old_path else "")
    container["env"] = [*theirs, *copy.deepcopy(env), {"name": "PYTHONPATH", "value": python_path}]
    taken = {mount.get("mountPath") for mount in container.get("volumeMounts", [])}
    extra = [dict(mount) for mount in mounts if mount["mountPath"] not in taken]
    container["volumeMounts"] = [*container.get("volumeMounts", []), *extra]
    if first and not any(port.get("containerPort") == constants.COLLECTIVE_PORT for port in container.get("ports", [])):
        container["ports"] = [
            *container.get("ports", []),
            {"name": "ringseed", "containerPort": constants.COLLECTIVE_PORT, "protocol": "TCP"},
        ]


def _runtime_init(*, config: config_module.OperatorConfig) -> dict[str, Any]:
    init = common.ringseed_container(name=RUNTIME_VOLUME, config=config, command=["python", "-c", _COPY_RUNTIME])
    init["resources"] = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    init["volumeMounts"] = [{"name": RUNTIME_VOLUME, "mountPath": constants.RUNTIME_DIR}]
    return init


def _model_source(model: types.ModelDistributionSpec) -> str:
    source = model.source
    return " ".join(part for part in (source.uri, source.manifest_uri, source.digest) if part)
