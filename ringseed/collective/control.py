"""A training peer's connection to the coordinator: blocking HTTP calls and the heartbeat thread.

Owns the client side of the coordinator API (see ``ringseed/master/coordinator.py``). Blocking
(``http.client``), thread-safe: each thread keeps its own keep-alive connection, so the
heartbeat thread, the op thread and the caller never share a socket.

Rules:
- Long polls: a call says how long the coordinator may hold it (``hold``); the socket timeout is
  ``hold`` plus ``timeout``. Round calls vote once, then poll by round number until the round
  has a result, so a poll that is retried can never cast a second vote.
- :meth:`Client.close` (any thread) ends every call in flight at once, on every thread, with
  :class:`CoordinatorUnavailable`, and every later call the same way.
- A dropped connection is retried once on a fresh one (every call is idempotent: a repeated
  vote overwrites, a repeated registration or end changes nothing). A coordinator that stays
  unreachable raises :class:`CoordinatorUnavailable`; an error answer raises
  :class:`CoordinatorError` with the server's code and reason; 410 means this peer was removed
  (:class:`Removed`).
- The heartbeat thread proves life every ``interval`` (the coordinator holds the call up to
  the interval and answers early when a tag is aborted) and hands every newly aborted tag to
  ``on_aborts`` at once. It never raises; a removal goes to ``on_removed``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)


class CoordinatorError(Exception):
    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(f"coordinator answered {status} {code}: {reason}")
        self.status, self.code, self.reason = status, code, reason


class Removed(CoordinatorError):
    """The coordinator no longer knows this peer (it was declared dead)."""


class CoordinatorUnavailable(OSError):
    """The coordinator could not be reached."""


class Client:
    """Blocking JSON calls to one coordinator."""

    def __init__(self, *, url: str, token: str, timeout: float = 10.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"coordinator URL must be http://host:port, got {url!r}")
        self._host, self._port = parsed.hostname, parsed.port or 8470
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        self._closed = False

    def close(self) -> None:
        """End the calls in flight on every thread (their sockets are shut down) and refuse new ones."""
        with self._lock:
            self._closed = True
            conns = list(self._open)
        for conn in conns:
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            with self._lock:
                self._open.add(conn)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def close_thread_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                self._open.discard(conn)

    def call(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, *, hold: float = 0.0
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps({**body, "wait": hold}).encode()
        for attempt in (1, 2):
            self._check_open()
            conn = self._connection(hold + self.timeout)
            try:
                conn.request(method, path, body=data, headers=self._headers)
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close_thread_connection()
                self._check_open()
                if attempt == 2:
                    raise CoordinatorUnavailable(f"coordinator {self._host}:{self._port}: {exc}") from exc
                continue
            return _answer(response.status, raw)
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_open(self) -> None:
        if self._closed:
            raise CoordinatorUnavailable(f"coordinator {self._host}:{self._port}: client closed")

    def round(
        self, path: str, *, peer_id: str, payload: Mapping[str, Any], hold: float = 10.0, timeout: float | None = None
    ) -> dict[str, Any]:
        """Vote in the round behind ``path`` and wait for its result."""
        deadline = None if timeout is None else time.monotonic() + timeout
        answer = self.call("POST", path, {**payload, "peer_id": peer_id}, hold=hold)
        while not answer["done"]:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{path} round {answer['round']} did not close in {timeout} s")
            answer = self.call("POST", path, {"peer_id": peer_id, "round": answer["round"]}, hold=hold)
        result: dict[str, Any] = answer["result"]
        return result


def _answer(status: int, raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        body = {"error": "bad_response", "reason": raw[:200].decode(errors="replace")}
    if status >= 400:
        kind = Removed if status == 410 else CoordinatorError
        raise kind(status, str(body.get("error", "error")), str(body.get("reason", "")))
    if not isinstance(body, dict):
        raise CoordinatorError(status, "bad_response", "coordinator answer is not a JSON object")
    return body


class Heartbeat:
    """A daemon thread that keeps the peer alive and pushes aborted tags to ``on_aborts``."""

    def __init__(
        self,
        *,
        client: Client,
        peer_id: str,
        interval: float,
        abort_seq: int,
        on_aborts: Callable[[list[int]], None],
        on_removed: Callable[[str], None],
    ) -> None:
        self._client, self._peer_id, self._interval = client, peer_id, interval
        self._seq = abort_seq
        self._on_aborts, self._on_removed = on_aborts, on_removed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ringseed-heartbeat-{peer_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        self._stop.set()
        if wait and self._thread.is_alive():
            self._thread.join(timeout=self._interval + self._client.timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._beat()
        finally:
            self._client.close_thread_connection()

    def _beat(self) -> None:
        try:
            answer = self._client.call(
                "POST", "/v1/heartbeat", {"peer_id": self._peer_id, "abort_seq": self._seq}, hold=self._interval
            )
        except Removed as exc:
            self._on_removed(exc.reason)
            self._stop.set()
            return
        except (CoordinatorError, OSError) as exc:
            if self._stop.is_set():
                return  # stopping: the client was closed under us
            log.warning("Heartbeat of %s failed: %s", self._peer_id, exc)
            self._stop.wait(self._interval / 4)
            return
        aborts = [int(t) for t in answer.get("aborts", [])]
        self._seq = max(self._seq, int(answer.get("abort_seq", self._seq)))
        if aborts:
            self._on_aborts(aborts)
