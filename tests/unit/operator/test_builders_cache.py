"""The node cache's children of a TrainingGroup: cache master pair with a Lease identity, agents, worker mounts."""

from __future__ import annotations

from typing import Any

import pytest

from ringseed.api import constants, validation
from ringseed.operator import builders, builders_cache, config

CONFIG = config.OperatorConfig()


def group(**spec: Any) -> tuple[dict[str, Any], Any]:
    body = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.TG_KIND,
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1"},
        "spec": {"template": {"spec": {"containers": [{"name": "t", "image": "img"}]}}, **spec},
    }
    return body, validation.parse_training_group(body["spec"], name="train", data_root=CONFIG.data_root)


def by_kind(children: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def test_no_cache_children_without_checkpoints_or_data() -> None:
    body, spec = group()
    kinds = by_kind(builders.tg_children(body=body, spec=spec, config=CONFIG, model=None))
    assert set(kinds) == {("Deployment", "train-master"), ("Service", "train-master"), ("DaemonSet", "train-worker")}
    worker = kinds["DaemonSet", "train-worker"]["spec"]["template"]["spec"]["containers"][0]
    assert "RINGSEED_CACHE_SOCKET" not in {e["name"] for e in worker["env"]}


def test_checkpoints_bring_a_cache_master_pair_agents_and_a_lease_only_identity() -> None:
    body, spec = group(
        checkpoints={
            "sink": {"uri": "s3://b/ck", "secretRef": {"name": "s3-creds"}},
            "replicas": 3, "memoryBytes": "8Gi", "ssdBytes": "100Gi", "keep": 2, "persistRateLimit": "50Mi",
        }
    )  # fmt: skip
    kinds = by_kind(builders.tg_children(body=body, spec=spec, config=CONFIG, model=None))
    master = kinds["Deployment", "train-cache"]
    assert master["spec"]["replicas"] == 2
    pod = master["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ringseed-master" and pod["automountServiceAccountToken"] is True
    command = pod["containers"][0]["command"]
    for flag, value in (("--role", "cache"), ("--lease", "train-cache"), ("--replicas", "3"), ("--keep", "2")):
        assert command[command.index(flag) + 1] == value
    assert command[command.index("--sink") + 1] == "s3://b/ck"
    assert not {kind for kind, _ in kinds} & {"ServiceAccount", "Role", "RoleBinding"}  # the namespace's identity
    service = kinds["Service", "train-cache"]
    assert service["spec"]["selector"] == master["spec"]["selector"]["matchLabels"]
    coordinator = kinds["Service", "train-master"]["spec"]["selector"]
    assert coordinator != service["spec"]["selector"]  # the coordinator's Service never routes to cache masters
    agent = kinds["DaemonSet", "train-cache-agent"]["spec"]["template"]["spec"]
    argv = agent["containers"][0]["command"]
    assert argv[:4] == ["ringseed", "agent", "--role", "cache"]
    assert argv[argv.index("--master-url") + 1] == "http://train-cache.ml.svc:8470"
    assert argv[argv.index("--memory-bytes") + 1] == str(8 << 30)
    assert argv[argv.index("--persist-rate-limit") + 1] == str(50 << 20)
    assert agent["containers"][0]["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]


def test_workers_reach_the_cache_at_the_agents_own_paths() -> None:
    body, spec = group(checkpoints={"ssdBytes": "10Gi"})
    kinds = by_kind(builders.tg_children(body=body, spec=spec, config=CONFIG, model=None))
    agent_pod = kinds["DaemonSet", "train-cache-agent"]["spec"]["template"]["spec"]
    agent_paths = {m["mountPath"] for m in agent_pod["containers"][0]["volumeMounts"]}
    worker = kinds["DaemonSet", "train-worker"]["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in worker["containers"][0]["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in worker["containers"][0]["env"]}
    paths = builders_cache.node_paths(spec=spec, config=CONFIG, namespace="ml", name="train")
    assert env["RINGSEED_CACHE_SOCKET"] == paths.socket == "/run/ringseed/ml/train/cache.sock"
    for path in (paths.memory, paths.socket_dir, paths.ssd):
        assert path in mounts and path in agent_paths  # same path on both sides
    assert mounts[paths.ssd].get("readOnly") is True and not mounts[paths.memory].get("readOnly")
    hosts = {v["hostPath"]["path"] for v in worker["volumes"] if "hostPath" in v}
    assert {paths.memory, paths.socket_dir, paths.ssd} <= hosts


def test_data_and_checkpoints_share_one_budget() -> None:
    body, spec = group(
        checkpoints={"memoryBytes": "4Gi"},
        data={"sources": [{"name": "imagenet", "uri": "s3://b/imagenet", "secretRef": {"name": "d"}}],
              "memoryBytes": "2Gi", "ssdBytes": "1Ti"},
    )  # fmt: skip
    assert builders_cache.budgets(spec) == (6 << 30, 1 << 40)
    agent = by_kind(builders.tg_children(body=body, spec=spec, config=CONFIG, model=None))[
        "DaemonSet", "train-cache-agent"
    ]["spec"]["template"]["spec"]["containers"][0]
    assert agent["envFrom"] == [{"secretRef": {"name": "d"}}]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"checkpoints": {"sink": {"uri": "http://x/y"}}}, "spec.checkpoints.sink.uri"),
        ({"checkpoints": {"replicas": 9}}, "spec.checkpoints.replicas"),
        ({"checkpoints": {"chunkSize": "1Mi"}}, "spec.checkpoints.chunkSize"),
        ({"checkpoints": {"memoryBytes": "16Mi"}}, "spec.checkpoints.memoryBytes"),
        ({"checkpoints": {"ssdPath": "/etc/x"}}, "spec.checkpoints.ssdPath"),
        ({"checkpoints": {"keep": -1}}, "spec.checkpoints.keep"),
        ({"checkpoints": {"sinks": {}}}, "spec.checkpoints.sinks"),
        ({"data": {"sources": []}}, "spec.data.sources"),
        ({"data": {"sources": [{"name": "a", "uri": "s3://b/a"}, {"name": "a", "uri": "s3://b/c"}]}},
         "spec.data.sources[1].name"),
        ({"data": {"sources": [{"name": "a", "uri": "ftp://x"}]}}, "spec.data.sources[0].uri"),
        ({"data": {"sources": [{"name": "a", "uri": "s3://b"}], "mountPath": "relative"}}, "spec.data.mountPath"),
    ],
)  # fmt: skip
def test_bad_cache_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(validation.SpecError) as caught:
        group(**spec)
    assert caught.value.field == field


