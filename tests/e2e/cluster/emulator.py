"""The operator tests' KMock emulator, plus what ``kubectl`` needs of an API server here.

Owns: the resources the deployed cluster uses (declared as KMock requires), and server-side
printing: a ``GET`` of ModelDistributions or TrainingGroups that asks for a ``Table`` (as
``kubectl get`` does) is answered with the CRD's ``additionalPrinterColumns`` (read from
``crds/``) evaluated on each object, as the API server does, so ``kubectl get md`` shows the
columns a user sees. Ages are rendered as the API server renders them (``12s``, ``3m``). And the
core group's discovery names its group version ``v1`` (KMock 0.8 says ``/v1``, which leaves
kubectl without any core kind).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock as kmock_lib
import yaml
from kmock._internal import rendering

from tests.component.operator import conftest as operator_conftest
from tests.component.operator.emulator import Emulator
from tests.conftest import REPO

VERBS = operator_conftest.VERBS
EXTRA = {
    "v1/pods": ("Pod", True),
    "v1/configmaps": ("ConfigMap", True),
    "v1/serviceaccounts": ("ServiceAccount", True),
    "rbac.authorization.k8s.io/v1/clusterroles": ("ClusterRole", False),
    "rbac.authorization.k8s.io/v1/clusterrolebindings": ("ClusterRoleBinding", False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False),
}
WITH_STATUS = ("v1/pods", "apps/v1/deployments", "apps/v1/daemonsets")


def declare(kmock: Any) -> None:
    operator_conftest.declare(kmock)
    for path, (kind, namespaced) in EXTRA.items():
        kmock.resources[path] = kmock_lib.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS)
    for path in WITH_STATUS:
        info = kmock.resources[path]
        kmock.resources[path] = kmock_lib.ResourceInfo(
            kind=info.kind, namespaced=info.namespaced, verbs=VERBS, subresources={"status"}
        )
    for namespace in ("default", "ringseed-system"):
        kmock.objects["v1/namespaces", None, namespace] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace},
        }


def printer_columns() -> dict[str, list[dict[str, Any]]]:
    """plural -> the CRD's printer columns (from crds/)."""
    columns = {}
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        version = next(v for v in crd["spec"]["versions"] if v.get("served", True))
        columns[crd["spec"]["names"]["plural"]] = version.get("additionalPrinterColumns", [])
    return columns


def _jsonpath(obj: Any, path: str) -> Any:
    for part in path.lstrip(".").split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _age(timestamp: str | None) -> str | None:
    if not timestamp:
        return None
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = int((datetime.datetime.now(tz=datetime.UTC) - then).total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def table(objects: list[dict[str, Any]], columns: list[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    definitions = [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}]
    definitions += [
        {
            "name": c["name"],
            "type": "string" if c["type"] == "date" else c["type"],
            "format": "",
            "description": c.get("description", ""),
            "priority": c.get("priority", 0),
        }
        for c in columns
    ]
    rows = []
    for obj in objects:
        cells: list[Any] = [obj["metadata"]["name"]]
        for column in columns:
            value = _jsonpath(obj, column["jsonPath"])
            cells.append(_age(value) if column["type"] == "date" else value)
        meta = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        rows.append({"cells": cells, "object": meta})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }


def verb_of(request: rendering.Request) -> str:
    method = str(request.method.value if hasattr(request.method, "value") else request.method)
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if request.name else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())


def allowed(rules: list[dict[str, Any]], *, group: str, resource: str, verb: str, name: str | None) -> bool:
    for rule in rules:
        if not ({group, "*"} & set(rule.get("apiGroups", []))):
            continue
        if not ({resource, "*"} & set(rule.get("resources", []))):
            continue
        if not ({verb, "*"} & set(rule.get("verbs", []))):
            continue
        names = rule.get("resourceNames")
        if names and name not in names:
            continue
        return True
    return False


