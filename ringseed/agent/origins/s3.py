"""The ``s3://bucket/prefix`` origin: ListObjectsV2 and ranged GETs, SigV4-signed, over aiohttp.

Rules:
- ``s3://bucket/prefix/`` (or a prefix naming no object) is a directory: every object under
  ``prefix/`` is a file named by the rest of its key; ``dir/`` marker objects are skipped; a key
  that is not a clean relative path is rejected naming the key. ``s3://bucket/key`` naming an
  existing object is a one-file source named by the key's basename. Mode is always 0o644.
- Settings come from ``secret_env`` first (the operator mounts a Secret's keys as env), then the
  process environment: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
  ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``
  (default us-east-1). Without keys in either, botocore's usual chain is asked (config files,
  web identity, instance metadata); without any credentials requests go unsigned (public buckets).
- A custom endpoint uses path-style addressing (``endpoint/bucket/key``); AWS itself uses
  virtual-hosted style (path style for bucket names with dots).
- Every attempt is signed afresh with botocore's S3 SigV4 (the Range header included).
- Identity (a revision's tag per object) is its ETag from ListObjectsV2 (or HEAD for one
  object); pinned reads send ``If-Match`` and check size and ETag (``httpclient``).
- A chunk's pieces are read as ranged GETs of ``range_part`` bytes, several at once (one
  connection to S3 carries far less than a node's NIC).
"""

from __future__ import annotations

import asyncio
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, unquote_plus, urlencode, urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError
from botocore.session import Session

from ringseed.agent.origins import base, httpclient
from ringseed.protocol import manifest

_LIST_LIMIT = 16 << 20


