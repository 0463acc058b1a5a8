"""The manifests users apply: CRDs, the Helm chart's output and the examples.

Checked offline (no sockets): Kubernetes 1.35 schemas in strict mode (kubernetes-validate), the
chart with the helm binary from hack/install-helm.sh (skipped with a reason when it is absent),
and the examples against the CRDs' openAPIV3Schema (jsonschema; x-kubernetes-* keywords are
ignored there, the API server enforces them).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import kubernetes_validate
import pytest
import yaml

from ringseed.api import constants, validation
from ringseed.operator import builders, config, status, swarm

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "ringseed"
HELM = shutil.which("helm", path=str(REPO / ".tools" / "bin")) or shutil.which("helm")
needs_helm = pytest.mark.skipif(HELM is None, reason="helm binary absent (run hack/install-helm.sh)")
KUBERNETES = "1.35.0"


def crd(plural: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "crds" / f"ringseed.io_{plural}.yaml").read_text())
    return loaded


def schema_of(plural: str) -> dict[str, Any]:
    schema: dict[str, Any] = crd(plural)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def helm(*args: str) -> str:
    assert HELM is not None
    result = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def render(*sets: str) -> list[dict[str, Any]]:
    flags = [arg for item in sets for arg in ("--set", item)]
    text = helm("template", "rs", str(CHART), "--namespace", "ringseed-system", *flags)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def examples() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted((REPO / "examples").rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


@pytest.mark.parametrize("plural", [constants.MD_PLURAL, constants.TG_PLURAL])
def test_crds_are_valid_custom_resource_definitions(plural: str) -> None:
    definition = crd(plural)
    kubernetes_validate.validate(definition, KUBERNETES, strict=True)
    version = definition["spec"]["versions"][0]
    assert (definition["spec"]["group"], version["name"]) == (constants.GROUP, constants.VERSION)
    assert version["subresources"] == {"status": {}}
    assert definition["spec"]["names"]["categories"] == [constants.CATEGORY]


def test_crds_state_the_enums_and_bounds_the_code_uses() -> None:
    md, tg = schema_of(constants.MD_PLURAL)["properties"], schema_of(constants.TG_PLURAL)["properties"]
    assert tuple(md["status"]["properties"]["phase"]["enum"]) == constants.MD_PHASES
    assert tuple(tg["status"]["properties"]["phase"]["enum"]) == constants.TG_PHASES
    assert tuple(md["spec"]["properties"]["retainPolicy"]["enum"]) == constants.RETAIN_POLICIES
    assert (
        tuple(tg["spec"]["properties"]["collective"]["properties"]["quantization"]["enum"]) == constants.QUANTIZATIONS
    )
    chunk = md["spec"]["properties"]["chunkSize"]
    assert (chunk["minimum"], chunk["maximum"]) == (constants.MIN_CHUNK_SIZE, constants.MAX_CHUNK_SIZE)
    seeders = md["spec"]["properties"]["seeders"]
    assert (seeders["minimum"], seeders["maximum"]) == (constants.MIN_SEEDERS, constants.MAX_SEEDERS)


@pytest.mark.parametrize(
    ("plural", "fields"),
    [(constants.MD_PLURAL, validation.MD_FIELDS), (constants.TG_PLURAL, validation.TG_FIELDS)],
)
def test_the_crds_and_the_validation_accept_the_same_spec_fields(plural: str, fields: frozenset[str]) -> None:
    assert set(schema_of(plural)["properties"]["spec"]["properties"]) == fields


def test_printer_columns_show_what_kubectl_get_promises() -> None:
    def columns(plural: str) -> list[str]:
        return [c["name"] for c in crd(plural)["spec"]["versions"][0]["additionalPrinterColumns"]]

    assert columns(constants.MD_PLURAL) == [
        "Phase", "Ready", "Total", "Percent", "Throughput", "ETA", "Age", "Revision", "Source", "Message"
    ]  # fmt: skip
    assert columns(constants.TG_PLURAL) == [
        "Phase", "Peers", "World", "Checkpoint", "Copies", "Persisted", "Saved", "Cached", "Age"
    ]  # fmt: skip
    wide = {
        c["name"]: (c["jsonPath"], c.get("priority", 0))
        for c in crd(constants.MD_PLURAL)["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert wide["Source"] == (".spec.source.uri", 1) and wide["Message"] == (".status.message", 1)  # -o wide


def _nullable(schema: Any) -> Any:
    """The structural schema as JSON Schema: ``nullable: true`` admits null (the API server's rule)."""
    if isinstance(schema, dict):
        out = {k: _nullable(v) for k, v in schema.items() if k != "nullable"}
        if schema.get("nullable") and "type" in out:
            out["type"] = [out["type"], "null"]
        return out
    return [_nullable(v) for v in schema] if isinstance(schema, list) else schema


def test_the_status_the_operator_writes_conforms_to_the_crd() -> None:
    report = {
        "role": "tracker", "total_bytes": 1000, "total_chunks": 1, "revision": "r2", "throughput_bps": 10.0,
        "eta_seconds": None, "bytes_from_origin": 1000, "manifest_digest": "ab" * 32,
        "nodes": {
            "a": {"bytes": 1000, "verified": True, "online": True, "revision": "r2"},
            "b": {"bytes": 10, "verified": False, "online": True, "reason": "DiskFull", "message": "no space"},
        },
    }  # fmt: skip
    agents = swarm.Agents(desired=3, nodes=frozenset({"a", "b", "c"}), rolled_out=True, pod_problems={})
    view = status.swarm_for(report, agents=agents, previous={}, now="2026-01-01T00:00:00Z", degraded_after=60)
    written = status.md_status(
        reach=status.Reach(report=report), swarm=view, generation=1, previous={}, now="2026-01-01T00:00:00Z",
        degraded_after=60,
    )  # fmt: skip
    assert {n["name"] for n in written["nodes"]} == {"a", "b", "c"}
    schema = _nullable(schema_of(constants.MD_PLURAL)["properties"]["status"])
    jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker()).validate(written)
    silent = status.md_status(
        reach=status.Reach(report=None), generation=1, previous={}, now="2026-01-01T00:00:00Z", degraded_after=60
    )
    jsonschema.Draft7Validator(schema).validate(silent)


