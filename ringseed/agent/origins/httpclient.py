"""HTTP plumbing shared by the ``http(s)://`` and ``s3://`` origins: ranged GETs that survive faults.

Rules:
- Every request may be signed (S3) by an async ``sign(method, url, headers) -> headers`` hook,
  called again for each attempt. URLs are sent exactly as given (already percent-encoded).
- Transient (retried with :class:`~ringseed.agent.origins.base.RetryPolicy` backoff): HTTP 5xx,
  408, 429 (``Retry-After`` honoured up to the policy's max delay), connection refused or reset,
  timeouts, and bodies that end early. Permanent (:class:`OriginError` naming URL and status):
  any other 4xx, a ``Content-Range`` that does not match the request, a file shorter than the
  range asked for.
- A range read resumes from the last byte received: a reset after 3 MiB of 4 asks only for the
  missing 1 MiB. A retry that made progress does not use up the retry budget.
- Pinned reads (``pin=(size, tag)``, a file of a listed revision): the request carries
  ``If-Match`` (a strong ETag) or ``If-Unmodified-Since`` (a Last-Modified tag); a 412, a
  response whose ETag/Last-Modified differs from the tag, or a file size (``Content-Range``
  total) other than the pinned size raises :class:`~ringseed.agent.origins.base.SourceChanged`
  before any of its bytes are kept. Tags are ``etag:<ETag>`` or ``lm:<Last-Modified>``
  (:func:`tag_of`), from listings or HEAD. A web server may send a file that is being
  rewritten in place as a mix of both versions under the old ETag, so after a pinned read a
  HEAD checks the file is still the pinned version (``check_after_read``; S3 objects are
  replaced atomically, so the S3 origin skips it).
- ``bytes_read`` counts file data actually received by range reads (partial attempts included;
  listings and HEADs are not counted). ``retries`` counts retried attempts. Data passes the
  origin's rate limiter as it arrives.
- The body of a ``206`` of at least ``DIRECT_MIN`` bytes over plain HTTP (no TLS, no rate limit)
  is received by a worker thread straight into the caller's buffer (``recv_into`` with
  ``MSG_WAITALL``, 512 KiB per system call) instead of through aiohttp's stream reader (a
  ``bytes`` object per 256 KiB read, a copy of each into the buffer and a few Python calls per
  piece): what aiohttp already buffered is taken first, then its transport stops reading and the
  thread reads a duplicate of the socket. Progress is reported per MiB landed, or per piece when
  a piece took 20 ms or more (a slow link), so the streams that follow a pull's fill
  (``stream``) see it move as finely as before. Such a connection is closed afterwards, never
  reused (aiohttp did not see the body end); a body aiohttp had already buffered whole is taken
  from it and its connection kept. Smaller bodies (a dataset's small files) go through aiohttp
  and keep the connection: a new TCP connection per body costs more than aiohttp's copies of it.
  Faults keep their meaning: a reset, a timeout (``read_timeout`` without a byte) or a body that
  ends early is transient and resumes from the last byte received; cancelling the read shuts the
  socket down, so the thread returns at once (it refers to the buffer until then).
- A server that ignores ``Range`` (``200`` and the whole object, as Python's ``http.server``
  does) switches the client to whole-object streaming for good (``ranges_ignored``): one plain
  GET per file, read in order and kept open between reads, so reads in file order (as chunk
  pulls come) cost about one pass over the object; a read behind the stream's position starts
  the object again and skips ahead. Skipped bytes count as read (they crossed the wire). A
  broken stream is reopened under the same retry rules as a range read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aiohttp
from yarl import URL

from ringseed.agent.origins import base

log = logging.getLogger(__name__)
Signer = Callable[[str, str, dict[str, str]], Awaitable[dict[str, str]]]
T = TypeVar("T")

_STEP = 256 << 10
_PIECE = 512 << 10  # bytes per recv_into (MSG_WAITALL) of a body read straight into the buffer
_REPORT_BYTES = 1 << 20  # progress is reported per this many bytes landed (streams admit within 2 MiB)...
_REPORT_S = 0.02  # ...or sooner when a piece took this long (a slow origin link)
DIRECT_MIN = 1 << 20  # a range body from this size is read by a worker thread (module rules)
_READER_THREADS = 16  # bodies read by worker threads at once per client (more wait their turn)
_READ_BUFFER = 1 << 20  # a response buffers up to twice this before reading pauses (aiohttp: 64 KiB)
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_TRANSIENT_EXC = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError, ConnectionError)


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class StatusError(base.OriginError):
    """A permanent HTTP error status (4xx other than 408/429); ``status`` is the code."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


