"""The sink behind the node cache: where checkpoints are persisted (``file://`` or ``s3://``).

Owns writing objects to the sink; reading them back is the origin adapters' job (a sink *is*
an origin: :class:`FileSink` and :class:`S3Sink` extend ``FileOrigin`` and ``S3Origin``, so a
restore from the sink uses the same ranged, retried, rate-limited reads as a model download).

Rules:
- An object lands under its own path (``<sink>/<path>``), so the sink holds an ordinary
  checkpoint directory that plain tools read (``torch.load``, DCP's fsspec reader on ``s3://``).
  Beside it goes a sidecar ``<sink>/.ringseed-objects/<path>.json`` with the object's size,
  version and chunk hashes, so a restore from the sink verifies every chunk by SHA-256.
- Writes are all or nothing to a reader: a file sink writes a temporary name, fsyncs and
  renames; S3 uses a multipart upload completed only after every part is in (aborted on
  failure). Each S3 part is one chunk and is sent with its SHA-256 as ``x-amz-content-sha256``,
  so S3 checks every part's integrity too (moto, the test stand-in, does not). Chunks must be
  at least 5 MiB (S3's minimum part size) and an object at most 10,000 chunks.
- Uploads pass through the agent's persist rate limiter (``persistRateLimit``), shared by all
  uploads of the agent, so persisting never takes more of the node's link than allowed.
- A failure raises :class:`SinkError` (or the origins' ``OriginError``) naming the sink and the
  object; the persister retries later (the object stays cached, unpersisted).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import aiohttp

from ringseed.agent import origins
from ringseed.agent.origins import base, local, s3
from ringseed.protocol import cacheobjects as objects

SIDECAR_DIR = ".ringseed-objects"
MIN_PART = 5 << 20
MAX_PARTS = 10_000
PIECE = 1 << 20
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class SinkError(Exception):
    """Persisting to the sink failed; the message names the sink, the object and why."""


@dataclass(frozen=True)
class Part:
    """One chunk of an object to upload: its file in the cache, length and hash."""

    path: Path
    length: int
    sha256: str


class Sink(origins.Origin, Protocol):
    async def put(self, path: str, parts: Sequence[Part], *, sidecar: Mapping[str, Any]) -> None: ...

    async def get_sidecar(self, path: str) -> dict[str, Any] | None: ...


def sidecar_path(path: str) -> str:
    return f"{SIDECAR_DIR}/{path}.json"


def open_sink(uri: str, *, rate_limit: float | None, secret_env: Mapping[str, str] | None = None) -> Sink:
    """A sink for ``file://DIR`` or ``s3://bucket/prefix``; SinkError for anything else."""
    scheme = urlsplit(uri).scheme.lower()
    limiter = base.RateLimiter(rate_limit)
    if scheme == "file":
        return FileSink(uri, limiter=limiter)
    if scheme == "s3":
        directory = uri if uri.endswith("/") else uri + "/"
        return S3Sink(directory, limiter=limiter, policy=base.RetryPolicy(), secret_env=secret_env, read_timeout=900.0)
    raise SinkError(f"{uri}: unsupported sink scheme {scheme!r} (use file:// or s3://)")


async def _paced(limiter: base.RateLimiter, parts: Sequence[Part]) -> AsyncIterator[bytes]:
    for part in parts:
        fd = os.open(part.path, os.O_RDONLY)
        try:
            offset = 0
            while offset < part.length:
                piece = os.pread(fd, min(PIECE, part.length - offset), offset)
                if not piece:
                    raise SinkError(f"cached chunk {part.sha256[:12]} ended early ({offset} of {part.length} bytes)")
                offset += len(piece)
                await limiter.acquire(len(piece))
                yield piece
        finally:
            os.close(fd)


class FileSink(local.FileOrigin):
    """A directory (local disk, NFS, a PVC) as the sink."""

    def __init__(self, uri: str, *, limiter: base.RateLimiter) -> None:
        root = local.path_of(uri)
        root.mkdir(parents=True, exist_ok=True)
        super().__init__(uri, limiter=base.RateLimiter(None))
        self.root = root
        self.pace = limiter

    async def put(self, path: str, parts: Sequence[Part], *, sidecar: Mapping[str, Any]) -> None:
        objects.check_path(path)
        target = self.root / path
        try:
            await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
            tmp = target.parent / f".{target.name}.ringseed-{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                async for piece in _paced(self.pace, parts):
                    await asyncio.to_thread(os.write, fd, piece)
                await asyncio.to_thread(os.fsync, fd)
            except BaseException:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
            os.close(fd)
            await asyncio.to_thread(os.replace, tmp, target)
            await self._write_small(sidecar_path(path), json.dumps(dict(sidecar)).encode())
        except OSError as exc:
            raise SinkError(f"{self.uri}: writing {path!r} failed: {exc}") from exc

    async def _write_small(self, rel: str, data: bytes) -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.ringseed-{secrets.token_hex(4)}"
        await asyncio.to_thread(tmp.write_bytes, data)
        os.replace(tmp, target)

    async def get_sidecar(self, path: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.root / sidecar_path(path)).read_text())
            return data
        except (OSError, ValueError):
            return None


