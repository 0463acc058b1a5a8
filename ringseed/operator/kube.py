"""The operator's only door to the Kubernetes API: read, create, merge-patch, delete, events, nodes.

Owns the HTTP client (aiohttp) and the apply rule for children. Rules:
- Credentials are a ``kopf.ConnectionInfo`` (the same kopf logs in with); on 401 the client asks
  its ``login`` callable once more, so rotated service-account tokens keep working.
- Children are applied as: read; create if missing; merge-patch only when the spec-hash annotation
  differs; otherwise send nothing. (No PUT, no server-side apply: neither is needed, and KMock
  supports neither.)
- Status goes to the ``/status`` subresource as a merge patch; nothing else writes it.
- 404 on read or delete is an answer (``None`` / ``False``), not an error; other failures raise
  :class:`ApiError` with the server's reason.
"""

from __future__ import annotations

import base64
import datetime
import enum
import logging
import ssl
import tempfile
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import kopf

from ringseed.operator import builders

log = logging.getLogger(__name__)

# kind -> (plural, namespaced)
KINDS: dict[str, tuple[str, bool]] = {
    "Secret": ("secrets", True),
    "Service": ("services", True),
    "Event": ("events", True),
    "Node": ("nodes", False),
    "Deployment": ("deployments", True),
    "DaemonSet": ("daemonsets", True),
    "ModelDistribution": ("modeldistributions", True),
    "TrainingGroup": ("traininggroups", True),
}

MERGE_PATCH = "application/merge-patch+json"
# Fields of a built object that a merge patch carries; the rest is the server's.
PATCHED_FIELDS = ("spec", "data", "stringData", "type")


