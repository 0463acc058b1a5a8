"""The SDK's client of its node's cache agent: small JSON calls over a Unix socket, no bytes.

Owns the connection from a training process to the local API (``ringseed/cache/local_api.py``).
Blocking (fsspec and FUSE call it from their own threads): one persistent connection per thread.

Settings: ``RINGSEED_CACHE_SOCKET`` (default ``/run/ringseed/cache.sock``) and ``RINGSEED_TOKEN``.

Errors become the ``OSError`` a file API user expects, with the agent's reason as the message:
404 -> ``FileNotFoundError``; 400 ``bad_path`` -> ``PermissionError`` (a path that leaves the
group's tree or touches ``data/``); ``not_enough_nodes`` -> :class:`CacheUnavailable` (``EAGAIN``);
``changed`` (a dataset's source changed under an open file) -> ``OSError(ESTALE)``;
409 -> ``FileExistsError``; 507 -> ``OSError(ENOSPC)``;
503 and an unreachable agent -> :class:`CacheUnavailable` (``OSError(EIO)``); others ``OSError``.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
import threading
from typing import Any
from urllib.parse import urlencode

DEFAULT_SOCKET = "/run/ringseed/cache.sock"


class CacheUnavailable(OSError):
    """The node's cache agent (or its master) cannot answer now."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def error_for(status: int, code: str, reason: str) -> OSError:
    if status == 404:
        return FileNotFoundError(errno.ENOENT, reason)
    if status == 400 and code == "bad_path":
        return PermissionError(errno.EACCES, reason)
    if code == "not_enough_nodes":
        return CacheUnavailable(errno.EAGAIN, reason)
    if code == "changed":
        return OSError(errno.ESTALE, reason)
    if status == 409:
        return FileExistsError(errno.EEXIST, reason)
    if status == 507:
        return OSError(errno.ENOSPC, reason)
    if status >= 500:
        return CacheUnavailable(errno.EIO, reason)
    return OSError(errno.EINVAL, f"{code}: {reason}" if code else reason)


class LocalClient:
    """JSON calls to the local cache agent; safe to share between threads."""

    def __init__(self, *, socket_path: str | None = None, token: str | None = None, timeout: float = 900.0) -> None:
        self.socket_path = socket_path or os.environ.get("RINGSEED_CACHE_SOCKET") or DEFAULT_SOCKET
        token = token or os.environ.get("RINGSEED_TOKEN")
        if not token:
            raise CacheUnavailable(errno.EACCES, "no token for the cache agent (set RINGSEED_TOKEN)")
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.timeout = timeout
        self._local = threading.local()

    def _connection(self) -> _UnixConnection:
        conn: _UnixConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = _UnixConnection(self.socket_path, self.timeout)
            self._local.conn = conn
        return conn

    def call(self, method: str, endpoint: str, body: dict[str, Any] | None = None, **params: Any) -> Any:
        """One request; retried once on a dropped keep-alive connection."""
        url = endpoint + ("?" + urlencode(params) if params else "")
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, url, body=data, headers=self._headers)
                response = conn.getresponse()
                status, raw = response.status, response.read()
                break
            except (TimeoutError, http.client.HTTPException, ConnectionError, OSError) as exc:
                conn.close()
                self._local.conn = None
                if attempt == 2 or isinstance(exc, socket.timeout):
                    raise CacheUnavailable(
                        errno.EIO, f"cache agent at {self.socket_path} unreachable: {type(exc).__name__}: {exc}"
                    ) from exc
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"error": "bad_response", "reason": raw[:200].decode("utf-8", "replace")}
        if status < 300:
            return answer
        code = str(answer.get("error", "")) if isinstance(answer, dict) else ""
        reason = str(answer.get("reason", "")) if isinstance(answer, dict) else ""
        raise error_for(status, code, reason or f"HTTP {status}")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