class S3Sink(s3.S3Origin):
    """An S3 bucket prefix as the sink: multipart uploads, one verified part per chunk."""

    def __init__(
        self,
        uri: str,
        *,
        limiter: base.RateLimiter,
        policy: base.RetryPolicy,
        secret_env: Mapping[str, str] | None = None,
        read_timeout: float = 900.0,
    ) -> None:
        # completing a multipart upload of a large object can take minutes (S3 says so); a part
        # upload is paced by our own limiter, not cut by a read timeout
        super().__init__(uri, limiter=base.RateLimiter(None), policy=policy, secret_env=secret_env,
                         read_timeout=read_timeout)  # fmt: skip
        self.pace = limiter

    def _url(self, path: str, query: str = "") -> str:
        key = self._dir_prefix + objects.check_path(path)
        return self._object_url(key) + (f"?{query}" if query else "")

    async def _call(self, method: str, url: str, *, sha: str, data: Any = None, length: int = 0) -> tuple[int, bytes]:
        headers = {"x-amz-content-sha256": sha, "Content-Length": str(length)}
        async with self.request(method, url, headers=headers, data=data) as resp:
            body = await resp.read()
            if resp.status >= 300:
                raise SinkError(f"{self.uri}: {method} {url} answered HTTP {resp.status}: {body[:300]!r}")
            return resp.status, body

    async def _put_small(self, path: str, data: bytes) -> None:
        sha = hashlib.sha256(data).hexdigest()
        await self._call("PUT", self._url(path), sha=sha, data=data, length=len(data))

    async def put(self, path: str, parts: Sequence[Part], *, sidecar: Mapping[str, Any]) -> None:
        try:
            await self._put_object(path, parts)
            await self._put_small(sidecar_path(path), json.dumps(dict(sidecar)).encode())
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise SinkError(f"{self.uri}: uploading {path!r} failed: {type(exc).__name__}: {exc}") from exc

    async def _put_object(self, path: str, parts: Sequence[Part]) -> None:
        if len(parts) > MAX_PARTS:
            raise SinkError(f"{self.uri}: {path!r} has {len(parts)} chunks, more than S3's {MAX_PARTS} parts")
        if any(p.length < MIN_PART for p in parts[:-1]):
            raise SinkError(f"{self.uri}: chunks smaller than 5 MiB cannot be S3 parts (raise the chunk size)")
        if len(parts) <= 1:
            sha = parts[0].sha256 if parts else EMPTY_SHA256
            length = parts[0].length if parts else 0
            await self._call("PUT", self._url(path), sha=sha, data=_paced(self.pace, parts), length=length)
            return
        _, body = await self._call("POST", self._url(path, "uploads"), sha=EMPTY_SHA256)
        upload_id = _find_text(body, "UploadId")
        if not upload_id:
            raise SinkError(f"{self.uri}: CreateMultipartUpload for {path!r} gave no UploadId")
        try:
            etags = []
            for number, part in enumerate(parts, start=1):
                url = self._url(path, f"partNumber={number}&uploadId={_quote(upload_id)}")
                async with self.request(
                    "PUT",
                    url,
                    headers={"x-amz-content-sha256": part.sha256, "Content-Length": str(part.length)},
                    data=_paced(self.pace, [part]),
                ) as resp:
                    text = await resp.read()
                    if resp.status >= 300:
                        raise SinkError(f"{self.uri}: part {number} of {path!r}: HTTP {resp.status}: {text[:300]!r}")
                    etags.append(resp.headers.get("ETag", ""))
            done = "".join(
                f"<Part><PartNumber>{n}</PartNumber><ETag>{tag}</ETag></Part>" for n, tag in enumerate(etags, start=1)
            )
            xml = f"<CompleteMultipartUpload>{done}</CompleteMultipartUpload>".encode()
            _, answer = await self._call(
                "POST", self._url(path, f"uploadId={_quote(upload_id)}"), sha=hashlib.sha256(xml).hexdigest(),
                data=xml, length=len(xml),
            )  # fmt: skip
            if b"<Error>" in answer:
                raise SinkError(f"{self.uri}: completing {path!r} failed: {answer[:300]!r}")
        except BaseException:
            with contextlib.suppress(Exception):
                await self._call("DELETE", self._url(path, f"uploadId={_quote(upload_id)}"), sha=EMPTY_SHA256)
            raise

    async def get_sidecar(self, path: str) -> dict[str, Any] | None:
        url = self._url(sidecar_path(path))
        async with self.request("GET", url) as resp:
            if resp.status != 200:
                return None
            try:
                data: dict[str, Any] = json.loads(await resp.read())
                return data
            except ValueError:
                return None


def _quote(value: str) -> str:
    return quote(value, safe="-_.~")


def _find_text(body: bytes, tag: str) -> str | None:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] == tag:
            return element.text
    return None