@pytest.mark.parametrize(("name", "doc"), examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_examples_parse_and_conform_to_the_crd_schema(name: str, doc: dict[str, Any]) -> None:
    if doc["kind"] == constants.MD_KIND:
        spec = validation.parse_model_distribution(
            doc["spec"], name=doc["metadata"]["name"], data_root=constants.DEFAULT_DATA_ROOT
        )
        children = builders.md_children(body=doc, spec=spec, config=config.OperatorConfig())
        jsonschema.Draft7Validator(schema_of(constants.MD_PLURAL)).validate(doc)
    elif doc["kind"] == constants.TG_KIND:
        tg_spec = validation.parse_training_group(doc["spec"], name=doc["metadata"]["name"])
        children = builders.tg_children(body=doc, spec=tg_spec, config=config.OperatorConfig(), model=None)
        jsonschema.Draft7Validator(schema_of(constants.TG_PLURAL)).validate(doc)
    else:
        children = [doc]
    for child in children:
        kubernetes_validate.validate(child, KUBERNETES, strict=True)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "seeders"), 65),
        (("spec", "chunkSize"), "64MB"),
        (("spec", "chunkSize"), 1024),
        (("spec", "retainPolicy"), "Keep"),
        (("spec", "source", "uri"), "ftp://x/y"),
    ],
)
def test_crd_schema_rejects_what_validation_rejects(path: tuple[str, ...], value: object) -> None:
    doc = copy.deepcopy(dict(examples())["modeldistribution-http.yaml"])
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema_of(constants.MD_PLURAL)).validate(doc)
    with pytest.raises(validation.SpecError):
        validation.parse_model_distribution(doc["spec"])


@needs_helm
def test_helm_lint_strict_passes() -> None:
    helm("lint", "--strict", str(CHART))
    helm(
        "lint", "--strict", str(CHART), "--set", "metrics.podMonitor.enabled=true,metrics.grafanaDashboard.enabled=true"
    )


@needs_helm
@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("crds.enabled=false",),
        ("crds.keep=false", "operator.watchNamespaces={ml,research}", "imagePullSecrets={regcred}"),
        ("operator.serviceAccount.create=false", "operator.serviceAccount.name=existing", "image.tag=dev"),
        ("image.tag=1", "metrics.podMonitor.enabled=true", "metrics.grafanaDashboard.enabled=true"),
    ],
)
def test_rendered_chart_validates_strictly(sets: tuple[str, ...]) -> None:
    docs = render(*sets)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds.count("Deployment") == 1
    assert kinds.count("CustomResourceDefinition") == (0 if "crds.enabled=false" in sets else 2)
    assert kinds.count("ServiceAccount") == (0 if "operator.serviceAccount.create=false" in sets else 1)


# What the operator calls (ringseed/operator/kube.py, runtime.py, groups.py) plus kopf's own needs:
# watch the custom resources and patch their finalizers and annotations, scan namespaces and CRDs,
# post core v1 Events. No write verb the code never uses (Secrets are never patched: the token is
# made once). Read-only ``get`` on Nodes and on ``/status`` is not called today; the issue lists it.
OPERATOR_RBAC = {
    ("ringseed.io", "modeldistributions"): {"get", "list", "watch", "patch"},
    ("ringseed.io", "traininggroups"): {"get", "list", "watch", "patch"},
    ("ringseed.io", "modeldistributions/status"): {"get", "patch"},
    ("ringseed.io", "traininggroups/status"): {"get", "patch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
    ("", "events"): {"create"},
    ("apps", "deployments"): {"get", "create", "patch", "delete"},
    ("apps", "daemonsets"): {"get", "create", "patch", "delete"},
    ("", "services"): {"get", "create", "patch", "delete"},
    ("", "secrets"): {"get", "create", "delete"},
    ("", "nodes"): {"get", "list", "patch"},
    ("", "pods"): {"list"},
    # the node cache of TrainingGroups: the cache master's identity (it may only use Leases, which
    # the operator may grant only because it holds them itself)
    ("", "serviceaccounts"): {"get", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"get", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create", "patch", "delete"},
    ("coordination.k8s.io", "leases"): {"get", "create", "patch"},
}


@needs_helm
def test_operator_cluster_role_grants_exactly_the_verbs_used() -> None:
    (role,) = [doc for doc in render() if doc["kind"] == "ClusterRole"]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == OPERATOR_RBAC


@needs_helm
def test_chart_crds_equal_the_source_crds() -> None:
    rendered = {doc["metadata"]["name"]: doc for doc in render() if doc["kind"] == "CustomResourceDefinition"}
    for plural in (constants.MD_PLURAL, constants.TG_PLURAL):
        source = crd(plural)
        chart = rendered[source["metadata"]["name"]]
        assert chart["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        chart["metadata"] = {"name": chart["metadata"]["name"]}
        assert chart == source
    unkept = [doc for doc in render("crds.keep=false") if doc["kind"] == "CustomResourceDefinition"]
    assert all("annotations" not in doc["metadata"] for doc in unkept)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("diff") is None, reason="bash or diff absent")
def test_verify_crds_script_accepts_the_committed_chart() -> None:
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "verify-crds.sh")], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr + result.stdout


@needs_helm
def test_operator_reads_the_settings_the_chart_renders() -> None:
    docs = render("agent.dataRoot=/srv/ringseed", "agent.memoryBytes=2Gi", "operator.watchNamespaces={ml}")
    (configmap,) = [doc for doc in docs if doc["kind"] == "ConfigMap"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    cfg = config.OperatorConfig.from_env(configmap["data"])
    assert cfg.image == f"ghcr.io/ringseed/ringseed:{chart['appVersion']}"
    assert (cfg.data_root, cfg.agent_memory_bytes, cfg.watch_namespaces) == ("/srv/ringseed", 2 << 30, ("ml",))
    assert cfg.agent_resources == yaml.safe_load((CHART / "values.yaml").read_text())["agent"]["resources"]
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"configMapRef": {"name": configmap["metadata"]["name"]}}]
    assert container["command"][:2] == ["ringseed", "operator"]


@needs_helm
def test_config_checksum_restarts_the_operator_when_settings_change() -> None:
    def checksum(*sets: str) -> str:
        (deployment,) = [doc for doc in render(*sets) if doc["kind"] == "Deployment"]
        value: str = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    assert checksum() == checksum()
    assert checksum() != checksum("master.heartbeatSeconds=5")


@needs_helm
def test_values_schema_rejects_a_bad_value() -> None:
    assert HELM is not None
    result = subprocess.run(
        [HELM, "template", "rs", str(CHART), "--set", "image.pullPolicy=Sometimes"],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ},
    )  # fmt: skip
    assert result.returncode != 0
    assert "pullPolicy" in result.stderr


