"""Pieces every ringseed child object shares: metadata, owner references, the spec hash,
security contexts, the token volume, and the master Deployment and Service of both kinds.

Owns the naming and labelling scheme of children. Pure: no clock, no client, no globals; the
custom resource's body and an :class:`OperatorConfig` come in, plain dicts come out.

Rules: names are ``<name>-<suffix>``; labels are ``app.kubernetes.io/{name,instance,component,
managed-by}`` plus ``ringseed.io/owner-kind``; the selector uses only name, instance and
component (selectors are immutable); the spec hash is the SHA-256 of the finished object's
canonical JSON without the hash itself, so it changes exactly when the object would.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ringseed.api import constants
from ringseed.operator import config as config_module

Body = Mapping[str, Any]
TMP_VOLUME = {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
TOKEN_MOUNT = {"name": "token", "mountPath": constants.TOKEN_DIR, "readOnly": True}


def name_of(body: Body) -> str:
    return str(body["metadata"]["name"])


def namespace_of(body: Body) -> str:
    return str(body["metadata"].get("namespace") or "default")


def master_url(*, namespace: str, name: str) -> str:
    return f"http://{name}-master.{namespace}.svc:{constants.MASTER_PORT}"


def model_node_label(*, namespace: str, name: str) -> tuple[str, str]:
    """The node label ``(key, value)`` marking a verified copy of ModelDistribution ``namespace/name``.

    The key is ``models.ringseed.io/<namespace>.<name>``; a label key's name part may hold 63
    characters, so a longer one is cut to 52 and ends in ``-`` plus 10 hex digits of its SHA-256.
    """
    label = f"{namespace}.{name}"
    if len(label) > 63:
        label = f"{label[:52].rstrip('-.')}-{hashlib.sha256(label.encode()).hexdigest()[:10]}"
    return f"{constants.MODEL_LABEL_PREFIX}/{label}", constants.MODEL_LABEL_VALUE


def selector_labels(*, instance: str, component: str) -> dict[str, str]:
    return {
        constants.LABEL_NAME: constants.APP_NAME,
        constants.LABEL_INSTANCE: instance,
        constants.LABEL_COMPONENT: component,
    }


def labels(*, body: Body, component: str, owner_kind: str) -> dict[str, str]:
    return {
        **selector_labels(instance=name_of(body), component=component),
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
        constants.LABEL_OWNER_KIND: owner_kind,
    }


def owner_reference(*, body: Body, owner_kind: str) -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": owner_kind,
        "name": name_of(body),
        "uid": str(body["metadata"].get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(*, body: Body, suffix: str, component: str, owner_kind: str) -> dict[str, Any]:
    return {
        "name": f"{name_of(body)}-{suffix}",
        "namespace": namespace_of(body),
        "labels": labels(body=body, component=component, owner_kind=owner_kind),
        "ownerReferences": [owner_reference(body=body, owner_kind=owner_kind)],
    }


def with_spec_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the spec-hash annotation set to the hash of everything else in it."""
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations.pop(constants.SPEC_HASH_ANNOTATION, None)
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    annotations[constants.SPEC_HASH_ANNOTATION] = hashlib.sha256(canonical.encode()).hexdigest()
    return obj


def restricted_security(*, uid: int = constants.RUNTIME_UID) -> dict[str, Any]:
    """A container that runs as ``uid``, cannot gain privileges and has no capabilities or writable root."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_basics(*, config: config_module.OperatorConfig) -> dict[str, Any]:
    """Pod fields of every ringseed-made pod: no API token, pull secrets, seccomp, fsGroup."""
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"fsGroup": constants.RUNTIME_UID, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if config.service_account:
        spec["serviceAccountName"] = config.service_account
    if config.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in config.image_pull_secrets]
    return spec


def token_volume(*, body: Body) -> dict[str, Any]:
    return {
        "name": "token",
        "secret": {
            "secretName": f"{name_of(body)}-token",
            "defaultMode": 0o440,
            "items": [{"key": constants.TOKEN_KEY, "path": constants.TOKEN_KEY}],
        },
    }


def http_probe(*, port: str, period: int, failures: int, path: str = "/healthz", timeout: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def master_identity(*, namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding ``ringseed-master`` (``constants.MASTER_ACCOUNT``) that
    every replicated master of ``namespace`` runs as, trackers and cache masters alike: it may
    get, create and patch Leases in its namespace (leader election), nothing else.

    One per namespace, not one per resource: Kubernetes cannot narrow ``create`` to one Lease
    name, so an identity per resource granted exactly as much, for three more API objects per
    resource. Owned by no resource: the operator deletes it with the namespace's last
    ModelDistribution or TrainingGroup (``runtime.release_identity``)."""
    meta = {
        "name": constants.MASTER_ACCOUNT,
        "namespace": namespace,
        "labels": {
            constants.LABEL_NAME: constants.APP_NAME,
            constants.LABEL_COMPONENT: constants.COMPONENT_MASTER_IDENTITY,
            constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
        },
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": copy.deepcopy(meta)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": copy.deepcopy(meta),
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "patch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": copy.deepcopy(meta),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": constants.MASTER_ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": constants.MASTER_ACCOUNT, "namespace": namespace}],
    }
    return [with_spec_hash(account), with_spec_hash(role), with_spec_hash(binding)]