@attrs.define(kw_only=True)
class PrintingEmulator(Emulator):
    """:class:`Emulator` that answers ``as=Table`` reads of custom resources with printer columns,
    and enforces RBAC for service accounts.

    RBAC: a request whose bearer token belongs to a service account (``identities``: token ->
    (namespace, name), the kubelet's tokens) is checked against the ClusterRoles bound to that
    account by ClusterRoleBindings stored here, as the API server's RBAC authorizer does
    (apiGroups, resources with ``/subresource``, verbs, resourceNames); a denial answers 403 and is
    recorded in ``denied`` for the test to assert on. Other callers (kubectl, the harness) act as
    cluster administrators; discovery paths are open to all.
    """

    identities: dict[str, tuple[str, str]] = attrs.field(factory=dict)
    denied: list[str] = attrs.field(factory=list, init=False)
    _columns: dict[str, list[dict[str, Any]]] = attrs.field(factory=printer_columns, init=False)

    def _rules_for(self, namespace: str, account: str) -> list[dict[str, Any]]:
        rules: list[dict[str, Any]] = []
        for key, binding in list(self._objects._objects.items()):
            if key[0].plural != "clusterrolebindings" or binding.deleted:
                continue
            subjects = binding.raw.get("subjects") or []
            if not any(
                s.get("kind") == "ServiceAccount" and s.get("name") == account and s.get("namespace") == namespace
                for s in subjects
            ):
                continue
            role_name = binding.raw.get("roleRef", {}).get("name")
            for role_key, role in list(self._objects._objects.items()):
                if role_key[0].plural == "clusterroles" and role_key[2] == role_name and not role.deleted:
                    rules += role.raw.get("rules") or []
        return rules

    def _authorize(self, request: rendering.Request) -> str | None:
        header = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
        identity = self.identities.get(header.removeprefix("Bearer ").strip())
        if identity is None or request.resource is None:
            return None
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        group, verb = request.resource.group or "", verb_of(request)
        if allowed(self._rules_for(*identity), group=group, resource=resource, verb=verb, name=request.name):
            return None
        return (
            f"system:serviceaccount:{identity[0]}:{identity[1]} cannot {verb} resource {resource!r} "
            f"in API group {group!r}" + (f" in namespace {request.namespace!r}" if request.namespace else "")
        )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        problem = self._authorize(request)
        if problem is not None:
            self.denied.append(problem)
            body = {
                "apiVersion": "v1",
                "kind": "Status",
                "status": "Failure",
                "reason": "Forbidden",
                "code": 403,
                "message": problem,
                "metadata": {},
            }
            return aiohttp.web.json_response(body, status=403)
        response = await super()._handle(request)
        if request.url.path == "/api/v1" and isinstance(response, aiohttp.web.Response) and response.body is not None:
            # KMock 0.8 names the core group version "/v1"; kubectl then finds no core kinds at all.
            listing = json.loads(bytes(response.body))  # type: ignore[arg-type]
            listing["groupVersion"] = "v1"
            return aiohttp.web.json_response(listing)
        plural = request.resource.plural if request.resource is not None else None
        accept = next((v for k, v in request.headers.items() if k.lower() == "accept"), "")
        wants_table = "as=Table" in accept and plural in self._columns and request.method == "GET"
        if not wants_table or request.params.get("watch") or not isinstance(response, aiohttp.web.Response):
            return response
        if response.status != 200 or response.body is None:
            return response
        body = json.loads(bytes(response.body))  # type: ignore[arg-type]
        objects = body.get("items", [body]) if isinstance(body, dict) else []
        return aiohttp.web.json_response(table(objects, self._columns[plural], str(self._revision)))


def kubeconfig(path: Path, *, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "e2e",
                "clusters": [{"name": "e2e", "cluster": {"server": server}}],
                "users": [{"name": "e2e", "user": {"token": "e2e-admin"}}],
                "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e", "namespace": "default"}}],
            }
        )
    )
    return path