async def check_status(resp: aiohttp.ClientResponse, url: str) -> None:
    """Raise TransientError or StatusError (an OriginError) for an error status; return for 2xx."""
    if resp.status < 300:
        return
    if resp.status in (408, 429) or resp.status >= 500:
        raise base.TransientError(
            f"{url}: HTTP {resp.status} {resp.reason}", retry_after=_retry_after(resp.headers.get("Retry-After"))
        )
    snippet = " ".join((await resp.content.read(300)).decode("utf-8", "replace").split())
    detail = f": {snippet}" if snippet else ""
    raise StatusError(f"{url}: HTTP {resp.status} {resp.reason}{detail}", status=resp.status)


def tag_of(headers: Mapping[str, str]) -> str:
    """A file's identity for a revision from response headers: its ETag, else its Last-Modified."""
    etag = headers.get("ETag")
    if etag:
        return f"etag:{etag}"
    modified = headers.get("Last-Modified")
    return f"lm:{modified}" if modified else ""


def conditions(tag: str) -> dict[str, str]:
    """Request headers that make the server refuse (412) a read of another version of the file."""
    if tag.startswith('etag:"'):  # strong ETags only: If-Match compares strongly, a weak one never matches
        return {"If-Match": tag[len("etag:") :]}
    if tag.startswith("lm:"):
        return {"If-Unmodified-Since": tag[len("lm:") :]}
    return {}


def check_pin(resp: aiohttp.ClientResponse, *, url: str, path: str, pin: base.Pin, total: int | None) -> None:
    """SourceChanged unless the response is of the pinned version of the file (size and tag)."""
    size, tag = pin
    if resp.status == 412:
        raise base.SourceChanged(f"{url}: the file changed since it was listed (HTTP 412 on {tag})", path=path)
    if total is not None and total != size:
        raise base.SourceChanged(f"{url}: the file has {total} bytes now, {size} when it was listed", path=path)
    now = tag_of(resp.headers)
    kind = tag.partition(":")[0]
    if tag and now.partition(":")[0] == kind and now != tag:
        raise base.SourceChanged(f"{url}: the file changed since it was listed ({tag} -> {now})", path=path)


def content_total(value: str | None) -> int | None:
    """The complete length from a ``Content-Range`` header, if it states one."""
    match = _CONTENT_RANGE.match(value or "")
    return int(match.group(3)) if match is not None and match.group(3) != "*" else None


def check_content_range(value: str | None, *, url: str, start: int, end: int) -> None:
    """A 206 must cover ``[start, ...)`` within ``[start, end)``; a shorter file is permanent."""
    match = _CONTENT_RANGE.match(value or "")
    if match is None:
        raise base.OriginError(f"{url}: 206 response with unusable Content-Range {value!r}")
    first, last, total = int(match.group(1)), int(match.group(2)), match.group(3)
    if first != start or last < first or last >= end:
        raise base.OriginError(f"{url}: asked for bytes {start}-{end - 1}, server sent {value!r}")
    if last < end - 1 and total != "*" and int(total) <= last + 1:
        raise base.OriginError(f"{url}: file has {total} bytes, the read needs {end}")