def uses_master_identity(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` (a built child) runs pods as the namespace's master identity."""
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    return obj.get("kind") == "Deployment" and pod.get("serviceAccountName") == constants.MASTER_ACCOUNT


def replica_env() -> list[dict[str, Any]]:
    """What a replicated master's container needs: its node, pod IP (its URL), pod name and
    namespace (its Lease identity)."""
    return [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]


def with_lease_identity(deployment: dict[str, Any]) -> dict[str, Any]:
    """``deployment``'s pods run as the namespace's master identity (:func:`master_identity`),
    with its token mounted (Leases are the only thing it may touch) and :func:`replica_env`."""
    pod = deployment["spec"]["template"]["spec"]
    pod["serviceAccountName"] = constants.MASTER_ACCOUNT
    pod["automountServiceAccountToken"] = True
    pod["containers"][0]["env"] = replica_env()
    return with_spec_hash(deployment)


def ringseed_container(*, name: str, config: config_module.OperatorConfig, command: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": command,
        "securityContext": restricted_security(),
    }


def master_deployment(
    *,
    body: Body,
    owner_kind: str,
    role: str,
    flags: list[str],
    config: config_module.OperatorConfig,
    suffix: str = "master",
    component: str = constants.COMPONENT_MASTER,
    replicas: int = 1,
) -> dict[str, Any]:
    """Deployment ``<name>-<suffix>``: ``replicas`` (1 by default), Recreate, ``ringseed master --role <role> ...``."""
    name = name_of(body)
    command = ["ringseed", "master", "--role", role, "--port", str(constants.MASTER_PORT)]
    container = ringseed_container(
        name="master", config=config, command=[*command, "--token-file", constants.TOKEN_PATH, *flags]
    )
    container.update(
        ports=[{"name": "http", "containerPort": constants.MASTER_PORT, "protocol": "TCP"}],
        readinessProbe=http_probe(port="http", period=5, failures=3),
        livenessProbe=http_probe(port="http", period=10, failures=6),
        resources=copy.deepcopy(config.master_resources),
        volumeMounts=[dict(TOKEN_MOUNT), dict(TMP_MOUNT)],
    )
    pod_labels = labels(body=body, component=component, owner_kind=owner_kind)
    pod = {
        **pod_basics(config=config),
        "containers": [container],
        "volumes": [token_volume(body=body), copy.deepcopy(TMP_VOLUME)],
    }
    return with_spec_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata(body=body, suffix=suffix, component=component, owner_kind=owner_kind),
            "spec": {
                "replicas": replicas,
                "revisionHistoryLimit": 3,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": selector_labels(instance=name, component=component)},
                "template": {"metadata": {"labels": pod_labels}, "spec": pod},
            },
        }
    )


def master_service(
    *, body: Body, owner_kind: str, suffix: str = "master", component: str = constants.COMPONENT_MASTER
) -> dict[str, Any]:
    """Service ``<name>-<suffix>`` on port 8470 in front of the master Deployment."""
    return with_spec_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(body=body, suffix=suffix, component=component, owner_kind=owner_kind),
            "spec": {
                "type": "ClusterIP",
                "selector": selector_labels(instance=name_of(body), component=component),
                "ports": [{"name": "http", "port": constants.MASTER_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        }
    )
