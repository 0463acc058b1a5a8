"""Builders: every child object as the operator applies it, checked against the spec field by field
and against Kubernetes 1.35's schemas (strict)."""

from __future__ import annotations

import argparse
import base64
import copy
import dataclasses
import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from ringseed.api import validation
from ringseed.operator import builders, builders_common, config

CFG = config.OperatorConfig(image="reg.example/ringseed:1.2", data_root="/data/ringseed")
MD_BODY: dict[str, Any] = {
    "apiVersion": "ringseed.io/v1alpha1",
    "kind": "ModelDistribution",
    "metadata": {"name": "llama", "namespace": "ml", "uid": "uid-md"},
}
TG_BODY: dict[str, Any] = {
    "apiVersion": "ringseed.io/v1alpha1",
    "kind": "TrainingGroup",
    "metadata": {"name": "train", "namespace": "ml", "uid": "uid-tg"},
}
OWNER_MD = {
    "apiVersion": "ringseed.io/v1alpha1",
    "kind": "ModelDistribution",
    "name": "llama",
    "uid": "uid-md",
    "controller": True,
    "blockOwnerDeletion": True,
}
HARDENED = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def md(**changes: Any) -> Any:
    spec: dict[str, Any] = {"source": {"uri": "s3://models/llama/", "secretRef": {"name": "store"}}}
    spec.update(changes)
    return validation.parse_model_distribution(spec, data_root=CFG.data_root)


def tg(**changes: Any) -> Any:
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": {"team": "ai"}},
            "spec": {
                "containers": [
                    {"name": "train", "image": "trainer:1", "env": [{"name": "PYTHONPATH", "value": "/app"}]},
                    {"name": "sidecar", "image": "logger:1"},
                ],
                "nodeSelector": {"pool": "a100"},
            },
        },
        "modelRef": {"name": "llama"},
    }
    spec.update(changes)
    return validation.parse_training_group(spec, name="train")


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