class ApiError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP code, the message the server's reason."""

    def __init__(self, *, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Applied(enum.Enum):
    CREATED = "Created"
    PATCHED = "Patched"
    UNCHANGED = "Unchanged"


def path_of(*, api_version: str, kind: str, namespace: str | None = None, name: str | None = None) -> str:
    """The URL path of a collection (no name) or of one object."""
    plural, namespaced = KINDS[kind]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespaced and namespace else ""
    tail = f"/{name}" if name else ""
    return f"{base}{scope}/{plural}{tail}"


def _path_of_obj(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return path_of(api_version=obj["apiVersion"], kind=obj["kind"], namespace=meta.get("namespace"), name=meta["name"])


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if not str(info.server).startswith("https"):
        return False
    if info.insecure:
        return False
    context = ssl.create_default_context(cafile=str(info.ca_path) if info.ca_path else None)
    if info.ca_data:
        data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        context.load_verify_locations(cadata=data)
    cert, key = info.certificate_path, info.private_key_path
    if info.certificate_data and info.private_key_data:
        cert, key = _to_file(info.certificate_data), _to_file(info.private_key_data)
    if cert:
        context.load_cert_chain(certfile=str(cert), keyfile=str(key) if key else None)
    return context


def _to_file(data: str | bytes) -> str:
    with tempfile.NamedTemporaryFile("wb", delete=False, suffix=".pem") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
        return handle.name


class Client:
    """A small async Kubernetes REST client; one aiohttp session, opened lazily, closed by ``close``."""

    def __init__(self, *, login: Callable[[], kopf.ConnectionInfo]) -> None:
        self._login = login
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._info = self._login()
            headers = {"Accept": "application/json"}
            if self._info.token:
                headers["Authorization"] = f"{self._info.scheme or 'Bearer'} {self._info.token}"
            auth = None
            if self._info.username and self._info.password:
                auth = aiohttp.BasicAuth(self._info.username, self._info.password)
            self._session = aiohttp.ClientSession(
                base_url=str(self._info.server).rstrip("/") + "/",
                headers=headers,
                auth=auth,
                connector=aiohttp.TCPConnector(ssl=_ssl_context(self._info), limit=64),
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """One call; returns the JSON answer, or None for 404. Retries once after a fresh login on 401."""
        for attempt in (1, 2):
            try:
                status, payload = await self._send(method, path, body=body, content_type=content_type, params=params)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ApiError(status=0, message=f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            if status == 401 and attempt == 1:
                await self.close()
                continue
            if status == 404:
                return None
            if status >= 400:
                message = payload.get("message", "") if isinstance(payload, dict) else str(payload)
                raise ApiError(status=status, message=f"{method} {path}: {message}")
            return payload
        raise ApiError(status=401, message=f"{method} {path}: unauthorized after a fresh login")

    async def _send(
        self, method: str, path: str, *, body: Any, content_type: str | None, params: Mapping[str, str] | None
    ) -> tuple[int, Any]:
        headers = {"Content-Type": content_type} if content_type else None
        session = self._open()
        async with session.request(method, path.lstrip("/"), json=body, headers=headers, params=params) as response:
            if response.status in (401, 404):
                return response.status, None
            return response.status, await response.json(content_type=None)

    async def get(self, *, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await self.request(
            "GET", path_of(api_version=api_version, kind=kind, namespace=namespace, name=name)
        )
        return result

    async def list(
        self, *, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self.request(
            "GET", path_of(api_version=api_version, kind=kind, namespace=namespace), params=params
        )
        return list(result.get("items", [])) if result else []

    async def create(self, *, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = path_of(api_version=obj["apiVersion"], kind=obj["kind"], namespace=meta.get("namespace"))
        result: dict[str, Any] = await self.request("POST", path, body=obj)
        return result

    async def merge_patch(self, *, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        return result

    async def delete(self, *, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        path = path_of(api_version=api_version, kind=kind, namespace=namespace, name=name)
        return await self.request("DELETE", path, body={"propagationPolicy": "Background"}) is not None


def spec_hash(obj: Mapping[str, Any]) -> str | None:
    value = obj.get("metadata", {}).get("annotations", {}).get(builders.SPEC_HASH_ANNOTATION)
    return None if value is None else str(value)


def merge_patch_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that brings a live object to a built one (labels, annotations, owners, spec)."""
    meta = obj["metadata"]
    patch: dict[str, Any] = {
        "metadata": {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta}
    }
    patch.update({k: obj[k] for k in PATCHED_FIELDS if k in obj})
    return patch


async def apply(client: Client, *, obj: Mapping[str, Any], once: bool = False, fresh: bool = False) -> Applied:
    """Create ``obj`` if missing; merge-patch it when its spec-hash differs (never, with ``once``).

    ``fresh`` (the owner was just created, so its children most likely do not exist yet): try the
    create first and read only if it already exists, which saves a round trip per child.
    """
    meta = obj["metadata"]
    if fresh and await _create(client, obj=obj):
        return Applied.CREATED
    current = await client.get(
        api_version=obj["apiVersion"], kind=obj["kind"], namespace=meta.get("namespace"), name=meta["name"]
    )
    if current is None:
        return Applied.CREATED if await _create(client, obj=obj) else Applied.UNCHANGED
    if once or spec_hash(current) == spec_hash(obj):
        return Applied.UNCHANGED
    await client.merge_patch(path=_path_of_obj(obj), patch=merge_patch_of(obj))
    return Applied.PATCHED


async def _create(client: Client, *, obj: Mapping[str, Any]) -> bool:
    """True if created; False if it exists already (409)."""
    try:
        await client.create(obj=obj)
    except ApiError as exc:
        if exc.status != 409:
            raise
        return False
    return True


async def patch_status(
    client: Client, *, api_version: str, kind: str, namespace: str, name: str, status: Mapping[str, Any]
) -> bool:
    """Merge-patch a custom resource's status; False when the resource is gone."""
    path = path_of(api_version=api_version, kind=kind, namespace=namespace, name=name) + "/status"
    return await client.merge_patch(path=path, patch={"status": dict(status)}) is not None


async def post_event(
    client: Client, *, involved: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
) -> None:
    """Post a core/v1 Event about ``involved`` (a custom resource body)."""
    meta = involved["metadata"]
    now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": meta["namespace"], "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}"},
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": "ringseed-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    await client.create(obj=event)


async def label_node(client: Client, *, node: str, key: str, value: str | None) -> bool:
    """Set (or, with ``value=None``, remove) one label of a node; False when the node is gone."""
    path = path_of(api_version="v1", kind="Node", name=node)
    return await client.merge_patch(path=path, patch={"metadata": {"labels": {key: value}}}) is not None


async def nodes_labelled(client: Client, *, key: str, value: str) -> list[str]:
    """Names of the nodes carrying ``key=value`` (filtered here too: not every server filters)."""
    nodes = await client.list(api_version="v1", kind="Node", label_selector=f"{key}={value}")
    return [n["metadata"]["name"] for n in nodes if n.get("metadata", {}).get("labels", {}).get(key) == value]


async def read_secret_key(client: Client, *, namespace: str, name: str, key: str) -> str | None:
    """One key of a Secret, decoded; None when the Secret or key is missing."""
    secret = await client.get(api_version="v1", kind="Secret", namespace=namespace, name=name)
    if secret is None:
        return None
    if key in secret.get("stringData", {}):  # KMock keeps what was posted verbatim
        return str(secret["stringData"][key])
    raw = secret.get("data", {}).get(key)
    return None if raw is None else base64.b64decode(raw).decode()
