"""The objects the operator makes for each custom resource (docs/contracts.md, "Operator seams").

Owns the public face of the builders; the work is in ``builders_common`` (metadata, hash,
masters), ``builders_md`` (agents, cleanup) and ``builders_tg`` (workers).

Rules: pure functions of the resource's body, its validated spec and an explicit
:class:`~ringseed.operator.config.OperatorConfig` (no clock, no client, no globals). Every child
has a deterministic name, ringseed's labels, an ownerReference to the resource (controller) and
the ``ringseed.io/spec-hash`` annotation: apply a child by creating it when missing and
merge-patching it when the live annotation differs. Builders re-check what the config decides
(the name's length, ``cache.ssdPath`` under the data root) and raise
:class:`ringseed.api.validation.SpecError` for a spec that cannot work.
"""

from __future__ import annotations

import base64
from typing import Any

from ringseed.api import constants, types
from ringseed.operator import builders_common, builders_md, builders_monitor, builders_tg
from ringseed.operator import config as config_module

SPEC_HASH_ANNOTATION = constants.SPEC_HASH_ANNOTATION
Body = builders_common.Body


def token_secret(*, body: Body, token: str) -> dict[str, Any]:
    """Secret ``<name>-token`` holding ``token`` under key ``token``.

    Create it once and never patch it: the caller makes a fresh random token each time, and
    masters, agents and workers already hold the first one. It carries no spec hash for that reason.
    """
    kind = str(body.get("kind") or constants.MD_KIND)
    component = constants.COMPONENT_WORKER if kind == constants.TG_KIND else constants.COMPONENT_AGENT
    meta = builders_common.metadata(body=body, suffix="token", component=component, owner_kind=kind)
    meta["labels"][constants.LABEL_COMPONENT] = "token"
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {constants.TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def md_children(
    *, body: Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> list[dict[str, Any]]:
    """Deployment ``<name>-master`` (tracker), Service ``<name>-master``, DaemonSet ``<name>-agent``,
    and with ``config.pod_monitor`` PodMonitor ``<name>-metrics`` (masters' and agents' ``/metrics``)."""
    children = builders_md.children(body=body, spec=spec, config=config)
    if config.pod_monitor:
        children.append(
            builders_monitor.pod_monitor(body=body, owner_kind=constants.MD_KIND, ports=["http", "peer"], config=config)
        )
    return children


def tg_children(
    *,
    body: Body,
    spec: types.TrainingGroupSpec,
    config: config_module.OperatorConfig,
    model: types.ModelDistributionSpec | None,
) -> list[dict[str, Any]]:
    """Deployment ``<name>-master`` (coordinator), Service ``<name>-master``, DaemonSet ``<name>-worker``.

    With ``config.pod_monitor`` also PodMonitor ``<name>-metrics`` (the coordinator's ``/metrics``).
    ``model`` is the referenced ModelDistribution's spec when it exists (its source goes into a pod
    annotation, so workers restart on a new model); with ``spec.model_ref`` set the workers need
    the node label of :func:`model_node_label` either way.
    """
    children = builders_tg.children(body=body, spec=spec, config=config, model=model)
    if config.pod_monitor:
        children.append(
            builders_monitor.pod_monitor(body=body, owner_kind=constants.TG_KIND, ports=["http"], config=config)
        )
    return children


def cleanup_daemonset(
    *, body: Body, spec: types.ModelDistributionSpec, config: config_module.OperatorConfig
) -> dict[str, Any]:
    """DaemonSet ``<name>-cleanup`` for ``retainPolicy: Delete``: removes the node data, then idles.

    Its pods turn Ready only after the removal ran (init containers); when ``numberReady`` equals
    ``desiredNumberScheduled`` the handler deletes it. It has the same owner reference as the
    other children, so create it while the resource still exists (e.g. from a finalizer).
    """
    return builders_md.cleanup_daemonset(body=body, spec=spec, config=config)


def model_node_label(*, namespace: str, name: str) -> tuple[str, str]:
    """The node label ``(key, value)`` the operator sets where a model copy is verified."""
    return builders_common.model_node_label(namespace=namespace, name=name)


def master_url(*, namespace: str, name: str) -> str:
    """``http://<name>-master.<namespace>.svc:8470``."""
    return builders_common.master_url(namespace=namespace, name=name)