def test_data_sources_become_agent_flags_and_a_mount_sidecar_for_the_workers() -> None:
    body, spec = group(
        data={"sources": [{"name": "imagenet", "uri": "s3://b/in"}], "mountPath": "/data",
              "warmup": {"paths": ["train"]}, "listTTLSeconds": 60},
    )  # fmt: skip
    kinds = by_kind(builders.tg_children(body=body, spec=spec, config=CONFIG, model=None))
    argv = kinds["DaemonSet", "train-cache-agent"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--data") + 1] == "imagenet=s3://b/in"
    assert argv[argv.index("--list-ttl") + 1] == "60" and "--warmup" in argv and "--warmup-path=train" in argv
    pod = kinds["DaemonSet", "train-worker"]["spec"]["template"]["spec"]
    user, sidecar = pod["containers"]
    assert sidecar["command"] == ["ringseed", "mount", "/data", "--root", "data", "--list-ttl", "60"]
    assert sidecar["securityContext"]["privileged"] is True
    shared = {m["mountPath"]: m for m in sidecar["volumeMounts"]}["/data"]
    seen = {m["mountPath"]: m for m in user["volumeMounts"]}["/data"]
    assert shared["mountPropagation"] == "Bidirectional" and seen["mountPropagation"] == "HostToContainer"
    assert seen["name"] == shared["name"] and seen["readOnly"] is True
    env = {e["name"] for e in sidecar["env"]}
    assert {"RINGSEED_CACHE_SOCKET", "RINGSEED_TOKEN"} <= env


def test_status_shows_the_data_cache_fill() -> None:
    from ringseed.operator import caches

    report = {
        "nodes": ["a", "b"],
        "data": {"sources": {"x": {"cached_bytes": 50, "total_bytes": 100, "nodes_complete": 1},
                             "y": {"cached_bytes": 100, "total_bytes": 100, "nodes_complete": 2}},
                 "hit_ratio": 0.75},
    }  # fmt: skip
    assert caches.data_status(report) == {
        "cachedBytes": 150, "totalBytes": 200, "percent": 75, "hitRatio": 0.75, "warmedUp": False
    }  # fmt: skip
    assert caches.data_status({"data": {"sources": {}}}) is None


def test_the_cache_status_fields_conform_to_the_crd() -> None:
    import jsonschema

    from ringseed.operator import caches
    from tests.unit.operator.test_validate_manifests import _nullable, schema_of

    report = {
        "nodes": ["a"], "leading": True,
        "last_checkpoint": {"name": "s", "files": 1, "bytes": 5, "copies": 2, "persisted": True, "committed_at": 1.5},
        "data": {"sources": {"x": {"cached_bytes": 1, "total_bytes": 2, "nodes_complete": 1}}, "hit_ratio": None},
    }  # fmt: skip
    written = {
        "cacheMaster": "Leading",
        "lastCheckpoint": caches.checkpoint_status(report),
        "data": caches.data_status(report),
    }
    schema = _nullable(schema_of(constants.TG_PLURAL)["properties"]["status"])
    jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker()).validate(written)
