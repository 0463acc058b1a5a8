"""The cache agent's client of the cache master, following whichever replica leads.

Owns how an agent reaches the leader (``ringseed/master/cachemeta_api.py`` documents the bodies).

Rules:
- The agent is given one or more master URLs (a Service in a cluster, both replicas locally);
  :class:`ringseed.web.Leaders` picks which to call (the last leader first, a 503's leader hint
  next). When every URL failed the call raises :class:`Unavailable` (the caller retries later).
- 404 ``unknown_node`` raises :class:`UnknownNode`: a new leader (or a purge) forgot this
  agent; it registers again with everything it holds.
- Other 4xx raise :class:`Refused` with the master's code and reason (a bad path, a conflict,
  not enough nodes): these are the user's answers, passed on unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from ringseed import web


class MasterError(Exception):
    pass


class Unavailable(MasterError):
    pass


class UnknownNode(MasterError):
    pass


class Refused(MasterError):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


class MasterClient:
    """JSON calls to the cache master's leader."""

    def __init__(self, *, urls: list[str], token: str, node: str, session: aiohttp.ClientSession) -> None:
        self._leaders = web.Leaders(urls)
        self.node = node
        self._session = session
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=30)

    async def call(self, method: str, endpoint: str, body: dict[str, Any] | None = None, **params: str) -> Any:
        try:
            status, text = await self._leaders.call(lambda url: self._once(method, url + endpoint, body, params))
        except web.NoLeader as exc:
            raise Unavailable(f"no cache master leader reachable: {exc}") from exc
        return self._decode(status, text)

    async def _once(
        self, method: str, url: str, body: dict[str, Any] | None, params: dict[str, str]
    ) -> tuple[int, str, str | None]:
        async with self._session.request(
            method, url, json=body, params=params or None, headers=self._headers, timeout=self._timeout
        ) as response:
            return response.status, await response.text(), response.headers.get(web.LEADER_HEADER)

    @staticmethod
    def _decode(status: int, text: str) -> Any:
        try:
            data = json.loads(text) if text else {}
        except json.JSONDecodeError:
            data = {"error": "bad_response", "reason": text[:200]}
        if status < 300:
            return data
        error = str(data.get("error", "")) if isinstance(data, dict) else ""
        reason = str(data.get("reason", "")) if isinstance(data, dict) else ""
        if status == 404 and error == "unknown_node":
            raise UnknownNode(reason)
        raise Refused(status, error, reason)

    # -- calls ------------------------------------------------------------------------------------

    async def register(self, *, url: str, session: str, group: str, chunks: list[str], free_bytes: int) -> Any:
        body = {"node": self.node, "url": url, "session": session, "group": group, "chunks": chunks}
        return await self.call("POST", "/v1/cache/register", dict(body, free_bytes=free_bytes))

    async def heartbeat(
        self, *, added: list[str], dropped: list[str], free_bytes: int, data: dict[str, int] | None = None
    ) -> Any:
        body: dict[str, Any] = {"node": self.node, "added": added, "dropped": dropped, "free_bytes": free_bytes}
        if data:
            body["data"] = data
        return await self.call("POST", "/v1/cache/heartbeat", body)

    async def place(self, *, count: int | None = None, exclude: list[str] | None = None) -> list[dict[str, str]]:
        body: dict[str, Any] = {"node": self.node, "exclude": exclude or []}
        if count is not None:
            body["count"] = count
        result = await self.call("POST", "/v1/cache/place", body)
        return list(result.get("replicas", []))

    async def commit(self, *, write_id: str, files: list[dict[str, Any]], copies: list[str]) -> Any:
        body = {"node": self.node, "write_id": write_id, "files": files, "copies": copies}
        return await self.call("POST", "/v1/cache/commit", body)

    async def persisted(self, *, path: str, version: int) -> Any:
        return await self.call("POST", "/v1/cache/persisted", {"node": self.node, "path": path, "version": version})

    async def rename(self, *, src: str, dst: str) -> Any:
        return await self.call("POST", "/v1/cache/rename", {"src": src, "dst": dst})

    async def delete(self, *, path: str, recursive: bool) -> Any:
        return await self.call("POST", "/v1/cache/delete", {"path": path, "recursive": recursive})

    async def stat(self, path: str) -> Any:
        return await self.call("GET", "/v1/cache/stat", path=path)

    async def listing(self, path: str) -> Any:
        return await self.call("GET", "/v1/cache/list", path=path)

    async def object(self, path: str) -> Any:
        return await self.call("GET", "/v1/cache/object", path=path, node=self.node)
