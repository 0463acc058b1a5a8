"""The operator's configuration: images, node paths, resources and defaults for what it builds.

Owns :class:`OperatorConfig` and how it is read from the environment the Helm chart sets
(``charts/ringseed/templates/operator-configmap.yaml``). Reading the environment is the only
I/O here, and only in :meth:`OperatorConfig.from_env` when no mapping is passed.

Environment variables (all optional; the default is in brackets):

- ``RINGSEED_IMAGE`` [``ghcr.io/ringseed/ringseed:<version>``]: image of masters, agents, the
  cleanup DaemonSet and the workers' runtime init container.
- ``RINGSEED_IMAGE_PULL_POLICY`` [``IfNotPresent``]: Always, IfNotPresent or Never.
- ``RINGSEED_IMAGE_PULL_SECRETS`` [empty]: comma-separated Secret names, given to ringseed's pods.
- ``RINGSEED_DATA_ROOT`` [``/var/lib/ringseed``]: the only node directory agents may use
  (models and their staging under ``<root>/models/<namespace>``; ``cache.ssdPath`` must lie under it).
- ``RINGSEED_MASTER_RESOURCES`` / ``RINGSEED_AGENT_RESOURCES`` [small requests, a memory limit]:
  a JSON ResourceRequirements object (``{"requests": {...}, "limits": {...}}``).
- ``RINGSEED_AGENT_MEMORY_BYTES`` [``1Gi``]: agents' memory tier when ``cache.memoryBytes`` is unset.
- ``RINGSEED_HEARTBEAT_SECONDS`` [2] and ``RINGSEED_OFFLINE_AFTER_SECONDS`` [10]: masters'
  ``--heartbeat-interval`` and ``--offline-after`` unless a TrainingGroup's ``collective`` sets them.
- ``RINGSEED_STATUS_INTERVAL_SECONDS`` [5]: how often the operator reads masters' status.
- ``RINGSEED_TRACKER_REPLICAS`` [2]: replicas of a ModelDistribution's tracker master (a leader
  and a follower that takes over within ``RINGSEED_OFFLINE_AFTER_SECONDS``; 1: no follower).
- ``RINGSEED_SERVICE_ACCOUNT`` [empty: the namespace's default]: ServiceAccount of masters and
  agents; they never call the Kubernetes API, so its token is not mounted either way (replicated
  masters run as their own ``<name>-master``/``<name>-cache`` identity, allowed Leases only).
- ``RINGSEED_WATCH_NAMESPACES`` [empty: all]: comma-separated namespaces the operator watches.
- ``RINGSEED_POD_MONITOR`` [``false``]: ``true`` makes a Prometheus Operator PodMonitor
  ``<name>-metrics`` per resource (its masters' and agents' ``/metrics``, with its token).
- ``RINGSEED_POD_MONITOR_LABELS`` [``{}``]: a JSON object of labels for those PodMonitors (what the
  Prometheus' ``podMonitorSelector`` matches, e.g. ``{"release": "prometheus"}``).

Rules: a malformed value raises ``ValueError`` naming the variable; the config is a frozen value
passed explicitly to builders (no globals).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ringseed
from ringseed.api import constants
from ringseed.protocol import units

DEFAULT_MASTER_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}
DEFAULT_AGENT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "500m", "memory": "1536Mi"},
    "limits": {"memory": "4Gi"},
}
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


@dataclass(frozen=True)
class OperatorConfig:
    image: str = f"ghcr.io/ringseed/ringseed:{ringseed.__version__}"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    data_root: str = constants.DEFAULT_DATA_ROOT
    master_resources: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_MASTER_RESOURCES))
    agent_resources: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_AGENT_RESOURCES))
    agent_memory_bytes: int = 1 << 30
    heartbeat_seconds: int = 2
    offline_after_seconds: int = 10
    status_interval_seconds: float = 5.0
    apply_concurrency: int = 16  # resources whose spec is applied at once (runtime.Runtime.apply_slot)
    tracker_replicas: int = 2
    service_account: str = ""
    watch_namespaces: tuple[str, ...] = ()
    pod_monitor: bool = False
    pod_monitor_labels: dict[str, str] = field(default_factory=dict)

    @property
    def models_root(self) -> str:
        return f"{self.data_root}/models"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """The configuration from ``env`` (default: ``os.environ``); unset variables keep their defaults."""
        source = os.environ if env is None else env
        kwargs: dict[str, Any] = {}
        for variable, (name, convert) in _VARIABLES.items():
            text = source.get(variable, "").strip()
            if not text:
                continue
            try:
                kwargs[name] = convert(text)
            except ValueError as exc:
                raise ValueError(f"{variable}={text!r}: {exc}") from None
        return cls(**kwargs)


def _pull_policy(text: str) -> str:
    if text not in PULL_POLICIES:
        raise ValueError(f"must be one of {', '.join(PULL_POLICIES)}")
    return text


def _data_root(text: str) -> str:
    if not text.startswith("/") or ".." in text.split("/") or text.rstrip("/") == "":
        raise ValueError("must be an absolute directory other than / and without '..'")
    return text.rstrip("/")


def _resources(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict) or set(value) - {"requests", "limits"}:
        raise ValueError('must be a JSON object with "requests" and/or "limits"')
    return value


def _bytes(text: str) -> int:
    return units.parse_size(text, syntax=units.Syntax.QUANTITY)


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError("must be true or false")
    return text.lower() == "true"


def _labels(text: str) -> dict[str, str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError("must be a JSON object of string labels")
    return value


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be a positive number")
    return value


_VARIABLES: dict[str, tuple[str, Any]] = {
    "RINGSEED_IMAGE": ("image", str),
    "RINGSEED_IMAGE_PULL_POLICY": ("image_pull_policy", _pull_policy),
    "RINGSEED_IMAGE_PULL_SECRETS": ("image_pull_secrets", _names),
    "RINGSEED_DATA_ROOT": ("data_root", _data_root),
    "RINGSEED_MASTER_RESOURCES": ("master_resources", _resources),
    "RINGSEED_AGENT_RESOURCES": ("agent_resources", _resources),
    "RINGSEED_AGENT_MEMORY_BYTES": ("agent_memory_bytes", _bytes),
    "RINGSEED_HEARTBEAT_SECONDS": ("heartbeat_seconds", _positive_int),
    "RINGSEED_OFFLINE_AFTER_SECONDS": ("offline_after_seconds", _positive_int),
    "RINGSEED_STATUS_INTERVAL_SECONDS": ("status_interval_seconds", _positive_float),
    "RINGSEED_APPLY_CONCURRENCY": ("apply_concurrency", _positive_int),
    "RINGSEED_TRACKER_REPLICAS": ("tracker_replicas", _positive_int),
    "RINGSEED_SERVICE_ACCOUNT": ("service_account", str),
    "RINGSEED_WATCH_NAMESPACES": ("watch_namespaces", _names),
    "RINGSEED_POD_MONITOR": ("pod_monitor", _flag),
    "RINGSEED_POD_MONITOR_LABELS": ("pod_monitor_labels", _labels),
}
