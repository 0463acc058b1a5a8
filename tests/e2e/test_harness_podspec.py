"""The e2e kubelet's translation of pod specs (tests/e2e/cluster/podspec.py): no podman, no root.

Two promises: every pod the operator builds (and the e2e manifests in examples/cluster/) is
translated without dropping anything, as a kubelet would run it; and a field the harness cannot
honour fails loudly, naming the field.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from ringseed.api import validation
from ringseed.operator import builders
from ringseed.operator import config as config_module
from tests.conftest import REPO
from tests.e2e.cluster import podspec

NODE = podspec.NodeFacts(node="node1", host_ip="10.77.1.2", node_root="/x", api_host="10.77.0.1", api_port=6443)
TOKEN = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "m-token"}, "data": {"token": "czM="}}  # b"s3"


def body(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "ringseed.io/v1alpha1",
        "kind": kind,
        "spec": spec,
        "metadata": {"name": name, "namespace": "default", "uid": "u-1"},
    }


def pod_from(workload: dict[str, Any]) -> dict[str, Any]:
    template = copy.deepcopy(workload["spec"]["template"])
    meta = {"name": "p-1", "namespace": "default", "uid": "pod-1", **template.get("metadata", {})}
    return {"metadata": meta, "spec": {**template["spec"], "nodeName": "node1"}}


def plan(
    pod: dict[str, Any], *, secrets: dict[str, Any] | None = None, config_maps: dict[str, Any] | None = None
) -> podspec.PodPlan:
    return podspec.plan(
        podspec.Inputs(
            pod=pod,
            node=NODE,
            pod_ip="10.78.1.5",
            secrets={"m-token": TOKEN} if secrets is None else secrets,
            config_maps=config_maps or {},
            services=[],
            image_users={},
            service_account_token=None,
        )
    )


def md_children() -> list[dict[str, Any]]:
    spec = {"source": {"uri": "http://origin.default.svc:8080/"}, "chunkSize": "4Mi", "retainPolicy": "Delete"}
    parsed = validation.parse_model_distribution(spec)
    config = config_module.OperatorConfig(image="ringseed:dev")
    md = body("ModelDistribution", "m", spec)
    children = builders.md_children(body=md, spec=parsed, config=config)
    return [*children, builders.cleanup_daemonset(body=md, spec=parsed, config=config)]


def test_the_agent_pod_runs_as_the_operator_wrote_it() -> None:
    (agents,) = [c for c in md_children() if c["metadata"]["name"] == "m-agent"]
    result = plan(pod_from(agents))
    (prepare,) = result.init_containers
    assert "--user=0:0" in prepare.args and "--cap-drop=all" in prepare.args and "--cap-add=chown" in prepare.args
    (agent,) = result.containers
    assert "--user=10001:10001" in agent.args and "--group-add=10001" in agent.args
    assert {"--read-only", "--read-only-tmpfs=false", "--security-opt=no-new-privileges"} <= set(agent.args)
    command = agent.args[agent.args.index("ringseed:dev") - 1 :]
    assert "$(NODE_NAME)" not in " ".join(command) and agent.env["NODE_NAME"] == "node1"
    assert agent.env["POD_IP"] == "10.78.1.5"
    assert agent.readiness is not None and agent.readiness.port == 8471
    token = next(v for v in result.volumes if v.name == "token")
    assert token.files == {"token": (b"s3", 0o440)} and token.group == 10001
    hosts = {v.host_path for v in result.volumes if v.kind == "hostPath"}
    assert hosts == {"/var/lib/ringseed/models/default"}


def test_every_pod_the_operator_builds_translates() -> None:
    tg_spec = {
        "minPeers": 2,
        "modelRef": {"name": "m"},
        "template": {
            "spec": {"containers": [{"name": "train", "image": "ringseed:dev-training", "command": ["python", "t.py"]}]}
        },
    }
    group = body("TrainingGroup", "g", tg_spec)
    parsed = validation.parse_training_group(tg_spec, name="g")
    config = config_module.OperatorConfig(image="ringseed:dev")
    secrets = {"m-token": TOKEN, "g-token": {**TOKEN, "metadata": {"name": "g-token"}}}
    workloads = [*md_children(), *builders.tg_children(body=group, spec=parsed, config=config, model=None)]
    for workload in workloads:
        if workload["kind"] in ("Deployment", "DaemonSet"):
            plan(pod_from(workload), secrets=secrets)


def test_the_e2e_manifests_translate() -> None:
    cm = {"ddp-train": {"data": {"ddp_train.py": "print()"}}}
    for path in sorted((REPO / "examples" / "cluster").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "Deployment":
                plan(pod_from(doc), config_maps=cm)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s.update(affinity={}), "affinity"),
        (lambda s: s.update(hostNetwork=True), "hostNetwork"),
        (lambda s: s["volumes"].append({"name": "p", "projected": {}}), "projected"),
        (lambda s: s["containers"][0].update(stdin=True), "stdin"),
        (
            lambda s: s["containers"][0]["env"].append(
                {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.hostname"}}}
            ),
            "spec.hostname",
        ),
        (lambda s: s["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (lambda s: s["containers"][0].update(imagePullPolicy="Always"), "Always"),
        (lambda s: s["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": 1}), "nvidia.com/gpu"),
        (lambda s: s.update(restartPolicy="OnFailure"), "OnFailure"),
    ],
)
def test_what_cannot_be_honoured_fails_loudly(change: Any, field: str) -> None:
    (agents,) = [c for c in md_children() if c["metadata"]["name"] == "m-agent"]
    pod = pod_from(agents)
    change(pod["spec"])
    with pytest.raises(podspec.Unsupported, match=field.replace(".", r"\.")):
        plan(pod)


def test_a_missing_secret_makes_the_pod_wait() -> None:
    (agents,) = [c for c in md_children() if c["metadata"]["name"] == "m-agent"]
    with pytest.raises(podspec.Missing, match="m-token"):
        plan(pod_from(agents), secrets={})


def test_expansion_follows_kubernetes() -> None:
    env = {"A": "1", "B": "x"}
    assert podspec.expand("$(A)-$(B)-$(C)-$$(A)", env) == "1-x-$(C)-$(A)"