class _RangeBroken(Exception):
    """A transient failure in the middle of a range, with how far it got."""

    def __init__(self, cause: BaseException, *, done: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.done = done


def _longer_than(resp: aiohttp.ClientResponse, length: int) -> bool:
    """Whether a 200 carries more than the ``length`` bytes asked for (so the server ignored Range).

    A 200 of exactly the asked length is a whole small file and proves nothing.
    """
    value = resp.headers.get("Content-Length")
    return value is None or not value.isdigit() or int(value) > length


class _RangeIgnored(Exception):
    """The server answered a ranged GET with the whole object."""


class _Cursor:
    """An open plain GET of a whole object and how far it has been read."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.pos = 0
        length = resp.headers.get("Content-Length")
        self.size = int(length) if length is not None and length.isdigit() else None


class HTTPClient:
    """An aiohttp session with retries, resume and a rate limit; the base of HTTP-speaking origins."""

    check_after_read = True

    def __init__(
        self,
        *,
        uri: str,
        limiter: base.RateLimiter,
        policy: base.RetryPolicy,
        read_timeout: float = 60.0,
        headers: dict[str, str] | None = None,
        sign: Signer | None = None,
    ) -> None:
        self.uri = uri
        self.bytes_read = 0
        self.retries = 0
        self._limiter = limiter
        self._policy = policy
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(read_timeout, 30.0), sock_read=read_timeout)
        self._headers = {"Accept-Encoding": "identity", **(headers or {})}
        self._sign = sign
        self._session: aiohttp.ClientSession | None = None
        self.ranges_ignored = False  # the server answered a Range request with the whole object
        self._cursors: dict[str, _Cursor] = {}
        self._cursor_locks: dict[str, asyncio.Lock] = {}
        self._read_timeout = read_timeout
        self._readers: ThreadPoolExecutor | None = None  # body readers (plain HTTP, see the rules)
        self.direct_reads = 0  # range bodies read by a worker thread

    async def _send(
        self, method: str, url: str, headers: dict[str, str] | None = None, data: Any = None
    ) -> aiohttp.ClientResponse:
        """One signed request, URL sent as given (``data``: an optional body); the caller releases the response."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, auto_decompress=False, read_bufsize=_READ_BUFFER
            )
        all_headers = {**self._headers, **(headers or {})}
        if self._sign is not None:
            all_headers = await self._sign(method, url, all_headers)
        return await self._session.request(method, URL(url, encoded=True), headers=all_headers, data=data)

    @contextlib.asynccontextmanager
    async def request(
        self, method: str, url: str, headers: dict[str, str] | None = None, data: Any = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One signed request, URL sent as given; ``data`` is an optional body (the cache's sink writes)."""
        resp = await self._send(method, url, headers, data)
        try:
            yield resp
        finally:
            resp.release()

    async def _wait(self, failures: int, exc: BaseException, url: str) -> None:
        if failures > self._policy.retries:
            raise base.OriginError(f"{url}: gave up after {self._policy.retries} retries: {exc}") from exc
        self.retries += 1
        retry_after = exc.retry_after if isinstance(exc, base.TransientError) else None
        await asyncio.sleep(self._policy.delay(failures, retry_after=retry_after))

    async def with_retries(self, url: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run one-shot ``attempt`` until it succeeds, retrying transient failures."""
        failures = 0
        while True:
            try:
                return await attempt()
            except (base.TransientError, *_TRANSIENT_EXC) as exc:
                failures += 1
                await self._wait(failures, exc, url)

    async def get_small(self, url: str, *, limit: int) -> bytes:
        """GET a whole small body (an index, a listing, a manifest) with retries."""

        async def attempt() -> bytes:
            async with self.request("GET", url) as resp:
                await check_status(resp, url)
                body = bytearray()
                async for data in resp.content.iter_chunked(_STEP):
                    body += data
                    if len(body) > limit:
                        raise base.OriginError(f"{url}: body larger than {limit} bytes")
                expected = resp.headers.get("Content-Length")
                if expected is not None and expected.isdigit() and int(expected) != len(body):
                    raise base.TransientError(f"{url}: body ended after {len(body)} of {expected} bytes")
                return bytes(body)

        return await self.with_retries(url, attempt)

    async def head_size(self, url: str) -> int:
        """The size of one file by HEAD (Content-Length), with retries."""
        return (await self.head(url))[0]

    async def head(self, url: str) -> base.Pin:
        """``(size, tag)`` of one file by HEAD (Content-Length, ETag or Last-Modified), with retries."""

        async def attempt() -> base.Pin:
            async with self.request("HEAD", url) as resp:
                await check_status(resp, url)
                length = resp.headers.get("Content-Length")
                if length is None or not length.isdigit():
                    raise base.OriginError(f"{url}: HEAD gave no usable Content-Length ({length!r})")
                return int(length), tag_of(resp.headers)

        return await self.with_retries(url, attempt)

    async def get_range(self, url: str, *, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``, resuming after partial failures."""
        buf = bytearray(length)
        await self.get_range_into(url, offset=offset, view=memoryview(buf))
        return bytes(buf)

    async def get_range_into(
        self,
        url: str,
        *,
        offset: int,
        view: memoryview,
        progress: Callable[[int], None] | None = None,
        pin: tuple[str, base.Pin] | None = None,
    ) -> None:
        """Fill ``view`` with the bytes from ``offset``, resuming after partial failures.

        ``progress(done)`` is called as bytes land: ``view[:done]`` is filled (never goes back).
        ``pin``: ``(path, (size, tag))``, every attempt checks the file is still that version.
        """
        length = len(view)
        done = 0
        failures = 0
        while done < length:
            if self.ranges_ignored:
                await self._stream_into(
                    url, offset=offset + done, view=view[done:], reported=done, progress=progress, pin=pin
                )
                break
            before = done
            try:
                done = await self._range_attempt(
                    url, start=offset, end=offset + length, view=view, done=done, progress=progress, pin=pin
                )
                if done < length:
                    short = base.TransientError(f"{url}: body ended after {done - before} of {length - before} bytes")
                    raise _RangeBroken(short, done=done)
            except _RangeBroken as broken:
                done = broken.done
                failures = 1 if done > before else failures + 1
                await self._wait(failures, broken.cause, url)
            except _RangeIgnored:
                if not self.ranges_ignored:
                    log.warning("%s ignores Range requests; streaming whole objects in order instead", url)
                self.ranges_ignored = True
        if pin is not None and pin[1][1] and self.check_after_read:
            size, tag = await self.head(url)
            if (size, tag) != pin[1]:
                raise base.SourceChanged(
                    f"{url}: the file changed while it was read ({pin[1][1]} -> {tag})", path=pin[0]
                )

    async def _range_attempt(
        self,
        url: str,
        *,
        start: int,
        end: int,
        view: memoryview,
        done: int,
        progress: Callable[[int], None] | None,
        pin: tuple[str, base.Pin] | None = None,
    ) -> int:
        """One GET of ``[start + done, end)`` into ``view[done:]``; returns the new ``done``."""
        first = start + done
        headers = {"Range": f"bytes={first}-{end - 1}", **(conditions(pin[1][1]) if pin else {})}
        try:
            async with self.request("GET", url, headers) as resp:
                if pin is not None and resp.status in (200, 206, 412):
                    total = content_total(resp.headers.get("Content-Range")) if resp.status == 206 else None
                    total = resp.content_length if resp.status == 200 else total
                    check_pin(resp, url=url, path=pin[0], pin=pin[1], total=total)
                await check_status(resp, url)
                if resp.status == 206:
                    check_content_range(resp.headers.get("Content-Range"), url=url, start=first, end=end)
                elif resp.status != 200:
                    raise base.OriginError(f"{url}: server answered {resp.status} to a Range request")
                elif first != 0:
                    raise _RangeIgnored()
                elif _longer_than(resp, end - first):
                    self.ranges_ignored = True  # this read is fine (it starts at 0); later ones stream
                if resp.status == 206 and self._direct_socket(url, resp) is not None:
                    before = done
                    done = await self._read_direct(resp, view, done=done, progress=progress)
                    if done - before < end - first:
                        raise base.TransientError(f"{url}: body ended after {done - before} of {end - first} bytes")
                    return done
                async for data, _ in resp.content.iter_chunks():  # as received: no joining copies
                    take = min(len(data), len(view) - done)
                    view[done : done + take] = memoryview(data)[:take]
                    done += take
                    if progress is not None:
                        progress(done)
                    self.bytes_read += len(data)
                    await self._limiter.acquire(len(data))
                    if done >= len(view):
                        break
        except (base.TransientError, *_TRANSIENT_EXC) as exc:
            raise _RangeBroken(exc, done=done) from exc
        return done

    def _direct_socket(self, url: str, resp: aiohttp.ClientResponse) -> Any:
        """The plain TCP socket under ``resp`` (asyncio's ``TransportSocket``), when its body may be
        read by a worker thread; else None."""
        if self._limiter.rate is not None or resp.content_length is None or not url.startswith("http://"):
            return None
        if resp.content_length < DIRECT_MIN:
            return None
        transport = resp.connection.transport if resp.connection is not None else None
        if transport is None or transport.is_closing() or transport.get_extra_info("sslcontext") is not None:
            return None
        raw = transport.get_extra_info("socket")
        return raw if raw is not None and getattr(raw, "type", None) == socket.SOCK_STREAM else None

    async def _read_direct(
        self, resp: aiohttp.ClientResponse, view: memoryview, *, done: int, progress: Callable[[int], None] | None
    ) -> int:
        """Read the rest of ``resp``'s body into ``view[done:]`` (see the module rules); the new ``done``.

        Stops early (fewer bytes) when the body ends, resets or stalls; the caller decides."""
        assert resp.connection is not None and resp.connection.transport is not None and resp.content_length
        transport = resp.connection.transport
        raw = transport.get_extra_info("socket")
        left = min(resp.content_length, len(view) - done)
        start = done
        while left > 0:  # what aiohttp has read already (no await: nothing more arrives meanwhile)
            data = resp.content.read_nowait(left)
            if not data:
                break
            view[done : done + len(data)] = data
            done += len(data)
            left -= len(data)
        self.bytes_read += done - start
        if progress is not None and done > start:
            progress(done)
        if left == 0 or resp.content.at_eof():
            return done  # all of it was buffered: aiohttp saw the body end, the connection is reused
        loop = asyncio.get_running_loop()

        def landed(filled: int) -> None:  # from the thread, in order
            if progress is not None:
                loop.call_soon_threadsafe(progress, filled)

        if self._readers is None:
            self._readers = ThreadPoolExecutor(_READER_THREADS, thread_name_prefix="origin-read")
        transport.pause_reading()  # no await since the buffer was drained: nothing more reached aiohttp
        self.direct_reads += 1
        try:
            sock = socket.socket(fileno=os.dup(raw.fileno()))
            job = loop.run_in_executor(
                self._readers, _receive, sock, view[done : done + left], self._read_timeout, done, landed
            )
            try:
                got = await asyncio.shield(job)
            except asyncio.CancelledError:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the thread's receive ends now; it closes its socket
                raise
        finally:
            resp.close()  # aiohttp did not see the body end: the connection is not reused
        self.bytes_read += got
        if progress is not None and got:
            progress(done + got)
        return done + got

    async def _stream_into(
        self,
        url: str,
        *,
        offset: int,
        view: memoryview,
        reported: int,
        progress: Callable[[int], None] | None,
        pin: tuple[str, base.Pin] | None = None,
    ) -> None:
        """Fill ``view`` from ``offset`` of a whole-object stream (a server that ignores Range).

        Reads of one URL take turns; ``progress(reported + done)`` as bytes land.
        """
        async with self._cursor_locks.setdefault(url, asyncio.Lock()):
            done = 0
            failures = 0
            while done < len(view):
                before = done
                try:
                    done = await self._stream_attempt(
                        url, offset=offset, view=view, done=done, reported=reported, progress=progress, pin=pin
                    )
                except _RangeBroken as broken:
                    self._drop_cursor(url)
                    done = broken.done
                    failures = 1 if done > before else failures + 1
                    await self._wait(failures, broken.cause, url)

    async def _open_cursor(self, url: str, *, at: int, pin: tuple[str, base.Pin] | None = None) -> _Cursor:
        cursor = self._cursors.get(url)
        if cursor is not None and cursor.pos <= at:
            return cursor
        self._drop_cursor(url)
        resp = await self._send("GET", url, conditions(pin[1][1]) if pin else None)
        try:
            if pin is not None and resp.status in (200, 412):
                check_pin(resp, url=url, path=pin[0], pin=pin[1], total=resp.content_length)
            await check_status(resp, url)
        except BaseException:
            resp.release()
            raise
        cursor = self._cursors[url] = _Cursor(resp)
        return cursor

    def _drop_cursor(self, url: str) -> None:
        cursor = self._cursors.pop(url, None)
        if cursor is not None:
            cursor.resp.close()

    async def _stream_attempt(
        self,
        url: str,
        *,
        offset: int,
        view: memoryview,
        done: int,
        reported: int,
        progress: Callable[[int], None] | None,
        pin: tuple[str, base.Pin] | None = None,
    ) -> int:
        """Skip the open stream to ``offset + done`` and read into ``view[done:]``; returns the new ``done``."""
        try:
            cursor = await self._open_cursor(url, at=offset + done, pin=pin)
            if cursor.size is not None and cursor.size < offset + len(view):
                raise base.OriginError(f"{url}: file has {cursor.size} bytes, the read needs {offset + len(view)}")
            while cursor.pos < offset + done:
                skipped = await self._next(cursor, url, limit=offset + done - cursor.pos)
                cursor.pos += len(skipped)
            while done < len(view):
                data = await self._next(cursor, url, limit=len(view) - done)
                view[done : done + len(data)] = data
                done += len(data)
                cursor.pos += len(data)
                if progress is not None:
                    progress(reported + done)
            if cursor.size is not None and cursor.pos >= cursor.size:
                self._drop_cursor(url)
        except (base.TransientError, *_TRANSIENT_EXC) as exc:
            raise _RangeBroken(exc, done=done) from exc
        return done

    async def _next(self, cursor: _Cursor, url: str, *, limit: int) -> bytes:
        """Up to ``limit`` (at most one step) more bytes of the stream, through the rate limit."""
        data = await cursor.resp.content.read(min(_STEP, limit))
        if not data:
            raise base.TransientError(f"{url}: body ended after {cursor.pos} bytes")
        self.bytes_read += len(data)
        await self._limiter.acquire(len(data))
        return data

    async def close(self) -> None:
        for url in list(self._cursors):
            self._drop_cursor(url)
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._readers is not None:
            self._readers.shutdown(wait=False, cancel_futures=True)
            self._readers = None


def _receive(
    sock: socket.socket, view: memoryview, timeout: float, base_done: int, landed: Callable[[int], None]
) -> int:
    """Worker thread: fill ``view`` from ``sock`` (a duplicate this call owns and closes); bytes
    received, fewer when the peer ends, resets or sends nothing for ``timeout`` seconds."""
    with sock:
        sock.setblocking(True)  # the duplicate shares the file's flags: restored below
        seconds = int(timeout)
        wait = struct.pack("ll", seconds, int((timeout - seconds) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, wait)
        filled = reported = 0
        last = time.monotonic()
        try:
            while filled < len(view):
                end = min(len(view), filled + _PIECE)
                try:
                    got = sock.recv_into(view[filled:end], end - filled, socket.MSG_WAITALL)
                except OSError:  # reset, shut down, or nothing for ``timeout`` (EAGAIN)
                    break
                if got == 0:
                    break
                filled += got
                now = time.monotonic()
                if filled - reported >= _REPORT_BYTES or now - last >= _REPORT_S:
                    landed(base_done + filled)
                    reported, last = filled, now
        finally:
            with contextlib.suppress(OSError):
                sock.setblocking(False)
        return filled