def without_hash(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    del obj["metadata"]["annotations"][builders.SPEC_HASH_ANNOTATION]
    return obj


def all_objects() -> list[dict[str, Any]]:
    spec = md(
        cache={"ssdPath": "/data/ringseed/nvme", "ssdBytes": "1Ti"},
        originRateLimit="1Gi",
        tolerations=[{"operator": "Exists"}],
    )
    return [
        *builders.md_children(body=MD_BODY, spec=spec, config=CFG),
        builders.cleanup_daemonset(body=MD_BODY, spec=spec, config=CFG),
        builders.token_secret(body=MD_BODY, token="secret"),
        *builders.tg_children(body=TG_BODY, spec=tg(), config=CFG, model=spec),
        *builders.tg_children(body=TG_BODY, spec=tg(modelRef=None), config=CFG, model=None),
        builders.token_secret(body=TG_BODY, token="secret"),
    ]


@pytest.mark.parametrize("index", range(len(all_objects())))
def test_every_built_object_validates_strictly_against_kubernetes_1_35(index: int) -> None:
    kubernetes_validate.validate(all_objects()[index], "1.35.0", strict=True)


def test_tracker_master_deployment_is_exactly_as_specified() -> None:
    deployment = by_kind(builders.md_children(body=MD_BODY, spec=md(seeders=3), config=CFG))["Deployment"]
    labels = {
        "app.kubernetes.io/name": "ringseed",
        "app.kubernetes.io/instance": "llama",
        "app.kubernetes.io/component": "master",
        "app.kubernetes.io/managed-by": "ringseed-operator",
        "ringseed.io/owner-kind": "ModelDistribution",
    }
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "timeoutSeconds": 3}
    leader = {"httpGet": {"path": "/readyz", "port": "http"}, "timeoutSeconds": 1}  # 200 on the leader only
    field = {"NODE_NAME": "spec.nodeName", "POD_IP": "status.podIP", "POD_NAME": "metadata.name"}
    field["POD_NAMESPACE"] = "metadata.namespace"
    assert (
        without_hash(deployment)
        == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "llama-master",
                "namespace": "ml",
                "labels": labels,
                "ownerReferences": [OWNER_MD],
                "annotations": {},
            },
            "spec": {
                "replicas": 2,  # a leader and a follower
                "revisionHistoryLimit": 3,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {k: labels[k] for k in list(labels)[:3]}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "ringseed-master",  # the namespace's: Leases, nothing else
                        "automountServiceAccountToken": True,
                        "enableServiceLinks": False,
                        "securityContext": {"fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [
                            {
                                "name": "master",
                                "image": "reg.example/ringseed:1.2",
                                "imagePullPolicy": "IfNotPresent",
                                "command": [
                                    "ringseed",
                                    "master",
                                    "--role",
                                    "tracker",
                                    "--port",
                                    "8470",
                                    "--token-file",
                                    "/etc/ringseed/token",
                                    "--offline-after",
                                    "10",
                                    "--heartbeat-interval",
                                    "2",
                                    "--seeders",
                                    "3",
                                    "--advertise-url",
                                    "http://$(POD_IP):8470",
                                    "--lease",
                                    "llama-master",
                                ],
                                "securityContext": HARDENED,
                                "ports": [{"name": "http", "containerPort": 8470, "protocol": "TCP"}],
                                "readinessProbe": {**leader, "periodSeconds": 1, "failureThreshold": 1},
                                "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
                                "env": [
                                    {"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field.items()
                                ],
                                "resources": CFG.master_resources,
                                "volumeMounts": [
                                    {"name": "token", "mountPath": "/etc/ringseed", "readOnly": True},
                                    {"name": "tmp", "mountPath": "/tmp"},
                                ],
                            }
                        ],
                        "volumes": [
                            {
                                "name": "token",
                                "secret": {
                                    "secretName": "llama-token",
                                    "defaultMode": 0o440,
                                    "items": [{"key": "token", "path": "token"}],
                                },
                            },
                            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                        ],
                    },
                },
            },
        }
    )


