"""Reusable test servers for origins, on 127.0.0.1 only.

- :class:`FlakyHTTPOrigin` serves a directory over HTTP the way an origin web server would:
  ``GET/HEAD /<path>`` with ``Range`` (206 + ``Content-Range``), and ``/index.json`` generated
  from the directory (``{"files": [{"path", "size", "mode"}]}``) unless the directory has one.
  A fault script (``faults``, a FIFO of :class:`Fault`) is consumed one fault per GET of file data
  (HEAD and ``index.json`` are spared unless ``fault_index=True``). ``requests`` logs every
  request as ``(method, path, range header)``; ``injected`` lists the faults used; ``bytes_sent``
  counts body bytes written. Files carry a strong ``ETag`` (mtime and size, like nginx) and a
  ``Last-Modified``; ``If-Match`` / ``If-Unmodified-Since`` are honoured with 412 unless
  ``conditional=False`` (a server that ignores them); ``etags=False`` sends neither header.

  Use it as an async context manager (``async with FlakyHTTPOrigin(root) as srv: srv.url``) in
  async tests, or ``with srv.in_thread() as url:`` to run it on its own loop in a background
  thread (for sync tests or subprocesses). ``srv.url`` ends with ``/``: pass it straight to
  ``origins.open_origin`` as a directory source; ``srv.url + "a.bin"`` is a one-file source.

- :func:`plain_http_server` runs Python's own ``http.server`` (no ``Range`` support) on a directory.
- :func:`hub_cache` lays out a Hugging Face hub cache (blobs, a snapshot of symlinks to them).
- :func:`app_in_thread` serves any aiohttp application on a free loopback port from a thread.
- :func:`moto_s3` runs a moto S3 server on a free loopback port and yields its endpoint URL;
  :func:`s3_env` gives the environment (endpoint, dummy keys, region) an S3 origin needs;
  :func:`put_objects` creates a bucket and uploads ``{key: bytes}`` with boto3.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import enum
import hashlib
import http.server
import json
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web


class Fault(enum.Enum):
    """One misbehaviour of the origin server, applied to one GET."""

    ERROR_500 = "500"  # 500 Internal Server Error, no data
    ERROR_503 = "503"  # 503 with Retry-After: 0
    TOO_MANY = "429"  # 429 Too Many Requests with Retry-After: 0
    RESET = "reset"  # headers and half the body, then a TCP reset
    TRUNCATE = "truncate"  # full Content-Length promised, half the body sent, connection closed
    SHORT_RANGE = "short"  # an honest 206 that covers only the first half of the asked range
    STALL = "stall"  # half the body, then silence for ``stall_seconds`` (the client should time out)


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``[start, end)`` of a single ``bytes=a-b`` / ``bytes=a-`` range, or None for the whole file."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[len("bytes=") :].partition("-")
    start = int(first)
    end = min(int(last) + 1, size) if last else size
    return start, end


def _http_date(seconds: float) -> str:
    return email.utils.formatdate(seconds, usegmt=True)


def _precondition_failed(request: web.Request, validators: Mapping[str, str]) -> bool:
    match = request.headers.get("If-Match")
    if match is not None and match != validators.get("ETag"):
        return True
    since = request.headers.get("If-Unmodified-Since")
    return since is not None and since != validators.get("Last-Modified")


def _index_of(root: Path) -> bytes:
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        st = path.stat()
        files.append({"path": path.relative_to(root).as_posix(), "size": st.st_size, "mode": stat.S_IMODE(st.st_mode)})
    return json.dumps({"files": files}).encode()


class FlakyHTTPOrigin:
    """An HTTP file server over ``root`` that misbehaves on cue (see module docstring)."""

    def __init__(
        self,
        root: Path,
        *,
        faults: Iterable[Fault] = (),
        fault_index: bool = False,
        stall_seconds: float = 10.0,
        etags: bool = True,
        conditional: bool = True,
    ) -> None:
        self.after_get: Callable[[str], None] | None = None  # called with the path after a file's GET body
        self.root = Path(root)
        self.etags = etags
        self.conditional = conditional
        self.stall_seconds = stall_seconds
        self.faults: collections.deque[Fault] = collections.deque(faults)
        self.fault_index = fault_index
        self.requests: list[tuple[str, str, str | None]] = []
        self.connections: set[object] = set()  # the client ends (peer addresses) requests came over
        self.injected: list[Fault] = []
        self.bytes_sent = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None

    def add_faults(self, *faults: Fault) -> None:
        self.faults.extend(faults)

    async def __aenter__(self) -> FlakyHTTPOrigin:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._closing = asyncio.Event()
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[str]:
        """Run the server on its own event loop in a daemon thread; yields the base URL."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        stop = asyncio.Event()

        async def main() -> None:
            async with self:
                started.set()
                await stop.wait()

        thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
        thread.start()
        try:
            if not started.wait(30):
                raise RuntimeError("FlakyHTTPOrigin did not start within 30 s")
            yield self.url
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(30)
            loop.close()

    def _file(self, rel: str) -> Path | None:
        full = (self.root / rel).resolve()
        if not full.is_relative_to(self.root.resolve()) or not full.is_file():
            return None
        return full

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rel = request.match_info["path"]
        self.requests.append((request.method, rel, request.headers.get("Range")))
        if request.transport is not None:
            self.connections.add(request.transport.get_extra_info("peername"))
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405)
        full = self._file(rel)
        validators: dict[str, str] = {}
        if full is not None:
            st = full.stat()
            body = full.read_bytes()
            if self.etags:
                validators = {"ETag": f'"{st.st_mtime_ns:x}-{st.st_size:x}"', "Last-Modified": _http_date(st.st_mtime)}
            if self.conditional and _precondition_failed(request, validators):
                return web.Response(status=412, headers=validators)
        elif rel == "index.json":
            body = _index_of(self.root)
        else:
            return web.Response(status=404, text=f"no such file: {rel}")
        fault_applies = request.method == "GET" and (rel != "index.json" or self.fault_index)
        fault = self.faults.popleft() if fault_applies and self.faults else None
        if fault is not None:
            self.injected.append(fault)
        return await self._respond(request, body, fault, validators)

    async def _respond(
        self, request: web.Request, body: bytes, fault: Fault | None, validators: Mapping[str, str]
    ) -> web.StreamResponse:
        if fault in (Fault.ERROR_500, Fault.ERROR_503, Fault.TOO_MANY):
            status = int(fault.value) if fault is not None else 500
            return web.Response(status=status, text="injected fault", headers={"Retry-After": "0"})
        span = _parse_range(request.headers.get("Range"), len(body))
        start, end = span if span is not None else (0, len(body))
        if start >= len(body) and len(body) > 0:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(body)}"})
        if fault is Fault.SHORT_RANGE:
            end = start + max(1, (end - start) // 2)
        headers = {"Accept-Ranges": "bytes", "Content-Length": str(end - start), **validators}
        status = 200
        if span is not None:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(body)}"
        resp = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        data = body[start:end]
        if fault in (Fault.RESET, Fault.TRUNCATE, Fault.STALL):
            return await self._break(request, resp, data[: len(data) // 2], fault=fault)
        await resp.write(data)
        self.bytes_sent += len(data)
        await resp.write_eof()
        if self.after_get is not None and validators:
            self.after_get(request.match_info["path"])
        return resp

    async def _break(
        self, request: web.Request, resp: web.StreamResponse, part: bytes, *, fault: Fault
    ) -> web.StreamResponse:
        await resp.write(part)
        self.bytes_sent += len(part)
        if fault is Fault.STALL and self._closing is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.stall_seconds)
        reset = fault is Fault.RESET
        transport = request.transport
        if transport is not None:
            sock: socket.socket | None = transport.get_extra_info("socket")
            if reset and sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort() if reset else transport.close()
        return resp


@contextlib.contextmanager
def app_in_thread(app: web.Application) -> Iterator[str]:
    """Serve an aiohttp ``app`` on a free loopback port from a daemon thread; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 and a free port; yields ``http://127.0.0.1:PORT``."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_env(endpoint: str, *, key: str = "testing", secret: str = "testing") -> dict[str, str]:
    """The environment an S3 origin (and boto3) needs to talk to ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "us-east-1",
    }


def boto3_client(endpoint: str, service: str = "s3", *, key: str = "testing", secret: str = "testing") -> Any:
    """A boto3 client for the moto server (dummy credentials unless given)."""
    import boto3

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )


def put_objects(endpoint: str, bucket: str, objects: Mapping[str, bytes]) -> None:
    """Create ``bucket`` (if needed) on the moto server and upload ``{key: data}``."""
    client = boto3_client(endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def write_tree(root: Path, files: Mapping[str, bytes], *, modes: Mapping[str, int] | None = None) -> Path:
    """Write ``{relative path: data}`` under ``root`` (with optional modes); returns ``root``."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, (modes or {}).get(rel, 0o644))
    return root


@contextlib.contextmanager
def plain_http_server(root: Path) -> Iterator[tuple[str, list[str]]]:
    """Python's own ``http.server`` (no Range support) serving ``root``; yields its URL and the request log."""
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            requests.append(f"{self.command} {self.path} {self.headers.get('Range')}")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def hub_cache(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A Hugging Face hub cache for ``org/name``: blobs by hash, a snapshot of relative symlinks to them."""
    repo = tmp_path / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for rel, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot
