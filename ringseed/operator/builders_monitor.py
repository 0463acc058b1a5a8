"""The PodMonitor that lets a Prometheus Operator scrape a resource's masters and agents. Pure.

Owns the optional ``monitoring.coreos.com/v1`` PodMonitor ``<name>-metrics`` (made only when the
operator's ``pod_monitor`` setting is on: the chart's ``metrics.podMonitor.enabled``). Rules:
- It lives beside the resource and selects that resource's pods (name + instance labels); each
  endpoint is a named container port (``http`` on masters, ``peer`` on agents), path ``/metrics``.
- ``/metrics`` needs the group's bearer token: the endpoint takes it from the resource's own token
  Secret (``<name>-token``, same namespace), so no Secret is copied anywhere.
- Series carry ``node`` (the pod's node) and the pod's instance and component labels, which the
  dashboard (charts/ringseed/dashboards/ringseed.json) groups by.
"""

from __future__ import annotations

from typing import Any

from ringseed.api import constants
from ringseed.operator import builders_common as common
from ringseed.operator import config as config_module

API_VERSION = "monitoring.coreos.com/v1"
KIND = "PodMonitor"
SUFFIX = "metrics"
TARGET_LABELS = [constants.LABEL_INSTANCE, constants.LABEL_COMPONENT]


def pod_monitor(
    *, body: common.Body, owner_kind: str, ports: list[str], config: config_module.OperatorConfig
) -> dict[str, Any]:
    """PodMonitor ``<name>-metrics`` scraping ``/metrics`` on each named port of ``ports``."""
    name = common.name_of(body)
    meta = common.metadata(body=body, suffix=SUFFIX, component="metrics", owner_kind=owner_kind)
    meta["labels"].update(config.pod_monitor_labels)
    token = {"name": f"{name}-token", "key": constants.TOKEN_KEY}
    endpoints = [
        {
            "port": port,
            "path": "/metrics",
            "interval": "15s",
            "authorization": {"type": "Bearer", "credentials": token},
            "relabelings": [
                {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}
            ],
        }
        for port in ports
    ]
    return common.with_spec_hash(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": {constants.LABEL_NAME: constants.APP_NAME, constants.LABEL_INSTANCE: name}},
                "podTargetLabels": list(TARGET_LABELS),
                "podMetricsEndpoints": endpoints,
            },
        }
    )