@needs_helm
@pytest.mark.parametrize(("tag", "image"), [("1", "r/x:1"), ("1.2.3", "r/x:1.2.3"), ("dev", "r/x:dev")])
def test_an_image_tag_may_be_a_number(tag: str, image: str) -> None:
    docs = render("image.repository=r/x", f"image.tag={tag}")  # --set makes "1" a number
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image
    (configmap,) = [doc for doc in docs if doc["kind"] == "ConfigMap"]
    assert config.OperatorConfig.from_env(configmap["data"]).image == image


@needs_helm
def test_agent_memory_must_be_bytes_not_milli() -> None:
    assert HELM is not None
    result = subprocess.run(
        [HELM, "template", "rs", str(CHART), "--set", "agent.memoryBytes=500m"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0 and "memoryBytes" in result.stderr


@needs_helm
def test_pod_monitors_are_the_operators_to_make_with_their_rbac() -> None:
    docs = render("metrics.podMonitor.enabled=true", "metrics.podMonitor.labels.release=prometheus")
    (configmap,) = [doc for doc in docs if doc["kind"] == "ConfigMap"]
    cfg = config.OperatorConfig.from_env(configmap["data"])
    assert (cfg.pod_monitor, cfg.pod_monitor_labels) == (True, {"release": "prometheus"})
    (role,) = [doc for doc in docs if doc["kind"] == "ClusterRole"]
    monitoring = [rule for rule in role["rules"] if rule["apiGroups"] == ["monitoring.coreos.com"]]
    assert monitoring == [{"apiGroups": ["monitoring.coreos.com"], "resources": ["podmonitors"],
                           "verbs": ["get", "create", "patch", "delete"]}]  # fmt: skip
    off = config.OperatorConfig.from_env(next(d for d in render() if d["kind"] == "ConfigMap")["data"])
    assert off.pod_monitor is False

    body = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.MD_KIND,
        "metadata": {"name": "llama", "namespace": "ml", "uid": "u1"},
        "spec": {"source": {"uri": "s3://b/m"}},
    }
    spec = validation.parse_model_distribution(body["spec"])
    children = builders.md_children(body=body, spec=spec, config=cfg)
    (monitor,) = [c for c in children if c["kind"] == "PodMonitor"]
    assert monitor["metadata"]["name"] == "llama-metrics" and monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["metadata"]["ownerReferences"][0]["uid"] == "u1"
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["http", "peer"]  # the master's and the agents' named ports
    ports = {
        p["name"]
        for c in children
        if c["kind"] in ("Deployment", "DaemonSet")
        for container in c["spec"]["template"]["spec"]["containers"]
        for p in container.get("ports", [])
    }
    assert {"http", "peer"} <= ports
    assert all(e["authorization"]["credentials"] == {"name": "llama-token", "key": "token"} for e in endpoints)
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert all(c["spec"]["template"]["metadata"]["labels"].items() >= selected.items() for c in children
               if c["kind"] in ("Deployment", "DaemonSet"))  # fmt: skip
    assert not [c for c in builders.md_children(body=body, spec=spec, config=off) if c["kind"] == "PodMonitor"]


def declared_metrics() -> set[str]:
    """Every metric the code writes (``Metrics.declare/set/inc("name", ...)``), with the ``ringseed_`` prefix."""
    names = set()
    pattern = re.compile(r'\.(?:declare|set|inc)\(\s*"([a-z_]+)"')
    for path in (REPO / "ringseed").rglob("*.py"):
        names.update(f"ringseed_{n}" for n in pattern.findall(path.read_text()))
    return names


@needs_helm
def test_the_grafana_dashboard_uses_only_metrics_that_exist() -> None:
    docs = render("metrics.grafanaDashboard.enabled=true")
    (dashboard,) = [doc for doc in docs if doc["kind"] == "ConfigMap" and "ringseed.json" in doc.get("data", {})]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboard["data"]["ringseed.json"])
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"ringseed_[a-z_]+", expr)}
    declared = declared_metrics()
    assert used and used <= declared, sorted(used - declared)
    for wanted in (
        "tracker_throughput_bps",
        "tracker_bytes_from_origin",
        "agent_chunks_held",
        "tracker_nodes_penalised",
        "coordinator_last_all_reduce_busbw_gbps",
    ):
        assert f"ringseed_{wanted}" in used
    assert not [d for d in render() if d["kind"] == "ConfigMap" and "ringseed.json" in d.get("data", {})]