def test_master_service_selects_the_master_pods_on_8470() -> None:
    objects = by_kind(builders.md_children(body=MD_BODY, spec=md(), config=CFG))
    service = objects["Service"]
    assert service["metadata"]["name"] == "llama-master"
    assert service["spec"]["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8470, "targetPort": "http", "protocol": "TCP"}]
    assert builders.master_url(namespace="ml", name="llama") == "http://llama-master.ml.svc:8470"


def test_agent_daemonset_runs_the_contract_command_line_on_the_selected_nodes() -> None:
    spec = md(
        source={
            "uri": "s3://models/llama/",
            "secretRef": {"name": "store"},
            "manifestUri": "s3://models/m.json",
            "digest": "c" * 64,
        },
        chunkSize="32Mi",
        nodeSelector={"gpu": "yes"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        cache={"memoryBytes": "2Gi", "ssdPath": "/data/ringseed/nvme", "ssdBytes": 1000},
        originRateLimit=5000,
    )
    daemonset = by_kind(builders.md_children(body=MD_BODY, spec=spec, config=CFG))["DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    assert daemonset["metadata"]["name"] == "llama-agent"
    assert agent["command"] == [
        "ringseed", "agent", "--master-url", "http://llama-master.ml.svc:8470",
        "--node-name", "$(NODE_NAME)", "--advertise-host", "$(POD_IP)", "--port", "8471",
        "--token-file", "/etc/ringseed/token", "--source", "s3://models/llama/", "--manifest-uri", "s3://models/m.json",
        "--chunk-size", str(32 << 20), "--data-dir", "/data/ringseed/models",
        "--cache-dir", "/data/ringseed/nvme/ml", "--model-name", "ml/llama",
        "--memory-bytes", str(2 << 30), "--ssd-bytes", "1000", "--origin-rate-limit", "5000",
    ]  # fmt: skip
    assert agent["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "RINGSEED_EXPECTED_DIGEST", "value": "c" * 64},
    ]
    assert agent["envFrom"] == [{"secretRef": {"name": "store"}}]
    assert agent["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "peer"}
    assert agent["ports"] == [{"name": "peer", "containerPort": 8471, "protocol": "TCP"}]
    assert agent["securityContext"] == HARDENED
    assert agent["resources"] == CFG.agent_resources
    assert pod["nodeSelector"] == {"gpu": "yes"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["automountServiceAccountToken"] is False


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _volume_holding(pod: dict[str, Any], path: str) -> str:
    """The hostPath volume whose mount holds ``path`` (mounts are at the host path itself)."""
    (name,) = [v["name"] for v in pod["volumes"] if "hostPath" in v and path.startswith(v["hostPath"]["path"] + "/")]
    return str(name)


def test_agent_mounts_only_its_namespace_and_keeps_staging_linkable() -> None:
    pod = by_kind(builders.md_children(body=MD_BODY, spec=md(), config=CFG))["DaemonSet"]["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    data_dir, cache_dir = _flag(agent["command"], "--data-dir"), _flag(agent["command"], "--cache-dir")
    assert [v["hostPath"] for v in pod["volumes"] if "hostPath" in v] == [
        {"path": "/data/ringseed/models/ml", "type": "DirectoryOrCreate"}
    ]
    # the agent publishes <data-dir>/<ns>/<name> and stages in <cache-dir>/<ns>/<name>: one mount
    # holds both (hard links work) and the model's parent (it renames a sibling into place)
    model, staging = f"{data_dir}/ml/llama", f"{cache_dir}/ml/llama"
    assert _volume_holding(pod, model) == _volume_holding(pod, staging) == _volume_holding(pod, f"{data_dir}/ml/.x")
    assert {"name": "models", "mountPath": "/data/ringseed/models/ml"} in agent["volumeMounts"]
    (prepare,) = pod["initContainers"]
    assert prepare["command"][3:] == ["/data/ringseed/models/ml"]
    assert prepare["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert prepare["securityContext"]["allowPrivilegeEscalation"] is False
    plain = by_kind(builders.md_children(body=MD_BODY, spec=md(source={"uri": "file:///m"}), config=CFG))
    assert "envFrom" not in plain["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]


def test_file_sources_are_mounted_read_only_at_their_node_path() -> None:
    source = {"uri": "file:///srv/models/llama/", "manifestUri": "file:///srv/manifests/llama.json"}
    pod = by_kind(builders.md_children(body=MD_BODY, spec=md(source=source), config=CFG))["DaemonSet"]
    spec = pod["spec"]["template"]["spec"]
    assert {"name": "source", "hostPath": {"path": "/srv/models/llama"}} in spec["volumes"]
    assert {"name": "source-manifest", "hostPath": {"path": "/srv/manifests/llama.json"}} in spec["volumes"]
    mounts = spec["containers"][0]["volumeMounts"]
    assert {"name": "source", "mountPath": "/srv/models/llama", "readOnly": True} in mounts
    assert {"name": "source-manifest", "mountPath": "/srv/manifests/llama.json", "readOnly": True} in mounts
    inside = md(source={"uri": "file:///srv/m/", "manifestUri": "file:///srv/m/manifest.json"})
    pod = by_kind(builders.md_children(body=MD_BODY, spec=inside, config=CFG))["DaemonSet"]
    assert [v["name"] for v in pod["spec"]["template"]["spec"]["volumes"] if v["name"].startswith("source")] == [
        "source"
    ]
    kubernetes_validate.validate(pod, "1.35.0", strict=True)


def test_ssd_path_becomes_a_second_namespace_volume() -> None:
    spec = md(cache={"ssdPath": "/data/ringseed/nvme"})
    pod = by_kind(builders.md_children(body=MD_BODY, spec=spec, config=CFG))["DaemonSet"]["spec"]["template"]["spec"]
    assert _flag(pod["containers"][0]["command"], "--cache-dir") == "/data/ringseed/nvme/ml"
    assert [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v] == [
        "/data/ringseed/models/ml",
        "/data/ringseed/nvme/ml",
    ]
    assert pod["initContainers"][0]["command"][3:] == ["/data/ringseed/models/ml", "/data/ringseed/nvme/ml"]


def test_ssd_path_outside_the_configured_root_is_a_spec_error() -> None:
    spec = validation.parse_model_distribution({"source": {"uri": "s3://b"}, "cache": {"ssdPath": "/mnt/nvme"}})
    with pytest.raises(validation.SpecError) as info:
        builders.md_children(body=MD_BODY, spec=spec, config=CFG)
    assert info.value.field == "spec.cache.ssdPath"


def test_children_carry_owner_labels_and_a_hash_that_follows_the_spec() -> None:
    first = builders.md_children(body=MD_BODY, spec=md(), config=CFG)
    assert first == builders.md_children(body=MD_BODY, spec=md(), config=CFG)
    changed = builders.md_children(body=MD_BODY, spec=md(seeders=2), config=CFG)
    for old in first:
        assert old["metadata"]["ownerReferences"] == [OWNER_MD]
        assert old["metadata"]["labels"]["ringseed.io/owner-kind"] == "ModelDistribution"
        assert re.fullmatch(r"[0-9a-f]{64}", old["metadata"]["annotations"][builders.SPEC_HASH_ANNOTATION])
    hashes = [[o["metadata"]["annotations"][builders.SPEC_HASH_ANNOTATION] for o in objs] for objs in (first, changed)]
    # seeders reaches only the tracker's command line
    assert [a == b for a, b in zip(*hashes, strict=True)] == [False, True, True]


def test_token_secret_holds_the_token_and_is_owned() -> None:
    secret = builders.token_secret(body=TG_BODY, token="s3cr3t")
    assert secret["metadata"]["name"] == "train-token"
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "TrainingGroup"
    assert base64.b64decode(secret["data"]["token"]) == b"s3cr3t"
    assert builders.SPEC_HASH_ANNOTATION not in secret["metadata"].get("annotations", {})


def test_coordinator_master_takes_the_collective_settings() -> None:
    spec = tg(minPeers=3, collective={"heartbeatSeconds": 5, "timeoutSeconds": 30, "optimizeTopology": True})
    deployment = by_kind(builders.tg_children(body=TG_BODY, spec=spec, config=CFG, model=None))["Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "ringseed", "master", "--role", "coordinator", "--port", "8470", "--token-file", "/etc/ringseed/token",
        "--heartbeat-interval", "5", "--heartbeat-timeout", "30", "--min-peers", "3", "--optimize-topology",
    ]  # fmt: skip
    default = by_kind(builders.tg_children(body=TG_BODY, spec=tg(), config=CFG, model=None))["Deployment"]
    command = default["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-7:] == [
        "--heartbeat-interval",
        "2",
        "--heartbeat-timeout",
        "10",
        "--min-peers",
        "1",
        "--no-optimize-topology",
    ]


def test_worker_daemonset_adds_ringseed_to_the_users_template() -> None:
    model = md()
    worker = by_kind(builders.tg_children(body=TG_BODY, spec=tg(), config=CFG, model=model))["DaemonSet"]
    template = worker["spec"]["template"]
    pod = template["spec"]
    assert worker["metadata"]["name"] == "train-worker"
    assert template["metadata"]["labels"]["team"] == "ai"
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    assert template["metadata"]["annotations"]["ringseed.io/model-source"] == "s3://models/llama/"
    key, value = builders.model_node_label(namespace="ml", name="llama")
    assert pod["nodeSelector"] == {"pool": "a100", key: value}
    (init,) = pod["initContainers"]
    assert (init["name"], init["image"], init["command"][:2]) == (
        "ringseed-runtime",
        "reg.example/ringseed:1.2",
        ["python", "-c"],
    )
    assert {"name": "ringseed-runtime", "mountPath": "/opt/ringseed"} in init["volumeMounts"]
    assert {
        "name": "ringseed-model",
        "hostPath": {"path": "/data/ringseed/models/ml/llama", "type": "Directory"},
    } in pod["volumes"]
    train, sidecar = pod["containers"]
    assert train["env"] == [
        {"name": "RINGSEED_COORDINATOR_URL", "value": "http://train-master.ml.svc:8470"},
        {"name": "RINGSEED_TOKEN", "valueFrom": {"secretKeyRef": {"name": "train-token", "key": "token"}}},
        {"name": "RINGSEED_PEER_ID", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "RINGSEED_LISTEN_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "RINGSEED_LISTEN_PORT", "value": "8472"},
        {"name": "RINGSEED_QUANTIZATION", "value": "none"},
        {"name": "RINGSEED_OPTIMIZE_TOPOLOGY", "value": "false"},
        {"name": "RINGSEED_MODEL_PATH", "value": "/models/llama"},
        {"name": "PYTHONPATH", "value": "/opt/ringseed:/app"},
    ]
    assert {"name": "PYTHONPATH", "value": "/opt/ringseed"} in sidecar["env"]
    for container in (train, sidecar):
        assert {"name": "ringseed-model", "mountPath": "/models/llama", "readOnly": True} in container["volumeMounts"]
        assert {"name": "ringseed-runtime", "mountPath": "/opt/ringseed", "readOnly": True} in container["volumeMounts"]
    assert train["ports"] == [{"name": "ringseed", "containerPort": 8472, "protocol": "TCP"}]
    assert "ports" not in sidecar


def test_worker_without_model_has_no_model_mount_or_label_and_template_is_not_mutated() -> None:
    spec = tg(modelRef=None, nodeSelector={"zone": "a"})
    before = copy.deepcopy(spec.template)
    worker = by_kind(builders.tg_children(body=TG_BODY, spec=spec, config=CFG, model=None))["DaemonSet"]
    pod = worker["spec"]["template"]["spec"]
    assert spec.template == before
    assert pod["nodeSelector"] == {"pool": "a100", "zone": "a"}
    assert all(v["name"] != "ringseed-model" for v in pod["volumes"])
    assert all(e["name"] != "RINGSEED_MODEL_PATH" for e in pod["containers"][0]["env"])


def test_cleanup_daemonset_removes_exactly_this_distributions_data(tmp_path: Path) -> None:
    cfg = config.OperatorConfig(data_root=str(tmp_path))
    spec = md(nodeSelector={"gpu": "yes"})
    cleanup = builders.cleanup_daemonset(body=MD_BODY, spec=spec, config=cfg)
    pod = cleanup["spec"]["template"]["spec"]
    assert cleanup["metadata"]["name"] == "llama-cleanup"
    assert pod["nodeSelector"] == {"gpu": "yes"}
    (remove,) = pod["initContainers"]
    assert remove["securityContext"] == HARDENED
    # lay out what an agent leaves, next to another model of the namespace, and run the real step
    agent = by_kind(builders.md_children(body=MD_BODY, spec=spec, config=cfg))["DaemonSet"]
    command = agent["spec"]["template"]["spec"]["containers"][0]["command"]
    data, cache = Path(_flag(command, "--data-dir")), Path(_flag(command, "--cache-dir"))
    doomed = [
        data / "ml/llama/w.bin",
        data / "ml/.llama.tmp-7/w.bin",
        data / "ml/.llama.old-7/w.bin",
        cache / "ml/llama/f",
    ]
    kept = [data / "ml/other/w.bin", cache / "ml/other/f", data / "ml/llama2/w.bin"]
    for path in doomed + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    subprocess.run([sys.executable, *remove["command"][1:]], check=True, capture_output=True)
    assert [p for p in doomed if p.exists()] == []
    assert all(p.exists() for p in kept)


def test_model_node_label_is_a_valid_label_even_for_long_names() -> None:
    assert builders.model_node_label(namespace="ml", name="llama") == ("models.ringseed.io/ml.llama", "verified")
    long_key, _ = builders.model_node_label(namespace="n" * 63, name="m" * 55)
    other_key, _ = builders.model_node_label(namespace="n" * 63, name="m" * 54)
    name_part = long_key.split("/", 1)[1]
    assert len(name_part) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", name_part)
    assert long_key != other_key


def test_too_long_resource_name_is_a_spec_error_from_the_builders() -> None:
    body = {**MD_BODY, "metadata": {**MD_BODY["metadata"], "name": "x" * 56}}
    with pytest.raises(validation.SpecError) as info:
        builders.md_children(body=body, spec=md(), config=CFG)
    assert info.value.field == "metadata.name"


@pytest.mark.parametrize("module", ["ringseed.master.command", "ringseed.agent.command"])
def test_built_command_lines_parse_with_the_real_commands(module: str) -> None:
    """The contract's command lines: what the builders write is what ``ringseed master|agent`` accept."""
    command_module = importlib.import_module(module)
    spec = md(cache={"ssdPath": "/data/ringseed/nvme", "ssdBytes": "1Ti", "memoryBytes": "1Gi"}, originRateLimit="1Gi")
    pods = [
        *builders.md_children(body=MD_BODY, spec=spec, config=CFG),
        *builders.tg_children(body=TG_BODY, spec=tg(collective={"optimizeTopology": True}), config=CFG, model=spec),
    ]
    commands = [
        container["command"]
        for obj in pods
        if obj["kind"] in ("Deployment", "DaemonSet")
        for container in obj["spec"]["template"]["spec"]["containers"]
        if container.get("command", [])[:2] == ["ringseed", module.split(".")[1]]
    ]
    assert commands
    for command in commands:
        parser = argparse.ArgumentParser()
        command_module.configure(parser)
        args = parser.parse_args(
            [arg.replace("$(NODE_NAME)", "node-a").replace("$(POD_IP)", "10.0.0.7") for arg in command[2:]]
        )
        assert args.port in (8470, 8471)
        assert args.token_file == "/etc/ringseed/token"


def test_tracker_masters_may_use_leases_and_nothing_else_and_one_replica_needs_none() -> None:
    kinds = by_kind(builders.md_children(body=MD_BODY, spec=md(), config=CFG))
    assert set(kinds) == {"Deployment", "Service", "DaemonSet"}  # the identity is the namespace's, made once
    assert builders_common.uses_master_identity(kinds["Deployment"])
    identity = by_kind(builders_common.master_identity(namespace="ml"))
    assert identity["Role"]["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "patch"]}
    ]
    assert identity["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "ringseed-master", "namespace": "ml"}
    ]
    assert identity["RoleBinding"]["roleRef"]["name"] == identity["Role"]["metadata"]["name"] == "ringseed-master"
    assert identity["ServiceAccount"]["metadata"]["name"] == "ringseed-master"
    assert all("ownerReferences" not in obj["metadata"] for obj in identity.values())  # no one resource owns it
    single = by_kind(builders.md_children(body=MD_BODY, spec=md(), config=dataclasses.replace(CFG, tracker_replicas=1)))
    assert set(single) == {"Deployment", "Service", "DaemonSet"}
    assert not builders_common.uses_master_identity(single["Deployment"])
    pod = single["Deployment"]["spec"]["template"]["spec"]
    assert single["Deployment"]["spec"]["replicas"] == 1 and pod["automountServiceAccountToken"] is False
    assert "--lease" not in pod["containers"][0]["command"]
