"""Origin adapters: where a model's bytes come from before they enter the peer-to-peer pipe.

Public face (see docs/contracts.md): :class:`Origin`, :class:`OriginError`, :func:`open_origin`,
:func:`read_chunk` / :func:`read_chunk_into`, :func:`fetch_manifest`, plus :func:`build_manifest`
(stream a source once and hash it). Schemes: ``file://`` or a bare path (``local``), ``http(s)://`` (``http``), ``s3://``
(``s3``); the shared retry/resume HTTP client is ``httpclient``, errors and the rate limit ``base``.

Rules:
- An origin object owns one rate limiter (``rate_limit`` bytes/s) that all its reads share.
- Reads retry transient failures with backoff and resume; what reaches the caller is either
  exactly the bytes asked for or an :class:`OriginError` naming the URI and the problem.
- ``read_chunk`` assembles chunk ``index`` of a layout from its file pieces (a few at a time),
  straight into one buffer when the origin offers ``read_into`` (all built-in origins do); an
  origin's ``range_part`` (S3: 8 MiB) splits large pieces into parts read concurrently;
  ``read_chunk_into`` reports the filled prefix as it grows (the origin-duty agent streams it).
- ``fetch_manifest`` loads a published manifest (``source.manifestUri``) from any scheme and
  checks its digest; malformed content raises ``manifest.ManifestError``.
- ``build_manifest`` reads the source once, in chunk order, holding at most two chunks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from ringseed.agent.origins import base, http, local
from ringseed.protocol import manifest

Origin = base.Origin
OriginError = base.OriginError
SourceChanged = base.SourceChanged
RateLimiter = base.RateLimiter
RetryPolicy = base.RetryPolicy

PIECE_CONCURRENCY = 8
MANIFEST_LIMIT = 256 << 20


def open_origin(
    uri: str,
    *,
    rate_limit: float | None = None,
    secret_env: Mapping[str, str] | None = None,
    retries: int = 8,
    retry_base_delay: float = 0.2,
    retry_max_delay: float = 10.0,
    read_timeout: float = 60.0,
) -> Origin:
    """An origin for ``file://``, a bare path, ``http(s)://`` or ``s3://``; OriginError for others."""
    limiter = base.RateLimiter(rate_limit)
    policy = base.RetryPolicy(retries=retries, base_delay=retry_base_delay, max_delay=retry_max_delay)
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("", "file"):
        return local.FileOrigin(uri, limiter=limiter)
    if scheme in ("http", "https"):
        return http.HTTPOrigin(uri, limiter=limiter, policy=policy, read_timeout=read_timeout, secret_env=secret_env)
    if scheme == "s3":
        from ringseed.agent.origins import s3  # botocore costs ~0.1 s to import; only S3 needs it

        return s3.S3Origin(uri, limiter=limiter, policy=policy, read_timeout=read_timeout, secret_env=secret_env)
    raise OriginError(f"{uri}: unsupported scheme {scheme!r} (use file://, http://, https:// or s3://)")


async def read_chunk(origin: Origin, layout: manifest.Layout, index: int) -> bytes:
    """Chunk ``index`` of ``layout``, assembled from its file pieces."""
    out = bytearray(layout.chunk_length(index))
    await read_chunk_into(origin, layout, index, out)
    return bytes(out)


