"""The ``http(s)://`` origin: a file set served by any web server that honours ``Range``.

Rules:
- A URL ending in ``/`` is a directory: its files are listed by ``<url>index.json``
  (``{"files": [{"path": "a/b.bin", "size": 123, "mode": 420}]}``, ``mode`` optional, default
  0o644) and read from ``<url><percent-encoded path>``.
- A URL not ending in ``/`` is a single file named by its (decoded) basename; its size comes
  from HEAD.
- Reads are ranged GETs with retries and resume (see ``httpclient``).
- Identity (a revision's tag per file): an index entry's optional ``etag`` (the ETag the server
  sends for that file), else a HEAD per file (a few at a time), else none. Pinned reads send
  ``If-Match`` / ``If-Unmodified-Since`` and check size and ETag of every response.
- A bearer token, if given as ``RINGSEED_HTTP_TOKEN`` in ``secret_env`` or the environment, is
  sent as ``Authorization: Bearer``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ringseed.agent.origins import base, httpclient
from ringseed.protocol import manifest

INDEX_NAME = "index.json"
TOKEN_ENV = "RINGSEED_HTTP_TOKEN"
_INDEX_LIMIT = 64 << 20
_HEADS_AT_ONCE = 8


def _index_entry(uri: str, i: int, item: Any) -> tuple[str, int, int, str | None]:
    if not isinstance(item, dict):
        raise base.OriginError(f"{uri}{INDEX_NAME}: files[{i}] is not an object")
    path, size, mode = item.get("path"), item.get("size"), item.get("mode", 0o644)
    try:
        manifest.validate_relpath(path)  # type: ignore[arg-type]
    except manifest.ManifestError as exc:
        raise base.OriginError(f"{uri}{INDEX_NAME}: files[{i}]: {exc}") from exc
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise base.OriginError(f"{uri}{INDEX_NAME}: files[{i}] ({path!r}) needs a non-negative integer size")
    if isinstance(mode, bool) or not isinstance(mode, int):
        raise base.OriginError(f"{uri}{INDEX_NAME}: files[{i}] ({path!r}) has a non-integer mode")
    etag = item.get("etag")
    if etag is not None and (not isinstance(etag, str) or not etag.isprintable() or len(etag) > 256):
        raise base.OriginError(f"{uri}{INDEX_NAME}: files[{i}] ({path!r}) has an unusable etag {etag!r}")
    return str(path), size, mode & 0o777, f"etag:{etag}" if etag else None


def parse_index(uri: str, body: bytes) -> list[tuple[str, int, int, str | None]]:
    """Entries of a directory's ``index.json``; OriginError naming the problem."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise base.OriginError(f"{uri}{INDEX_NAME}: not valid JSON: {exc}") from exc
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise base.OriginError(f'{uri}{INDEX_NAME}: expected {{"files": [{{"path", "size", "mode"}}, ...]}}')
    return [_index_entry(uri, i, item) for i, item in enumerate(files)]


class HTTPOrigin(httpclient.HTTPClient):
    """A directory (``index.json``) or a single file over HTTP(S)."""

    def __init__(
        self,
        uri: str,
        *,
        limiter: base.RateLimiter,
        policy: base.RetryPolicy,
        read_timeout: float = 60.0,
        secret_env: Mapping[str, str] | None = None,
    ) -> None:
        token = (secret_env or {}).get(TOKEN_ENV) or os.environ.get(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        super().__init__(uri=uri, limiter=limiter, policy=policy, read_timeout=read_timeout, headers=headers)
        self._is_dir = uri.endswith("/")
        self._name = unquote(urlsplit(uri).path.rsplit("/", 1)[-1])
        self._pins: dict[str, base.Pin] = {}
        if not self._is_dir and not self._name:
            raise base.OriginError(f"{uri}: a single-file URL needs a file name")

    async def list_files(self) -> list[tuple[str, int, int]]:
        if self._is_dir:
            body = await self.get_small(self.uri + INDEX_NAME, limit=_INDEX_LIMIT)
            return [(p, s, m) for p, s, m, _ in parse_index(self.uri, body)]
        return [(self._name, await self.head_size(self.uri), 0o644)]

    async def listing(self) -> base.Listing:
        if not self._is_dir:
            size, tag = await self.head(self.uri)
            return [(self._name, size, 0o644, tag)]
        body = await self.get_small(self.uri + INDEX_NAME, limit=_INDEX_LIMIT)
        gate = asyncio.Semaphore(_HEADS_AT_ONCE)

        async def entry(path: str, size: int, mode: int, tag: str | None) -> tuple[str, int, int, str]:
            if tag is not None:
                return path, size, mode, tag
            async with gate:
                now, tag = await self.head(self.url_of(path))
            if now != size:
                raise base.SourceChanged(f"{self.uri}: {path!r} is {now} bytes, the index says {size}", path=path)
            return path, size, mode, tag

        return list(await asyncio.gather(*(entry(*item) for item in parse_index(self.uri, body))))

    def pin(self, pins: Mapping[str, base.Pin]) -> None:
        self._pins = dict(pins)

    def _pin_of(self, path: str) -> tuple[str, base.Pin] | None:
        pinned = self._pins.get(path)
        return (path, pinned) if pinned is not None else None

    def url_of(self, path: str) -> str:
        """The URL that serves ``path`` of this file set."""
        if not self._is_dir:
            if path != self._name:
                raise base.OriginError(f"{self.uri}: no file {path!r} in this one-file source")
            return self.uri
        try:
            manifest.validate_relpath(path)
        except manifest.ManifestError as exc:
            raise base.OriginError(f"{self.uri}: {exc}") from exc
        return self.uri + quote(path, safe="/")

    async def read(self, path: str, offset: int, length: int) -> bytes:
        if length == 0:
            return b""
        buf = bytearray(length)
        await self.read_into(path, offset, memoryview(buf))
        return bytes(buf)

    async def read_into(
        self, path: str, offset: int, view: memoryview, progress: Callable[[int], None] | None = None
    ) -> None:
        if len(view):
            url = self.url_of(path)
            await self.get_range_into(url, offset=offset, view=view, progress=progress, pin=self._pin_of(path))
