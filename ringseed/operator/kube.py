"""The operator's only door to the Kubernetes API: read, list, create, merge-patch, delete, events, nodes.

Owns the HTTP session (aiohttp) and the apply rule for children. Rules:
- Credentials are a ``kopf.ConnectionInfo`` (the same kopf logs in with), and kopf turns them into
  the session: ``as_http_headers()`` (bearer token or basic auth) and ``as_ssl_context()`` (CA,
  client certificate and key, ``insecure``), its proxy and ``trust_env``. Nothing here handles TLS
  material or tokens. On 401 the client asks its ``login`` callable once more, so rotated
  service-account tokens keep working.
- 429, 5xx and lost connections are retried as ``backoff.Backoff`` decides (the server's
  ``Retry-After`` honoured); other failures raise :class:`ApiError` with the server's reason.
  404 on read, patch or delete is an answer (``None`` / ``False``), not an error.
- Lists are read in pages (``limit`` and ``continue``); an expired continue token (410) starts the
  list again.
- Children are applied as: read; create if missing; merge-patch only when the spec-hash annotation
  differs; otherwise send nothing. (No PUT, no server-side apply: neither is needed, and KMock
  supports neither.)
- Status goes to the ``/status`` subresource as a merge patch; nothing else writes it.
- After ``close`` every call raises :class:`ApiError` (no session is opened again behind it).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import enum
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import kopf

from ringseed.operator import backoff, builders

log = logging.getLogger(__name__)

# kind -> (plural, namespaced)
KINDS: dict[str, tuple[str, bool]] = {
    "Secret": ("secrets", True),
    "Service": ("services", True),
    "Event": ("events", True),
    "Node": ("nodes", False),
    "Pod": ("pods", True),
    "Deployment": ("deployments", True),
    "DaemonSet": ("daemonsets", True),
    "ModelDistribution": ("modeldistributions", True),
    "TrainingGroup": ("traininggroups", True),
    "PodMonitor": ("podmonitors", True),
    "ServiceAccount": ("serviceaccounts", True),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
}

MERGE_PATCH = "application/merge-patch+json"
# Fields of a built object that a merge patch carries; the rest is the server's.
PATCHED_FIELDS = ("spec", "data", "stringData", "type")
PAGE_SIZE = 500
LIST_RESTARTS = 3  # a list whose continue token keeps expiring (410) is started again this often


class ApiError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP code (0: no answer), the message the server's reason."""

    def __init__(self, *, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
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


def open_session(info: kopf.ConnectionInfo, *, limit: int = 64, timeout: float = 30.0) -> aiohttp.ClientSession:
    """An aiohttp session speaking to ``info.server`` with ``info``'s credentials, as kopf's own does.

    The SSL context is made only for ``https`` servers (loading the system's CA store costs
    about 0.1-0.3 s of CPU, for nothing on plain HTTP)."""
    server = str(info.server).rstrip("/")
    secure = server.startswith("https:")
    return aiohttp.ClientSession(
        base_url=server + "/",
        headers={"Accept": "application/json", **info.as_http_headers()},
        connector=aiohttp.TCPConnector(ssl=info.as_ssl_context() if secure else False, limit=limit),
        timeout=aiohttp.ClientTimeout(total=timeout),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )


class Client:
    """An async Kubernetes REST client; one session, opened at the first call, closed by ``close``."""

    def __init__(
        self,
        *,
        login: Callable[[], kopf.ConnectionInfo],
        retry: backoff.Backoff | None = None,
        page_size: int = PAGE_SIZE,
        rng: random.Random | None = None,
    ) -> None:
        self._login = login
        self._retry = retry or backoff.Backoff()
        self._page_size = page_size
        self._rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ApiError(status=0, message="the Kubernetes client is closed (the operator is stopping)")
        if self._session is None:
            self._session = open_session(self._login())
        return self._session

    async def _forget_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def close(self) -> None:
        self._closed = True
        await self._forget_session()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """One call: the JSON answer, or None for 404. Logs in again once on 401; retries 429, 5xx
        and lost connections as the backoff policy says; raises :class:`ApiError` otherwise."""
        relogged = False
        attempt = 0
        while True:
            attempt += 1
            try:
                status, payload, retry_after = await self._send(
                    method, path, body=body, content_type=content_type, params=params
                )
            except aiohttp.ClientSSLError as exc:  # a certificate problem does not heal by waiting
                raise ApiError(status=0, message=f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                status, payload, retry_after = None, f"{type(exc).__name__}: {exc}", None
            if status == 401 and not relogged:
                relogged = True
                await self._forget_session()
                continue
            if status is not None and status < 400:
                return payload
            if status == 404:
                return None
            wait = self._retry.delay(
                attempt=attempt, status=status, retry_after=retry_after, now=time.time(), rng=self._rng
            )
            if wait is None:
                raise ApiError(status=status or 0, message=f"{method} {path}: {_reason(payload)}")
            log.info("Retrying %s %s in %.2fs after %s", method, path, wait, status or _reason(payload))
            await asyncio.sleep(wait)

    async def _send(
        self, method: str, path: str, *, body: Any, content_type: str | None, params: Mapping[str, str] | None
    ) -> tuple[int, Any, str | None]:
        headers = {"Content-Type": content_type} if content_type else None
        session = self._open()
        async with session.request(method, path.lstrip("/"), json=body, headers=headers, params=params) as response:
            text = await response.text()
            try:
                payload: Any = json.loads(text) if text else None
            except ValueError:
                payload = text
            return response.status, payload, response.headers.get("Retry-After")

    async def get(self, *, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await self.request(
            "GET", path_of(api_version=api_version, kind=kind, namespace=namespace, name=name)
        )
        return result

    async def list(
        self, *, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object of a collection, read in pages of ``page_size``."""
        path = path_of(api_version=api_version, kind=kind, namespace=namespace)
        base = {"limit": str(self._page_size), **({"labelSelector": label_selector} if label_selector else {})}
        for restart in range(LIST_RESTARTS + 1):
            items: list[dict[str, Any]] = []
            params = dict(base)
            try:
                while True:
                    page = await self.request("GET", path, params=params)
                    if not page:
                        return items
                    items.extend(page.get("items") or [])
                    token = (page.get("metadata") or {}).get("continue")
                    if not token:
                        return items
                    params = {**base, "continue": str(token)}
            except ApiError as exc:
                if exc.status != 410 or restart == LIST_RESTARTS:
                    raise
                log.info("Listing %s again: the continue token expired", path)
        raise AssertionError("unreachable")  # pragma: no cover

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


def _reason(payload: Any) -> str:
    """The server's message from a Status body, else the body itself (short)."""
    if isinstance(payload, dict) and payload.get("message"):
        return str(payload["message"])
    return str(payload)[:300]


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
