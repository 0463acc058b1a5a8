"""Reading masters' ``GET /v1/status`` for the operator's status timers.

Owns where a master is reached and the HTTP call itself. Rules:
- In the cluster a master is ``builders.master_url(namespace=, name=)``. The environment variable
  ``RINGSEED_MASTER_URL_TEMPLATE`` overrides it (tests, port-forwards): either a format string
  with ``{namespace}`` and ``{name}`` (``http://127.0.0.1:18470``), or a JSON object mapping
  ``"namespace/name"`` to a base URL (names not in it use the in-cluster URL).
- Every call carries the group's bearer token, has a short timeout, and fails with
  :class:`MasterError` (never anything else) so the timer can report "unreachable".
- :class:`Silence` remembers when each master last answered, to tell "not up yet" from
  "gone silent after answering" (Degraded).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ringseed import web
from ringseed.api import constants
from ringseed.operator import builders

URL_TEMPLATE_ENV = "RINGSEED_MASTER_URL_TEMPLATE"


class MasterError(Exception):
    """The master did not answer usefully; the message says why."""


@dataclass(frozen=True)
class Locator:
    """Where the operator reaches the master of ``namespace/name``."""

    template: str | None = None
    mapping: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_text(cls, text: str | None) -> Locator:
        text = (text or "").strip()
        if not text:
            return cls()
        if text.startswith("{"):
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError(f"{URL_TEMPLATE_ENV} must be a format string or a JSON object")
            return cls(mapping={str(k): str(v) for k, v in value.items()})
        return cls(template=text)

    @classmethod
    def from_env(cls) -> Locator:
        return cls.from_text(os.environ.get(URL_TEMPLATE_ENV))

    def url(self, *, namespace: str, name: str, service: str | None = None) -> str:
        """The master of ``namespace/name``, or with ``service`` the master behind that Service
        (the cache master ``<name>-cache``); the template and mapping see ``service`` as the name."""
        key = service or name
        if f"{namespace}/{key}" in self.mapping:
            return self.mapping[f"{namespace}/{key}"].rstrip("/")
        if self.template:
            return self.template.format(namespace=namespace, name=key).rstrip("/")
        if service:
            return f"http://{service}.{namespace}.svc:{constants.MASTER_PORT}"
        return builders.master_url(namespace=namespace, name=name).rstrip("/")


class Reader:
    """One HTTP session for all masters; ``close`` when the operator stops."""

    def __init__(self, *, timeout: float = 3.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def status(self, *, url: str, token: str | None) -> dict[str, Any]:
        if self._closed:
            raise MasterError(f"{url}: not asked, the operator is stopping")
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        session = self._session
        headers = {"Authorization": f"Bearer {token}"} if token else {}

        async def attempt(at: str) -> tuple[int, str, str | None]:
            async with session.get(f"{at}/v1/status", headers=headers) as response:
                return response.status, await response.text(), response.headers.get(web.LEADER_HEADER)

        # A replicated master's follower answers 503 naming the leader; web.Leaders follows it
        leaders = web.Leaders([url])
        try:
            status, text = await leaders.call(attempt)
        except web.NoLeader as exc:
            raise MasterError(str(exc)) from exc
        finally:
            if leaders.leader != url:  # a pooled connection or a cached address outlived the switch
                await session.close()
                self._session = None
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise MasterError(f"{url}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            reason = body.get("reason") if isinstance(body, dict) else None
            raise MasterError(f"{url} answered HTTP {status}: {reason or body}")
        if not isinstance(body, dict):
            raise MasterError(f"{url} answered {type(body).__name__}, not a JSON object")
        return body

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None


@dataclass
class Silence:
    """When each master last answered (monotonic seconds), keyed by ``(kind, namespace, name)``."""

    last_answer: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def answered(self, key: tuple[str, str, str], *, now: float) -> None:
        self.last_answer[key] = now

    def silent_for(self, key: tuple[str, str, str], *, now: float) -> float | None:
        """Seconds since the last answer; None if it never answered."""
        last = self.last_answer.get(key)
        return None if last is None else now - last

    def forget(self, key: tuple[str, str, str]) -> None:
        self.last_answer.pop(key, None)
