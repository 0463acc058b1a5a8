"""Validation of ModelDistribution and TrainingGroup specs: what is accepted, defaults, and that
every rejected spec names the field a user must fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ringseed.api import constants, types, validation

DIGEST = "ab" * 32


def md_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"source": {"uri": "s3://models/llama/"}}
    spec.update(changes)
    return spec


def tg_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"spec": {"containers": [{"name": "train", "image": "trainer:1"}]}}}
    spec.update(changes)
    return spec


def test_full_model_distribution_spec_is_normalised() -> None:
    raw = {
        "source": {
            "uri": "s3://models/llama/",
            "secretRef": {"name": "model-store"},
            "manifestUri": "https://example.com/manifest.json",
            "digest": "sha256:" + DIGEST.upper(),
        },
        "chunkSize": "16Mi",
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "cache": {"memoryBytes": "2Gi", "ssdPath": "/var/lib/ringseed/nvme//cache/", "ssdBytes": 10**12},
        "originRateLimit": "500M",
        "seeders": 4,
        "retainPolicy": "Delete",
    }
    assert validation.parse_model_distribution(raw, name="llama", data_root="/var/lib/ringseed") == (
        types.ModelDistributionSpec(
            source=types.SourceSpec(
                uri="s3://models/llama/",
                secret_name="model-store",
                manifest_uri="https://example.com/manifest.json",
                digest=DIGEST,
            ),
            chunk_size=16 << 20,
            node_selector={"nvidia.com/gpu.present": "true"},
            tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
            cache=types.CacheSpec(memory_bytes=2 << 30, ssd_path="/var/lib/ringseed/nvme/cache", ssd_bytes=10**12),
            origin_rate_limit=500_000_000,
            seeders=4,
            retain_policy="Delete",
        )
    )


def test_minimal_model_distribution_gets_defaults() -> None:
    assert validation.parse_model_distribution(md_spec()) == types.ModelDistributionSpec(
        source=types.SourceSpec(uri="s3://models/llama/"),
        chunk_size=64 << 20,
        seeders=1,
        retain_policy="Retain",
    )


@pytest.mark.parametrize("uri", ["s3://b", "http://h/x", "https://h/dir/", "file:///models/x"])
def test_every_source_scheme_is_accepted(uri: str) -> None:
    assert validation.parse_model_distribution(md_spec(source={"uri": uri})).source.uri == uri


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.source"),
        (md_spec(source={}), "spec.source.uri"),
        (md_spec(source={"uri": "ftp://host/x"}), "spec.source.uri"),
        (md_spec(source={"uri": "s3://"}), "spec.source.uri"),
        (md_spec(source={"uri": "s3:///prefix"}), "spec.source.uri"),
        (md_spec(source={"uri": "s3://b", "manifestUri": "gs://x"}), "spec.source.manifestUri"),
        (md_spec(source={"uri": "s3://b", "secretRef": {"name": "Bad_Name"}}), "spec.source.secretRef.name"),
        (md_spec(source={"uri": "s3://b", "secretRef": {}}), "spec.source.secretRef.name"),
        (md_spec(source={"uri": "s3://b", "digest": "md5:abc"}), "spec.source.digest"),
        (md_spec(source={"uri": "s3://b", "bucket": "x"}), "spec.source.bucket"),
        (md_spec(chunkSize=(1 << 20) - 1), "spec.chunkSize"),
        (md_spec(chunkSize="2Gi"), "spec.chunkSize"),
        (md_spec(chunkSize="64MB"), "spec.chunkSize"),
        (md_spec(chunkSize="1.3Mi"), "spec.chunkSize"),
        (md_spec(chunkSize="500m"), "spec.chunkSize"),
        (md_spec(chunkSize=True), "spec.chunkSize"),
        (md_spec(nodeSelector={"gpu": 1}), "spec.nodeSelector.gpu"),
        (md_spec(nodeSelector={"bad key!": "x"}), "spec.nodeSelector.bad key!"),
        (md_spec(tolerations={"key": "x"}), "spec.tolerations"),
        (md_spec(tolerations=[{"operator": "In"}]), "spec.tolerations[0].operator"),
        (md_spec(tolerations=[{"effect": "Sometimes"}]), "spec.tolerations[0].effect"),
        (md_spec(cache={"ssdPath": "relative/dir"}), "spec.cache.ssdPath"),
        (md_spec(cache={"ssdPath": "/var/lib/ringseed/../../etc"}), "spec.cache.ssdPath"),
        (md_spec(cache={"memoryBytes": -1}), "spec.cache.memoryBytes"),
        (md_spec(cache={"ssdBytes": "lots"}), "spec.cache.ssdBytes"),
        (md_spec(cache={"disk": 1}), "spec.cache.disk"),
        (md_spec(originRateLimit=0), "spec.originRateLimit"),
        (md_spec(seeders=0), "spec.seeders"),
        (md_spec(seeders=65), "spec.seeders"),
        (md_spec(seeders="2"), "spec.seeders"),
        (md_spec(retainPolicy="Keep"), "spec.retainPolicy"),
        (md_spec(chunksize="64Mi"), "spec.chunksize"),
    ],
)
def test_rejected_model_distribution_names_its_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(validation.SpecError) as info:
        validation.parse_model_distribution(spec)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_ssd_path_outside_the_data_root_is_rejected() -> None:
    spec = md_spec(cache={"ssdPath": "/mnt/nvme"})
    with pytest.raises(validation.SpecError) as info:
        validation.parse_model_distribution(spec, data_root="/var/lib/ringseed")
    assert info.value.field == "spec.cache.ssdPath"
    assert "/var/lib/ringseed" in info.value.problem
    # the root itself is not a cache directory either; a sibling with the same prefix is outside it
    for path in ("/var/lib/ringseed", "/var/lib/ringseed-other/cache"):
        with pytest.raises(validation.SpecError):
            validation.check_ssd_path(path, data_root="/var/lib/ringseed")
    validation.check_ssd_path("/var/lib/ringseed/nvme", data_root="/var/lib/ringseed/")


@pytest.mark.parametrize("name", ["Llama", "1model", "my.model", "a" * 56, "trailing-"])
def test_names_that_cannot_name_children_are_rejected(name: str) -> None:
    with pytest.raises(validation.SpecError) as info:
        validation.parse_model_distribution(md_spec(), name=name)
    assert info.value.field == "metadata.name"


def test_longest_allowed_name_is_accepted() -> None:
    validation.parse_model_distribution(md_spec(), name="a" * constants.MAX_NAME_LENGTH)


def test_training_group_is_normalised_with_defaults() -> None:
    raw = tg_spec(
        nodeSelector={"pool": "a100"}, minPeers=4, modelRef={"name": "llama"}, collective={"quantization": "bf16"}
    )
    assert validation.parse_training_group(raw, name="train") == types.TrainingGroupSpec(
        template=raw["template"],
        node_selector={"pool": "a100"},
        min_peers=4,
        model_ref=types.ModelRef(name="llama"),
        collective=types.CollectiveSpec(quantization="bf16", heartbeat_seconds=None, timeout_seconds=None),
    )
    minimal = validation.parse_training_group(tg_spec())
    assert (minimal.min_peers, minimal.model_ref, minimal.collective) == (1, None, types.CollectiveSpec())


def _template_with(**pod: Any) -> dict[str, Any]:
    template: dict[str, Any] = copy.deepcopy(tg_spec()["template"])
    template["spec"].update(pod)
    return template


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.template"),
        (tg_spec(template={"metadata": {}}), "spec.template.spec"),
        (tg_spec(template=_template_with(containers=[])), "spec.template.spec.containers"),
        (tg_spec(template=_template_with(containers=[{"name": "t"}])), "spec.template.spec.containers[0].image"),
        (tg_spec(template=_template_with(containers=[{"image": "x"}])), "spec.template.spec.containers[0].name"),
        (tg_spec(template=_template_with(restartPolicy="OnFailure")), "spec.template.spec.restartPolicy"),
        (
            tg_spec(template=_template_with(volumes=[{"name": "ringseed-runtime", "emptyDir": {}}])),
            "spec.template.spec.volumes[0].name",
        ),
        (
            tg_spec(template=_template_with(initContainers=[{"name": "ringseed-x", "image": "x"}])),
            "spec.template.spec.initContainers[0].name",
        ),
        (tg_spec(minPeers=0), "spec.minPeers"),
        (tg_spec(minPeers=10001), "spec.minPeers"),
        (tg_spec(modelRef={}), "spec.modelRef.name"),
        (tg_spec(modelRef={"name": "Llama"}), "spec.modelRef.name"),
        (tg_spec(modelRef={"name": "train"}), "spec.modelRef.name"),
        (tg_spec(collective={"quantization": "int4"}), "spec.collective.quantization"),
        (tg_spec(collective={"heartbeatSeconds": 0}), "spec.collective.heartbeatSeconds"),
        (tg_spec(collective={"timeoutSeconds": 3601}), "spec.collective.timeoutSeconds"),
        (tg_spec(collective={"heartbeatSeconds": 10, "timeoutSeconds": 10}), "spec.collective.timeoutSeconds"),
        (tg_spec(collective={"optimizeTopology": "yes"}), "spec.collective.optimizeTopology"),
        (tg_spec(replicas=3), "spec.replicas"),
    ],
)
def test_rejected_training_group_names_its_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(validation.SpecError) as info:
        validation.parse_training_group(spec, name="train")
    assert info.value.field == field


def test_a_size_in_m_is_refused_with_the_two_readings_named() -> None:
    with pytest.raises(validation.SpecError) as info:
        validation.parse_model_distribution(md_spec(originRateLimit="500m"))
    assert info.value.field == "spec.originRateLimit"
    assert "write 500M" in info.value.problem and "500Mi" in info.value.problem