def _setting(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if env.get(name):
            return env[name]
    return None


def parse_uri(uri: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix``."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc:
        raise base.OriginError(f"{uri}: expected s3://bucket/prefix")
    return parts.netloc, parts.path.lstrip("/")


def _strip_ns(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse_list_page(uri: str, body: bytes) -> tuple[list[tuple[str, int, str]], str | None]:
    """``([(key, size, tag)], next continuation token or None)`` of a ListObjectsV2 (encoding-type=url) page."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise base.OriginError(f"{uri}: ListObjectsV2 answer is not XML: {exc}") from exc
    objects: list[tuple[str, int, str]] = []
    token: str | None = None
    truncated = False
    for child in root:
        tag = _strip_ns(child.tag)
        if tag == "Contents":
            fields = {_strip_ns(f.tag): f.text or "" for f in child}
            etag = fields.get("ETag", "")
            objects.append(
                (unquote_plus(fields.get("Key", "")), int(fields.get("Size", "0")), f"etag:{etag}" if etag else "")
            )
        elif tag == "IsTruncated":
            truncated = (child.text or "").strip() == "true"
        elif tag == "NextContinuationToken":
            token = child.text
    return objects, (token if truncated else None)


class S3Origin(httpclient.HTTPClient):
    """Objects under a prefix (or one object) in an S3-compatible store."""

    list_page_size = 1000  # ListObjectsV2 max-keys; tests lower it to exercise pagination
    check_after_read = False  # a PUT replaces an object atomically: a GET never mixes two versions
    # A chunk is read as ranged GETs of this size, several at once (``origins.read_chunk_into``):
    # one S3 connection delivers far less than a node's NIC; AWS advises 8-16 MiB byte ranges.
    range_part = 8 << 20

    def __init__(
        self,
        uri: str,
        *,
        limiter: base.RateLimiter,
        policy: base.RetryPolicy,
        read_timeout: float = 60.0,
        secret_env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(uri=uri, limiter=limiter, policy=policy, read_timeout=read_timeout, sign=self._sign_request)
        self.bucket, self.prefix = parse_uri(uri)
        secret = dict(secret_env or {})
        env = {**os.environ, **secret}
        self.region = _setting(env, "AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = _setting(env, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        if endpoint:
            self.base_url = f"{endpoint.rstrip('/')}/{quote(self.bucket)}"
        elif "." in self.bucket:
            self.base_url = f"https://s3.{self.region}.amazonaws.com/{self.bucket}"
        else:
            self.base_url = f"https://{self.bucket}.s3.{self.region}.amazonaws.com"
        self._static = self._static_credentials(env)
        self._chain: Any = None
        self._single: str | None = None  # the key, when the URI names one object
        self._resolved = False
        self._pins: dict[str, base.Pin] = {}

    @staticmethod
    def _static_credentials(env: Mapping[str, str]) -> Credentials | None:
        key, secret = _setting(env, "AWS_ACCESS_KEY_ID"), _setting(env, "AWS_SECRET_ACCESS_KEY")
        if key and secret:
            return Credentials(key, secret, _setting(env, "AWS_SESSION_TOKEN"))
        return None

    async def _credentials(self) -> Any:
        if self._static is not None:
            return self._static.get_frozen_credentials()
        if self._chain is None:
            try:
                self._chain = await asyncio.to_thread(Session().get_credentials) or False
            except BotoCoreError as exc:  # a named profile that does not exist, a broken config file
                raise base.OriginError(f"{self.uri}: cannot load AWS credentials: {exc}") from exc
        if self._chain is False:
            return None
        return await asyncio.to_thread(self._chain.get_frozen_credentials)

    async def _sign_request(self, method: str, url: str, headers: dict[str, str]) -> dict[str, str]:
        creds = await self._credentials()
        if creds is None:
            return headers
        request = AWSRequest(method=method, url=url, headers=headers)
        S3SigV4Auth(creds, "s3", self.region).add_auth(request)
        return dict(request.headers.items())

    def _object_url(self, key: str) -> str:
        return f"{self.base_url}/{quote(key, safe='/~')}"

    async def _resolve(self) -> None:
        """Decide once whether the URI names one object or a prefix."""
        if self._resolved:
            return
        if self.prefix and not self.prefix.endswith("/"):
            url = self._object_url(self.prefix)

            async def attempt() -> bool:
                async with self.request("HEAD", url) as resp:
                    if resp.status == 404:
                        return False
                    await httpclient.check_status(resp, url)
                    return True

            if await self.with_retries(url, attempt):
                self._single = self.prefix
        self._resolved = True

    @property
    def _dir_prefix(self) -> str:
        return self.prefix if not self.prefix or self.prefix.endswith("/") else self.prefix + "/"

    async def _list_objects(self) -> list[tuple[str, int, str]]:
        objects: list[tuple[str, int, str]] = []
        token: str | None = None
        while True:
            params = {
                "list-type": "2",
                "prefix": self._dir_prefix,
                "encoding-type": "url",
                "max-keys": str(self.list_page_size),
            }
            if token:
                params["continuation-token"] = token
            query = urlencode(sorted(params.items()), quote_via=quote, safe="-_.~")
            page, token = parse_list_page(self.uri, await self.get_small(f"{self.base_url}?{query}", limit=_LIST_LIMIT))
            objects.extend(page)
            if token is None:
                return objects

    async def list_files(self) -> list[tuple[str, int, int]]:
        return [(p, s, m) for p, s, m, _ in await self.listing()]

    def pin(self, pins: Mapping[str, base.Pin]) -> None:
        self._pins = dict(pins)

    async def listing(self) -> base.Listing:
        try:
            return await self._listing()
        except httpclient.StatusError as exc:
            if exc.status in (401, 403) and await self._credentials() is None:
                raise base.OriginError(
                    f"{exc} (no AWS credentials were found, so the request went unsigned: set "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a role)"
                ) from exc
            raise

    async def _listing(self) -> base.Listing:
        await self._resolve()
        if self._single is not None:
            size, tag = await self.head(self._object_url(self._single))
            return [(self._single.rsplit("/", 1)[-1], size, 0o644, tag)]
        out: base.Listing = []
        for key, size, tag in await self._list_objects():
            rel = key[len(self._dir_prefix) :]
            if rel.endswith("/") and size == 0:
                continue
            try:
                manifest.validate_relpath(rel)
            except manifest.ManifestError as exc:
                raise base.OriginError(f"{self.uri}: object key {key!r} is unusable: {exc}") from exc
            out.append((rel, size, 0o644, tag))
        return out

    async def _key_of(self, path: str) -> str:
        await self._resolve()
        if self._single is not None:
            if path != self._single.rsplit("/", 1)[-1]:
                raise base.OriginError(f"{self.uri}: no file {path!r} in this one-object source")
            return self._single
        try:
            return self._dir_prefix + manifest.validate_relpath(path)
        except manifest.ManifestError as exc:
            raise base.OriginError(f"{self.uri}: {exc}") from exc

    async def read(self, path: str, offset: int, length: int) -> bytes:
        buf = bytearray(length)
        await self.read_into(path, offset, memoryview(buf))
        return bytes(buf)

    async def read_into(
        self, path: str, offset: int, view: memoryview, progress: Callable[[int], None] | None = None
    ) -> None:
        key = await self._key_of(path)
        if len(view):
            pinned = self._pins.get(path)
            pin = (path, pinned) if pinned is not None else None
            await self.get_range_into(self._object_url(key), offset=offset, view=view, progress=progress, pin=pin)