async def read_chunk_into(
    origin: Origin,
    layout: manifest.Layout,
    index: int,
    out: bytearray | memoryview,
    *,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Fill ``out`` (``chunk_length(index)`` bytes) with chunk ``index``.

    ``progress(prefix)`` is called whenever the filled prefix grows: ``out[:prefix]`` holds the
    chunk's bytes and never changes again (pieces run a few at a time, so later pieces may land
    first; only the contiguous prefix counts). Origins without ``read_into`` report per piece.
    An origin with a ``range_part`` (bytes) has its pieces split into parts of that size, read
    concurrently like pieces (S3 serves ranges of one object in parallel, each at about the rate
    of one connection).
    """
    pieces = _parts(layout.pieces(index), getattr(origin, "range_part", None))
    if len(out) != layout.chunk_length(index):
        raise ValueError(f"buffer is {len(out)} bytes, chunk {index} is {layout.chunk_length(index)}")
    gate = asyncio.Semaphore(PIECE_CONCURRENCY)
    view = memoryview(out)
    done = [0] * len(pieces)
    prefix = [0, 0]  # [first piece not yet complete, bytes reported]

    def advance(number: int, filled: int) -> None:
        done[number] = filled
        first = prefix[0]
        while first < len(pieces) and done[first] >= pieces[first].length:
            first += 1
        prefix[0] = first
        reach = pieces[first].chunk_offset + done[first] if first < len(pieces) else len(out)
        if reach > prefix[1]:
            prefix[1] = reach
            if progress is not None:
                progress(reach)

    async def fetch(number: int, piece: manifest.ChunkPiece) -> None:
        target = view[piece.chunk_offset : piece.chunk_offset + piece.length]
        async with gate:
            if isinstance(origin, base.ReadsInto):
                await origin.read_into(piece.path, piece.file_offset, target, progress=lambda n: advance(number, n))
                advance(number, piece.length)
                return
            data = await origin.read(piece.path, piece.file_offset, piece.length)
        if len(data) != piece.length:
            raise OriginError(f"{origin.uri}: {piece.path!r} gave {len(data)} bytes, expected {piece.length}")
        target[:] = data
        advance(number, piece.length)

    tasks = [asyncio.ensure_future(fetch(n, p)) for n, p in enumerate(pieces)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _parts(pieces: list[manifest.ChunkPiece], part: int | None) -> list[manifest.ChunkPiece]:
    """``pieces`` cut into parts of at most ``part`` bytes (unchanged without a part size)."""
    if not part or part <= 0:
        return pieces
    return [
        manifest.ChunkPiece(
            path=piece.path,
            file_offset=piece.file_offset + start,
            length=min(part, piece.length - start),
            chunk_offset=piece.chunk_offset + start,
        )
        for piece in pieces
        for start in range(0, piece.length, part)
    ]


async def build_manifest(
    origin: Origin,
    *,
    chunk_size: int = manifest.DEFAULT_CHUNK_SIZE,
    progress: Callable[[int, int], None] | None = None,
) -> manifest.Manifest:
    """List and read the whole source once, hashing each chunk; ``progress(done, total)`` per chunk."""
    layout = manifest.Layout.build(await origin.list_files(), chunk_size=chunk_size)
    hashes: list[str] = []
    pending = asyncio.ensure_future(read_chunk(origin, layout, 0))
    try:
        for index in range(layout.chunk_count):
            data = await pending
            if index + 1 < layout.chunk_count:
                pending = asyncio.ensure_future(read_chunk(origin, layout, index + 1))
            hashes.append(await asyncio.to_thread(manifest.chunk_sha256, data))
            del data
            if progress is not None:
                progress(index + 1, layout.chunk_count)
    finally:
        if not pending.done():
            pending.cancel()
    return manifest.Manifest(layout=layout, chunk_hashes=tuple(hashes))


async def fetch_manifest(
    uri: str,
    *,
    secret_env: Mapping[str, str] | None = None,
    expected_digest: str | None = None,
    retries: int = 8,
    retry_base_delay: float = 0.2,
) -> manifest.Manifest:
    """Load a published manifest JSON (one file at ``uri``) and check its digest."""
    origin = open_origin(uri, secret_env=secret_env, retries=retries, retry_base_delay=retry_base_delay)
    try:
        files = await origin.list_files()
        if len(files) != 1:
            raise OriginError(f"{uri}: a manifest URI must name one file, found {len(files)}")
        path, size, _ = files[0]
        if size > MANIFEST_LIMIT:
            raise manifest.ManifestError(f"{uri}: manifest is {size} bytes, more than the {MANIFEST_LIMIT} limit")
        body = await origin.read(path, 0, size)
    finally:
        await origin.close()
    return parse_published(uri, body, expected_digest=expected_digest)


def parse_published(uri: str, body: bytes, *, expected_digest: str | None = None) -> manifest.Manifest:
    """A published manifest from its JSON bytes: digest required and checked."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise manifest.ManifestError(f"{uri}: manifest is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise manifest.ManifestError(f"{uri}: manifest must be a JSON object")
    if "digest" not in doc:
        raise manifest.ManifestError(f"{uri}: digest: a published manifest must carry its digest")
    try:
        loaded = manifest.Manifest.from_dict(doc)
    except manifest.ManifestError as exc:
        raise manifest.ManifestError(f"{uri}: {exc}") from exc
    if expected_digest is not None and loaded.digest != expected_digest:
        raise manifest.ManifestError(f"{uri}: digest is {loaded.digest}, expected {expected_digest}")
    return loaded
