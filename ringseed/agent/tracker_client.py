"""The agent's client of the tracker API (``ringseed/master/tracker.py`` documents the bodies).

Rules:
- Every call carries the group's bearer token and a timeout.
- The master may be two replicas (a leader and a follower): the client is given one or more
  URLs (a Service in a cluster, both replicas cluster-free) and :class:`ringseed.web.Leaders`
  picks which to call (the last leader first, a follower's 503 names the leader); a new
  leader does not know us (404 ``unknown_node``): we register again, and nothing verified is
  fetched again.
- 404 ``unknown_node`` raises :class:`UnknownNode`: the master restarted or purged us; the agent
  registers again and re-announces what it holds.
- When no URL answers as leader (connection errors, timeouts, 5xx), :class:`Unavailable`: the
  caller retries later (the master may be restarting or failing over); other 4xx raise
  :class:`Refused` with the master's reason.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from ringseed import web


class TrackerClientError(Exception):
    pass


class UnknownNode(TrackerClientError):
    pass


class Unavailable(TrackerClientError):
    pass


class Refused(TrackerClientError):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(f"tracker refused ({status} {error}): {reason}")
        self.status = status
        self.error = error


class TrackerClient:
    """Thin JSON calls to the master; one shared ``aiohttp.ClientSession``."""

    def __init__(self, *, urls: list[str], token: str, node: str, session: aiohttp.ClientSession) -> None:
        self._leaders = web.Leaders(urls)
        self.node = node
        self._session = session
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=10)

    @property
    def leader(self) -> str:
        """The URL that last answered as the leader (the first one given until then)."""
        return self._leaders.leader

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        limit: aiohttp.ClientTimeout | None = None,
        **params: Any,
    ) -> Any:
        async def attempt(url: str) -> tuple[int, str, str | None]:
            async with self._session.request(
                method,
                url + path,
                json=body,
                params=params or None,
                headers=self._headers,
                timeout=limit or self._timeout,
            ) as response:
                return response.status, await response.text(), response.headers.get(web.LEADER_HEADER)

        try:
            status, text = await self._leaders.call(attempt)
        except web.NoLeader as exc:
            raise Unavailable(f"no tracker leader reachable: {exc}") from exc
        return self._decode(status, text)

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
        if status >= 500:
            raise Unavailable(f"tracker error {status}: {reason}")
        raise Refused(status, error, reason)

    async def register(
        self,
        *,
        url: str,
        session: str,
        chunks: dict[int, str],
        layout: dict[str, Any] | None,
        revision: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"node": self.node, "url": url, "session": session, "chunks": chunks}
        if layout is not None:
            body["layout"] = layout
        if revision is not None:
            body["revision"] = revision
        result: dict[str, Any] = await self._call("POST", "/v1/register", body)
        return result

    async def heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", "/v1/heartbeat", dict(body, node=self.node))
        return result

    async def watch(self, body: dict[str, Any], *, wait: float) -> dict[str, Any]:
        """A long-poll: answered when the tracker has news for us, at the latest after ``wait`` seconds."""
        limit = aiohttp.ClientTimeout(total=wait + self._timeout.total if self._timeout.total else None)
        result: dict[str, Any] = await self._call("POST", "/v1/watch", dict(body, node=self.node), limit=limit)
        return result

    async def get_manifest(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/v1/manifest")
        return result

    async def put_manifest(
        self,
        *,
        layout: dict[str, Any],
        chunk_hashes: list[str] | None,
        revision: dict[str, Any] | None = None,
        replaces: str | None = None,
    ) -> None:
        body: dict[str, Any] = {"node": self.node, "layout": layout}
        if chunk_hashes is not None:
            body["chunk_hashes"] = chunk_hashes
        if revision is not None:
            body["revision"] = revision
        if replaces is not None:
            body["replaces"] = replaces
        await self._call("PUT", "/v1/manifest", body)

    async def claim_origin(self, count: int) -> list[int]:
        result = await self._call("POST", "/v1/origin/claim", {"node": self.node, "count": count})
        return [int(i) for i in result.get("chunks", [])]

    async def peers(self, chunk: int) -> list[dict[str, Any]]:
        return (await self.sources(chunk))[0]

    async def sources(self, chunk: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Holders of ``chunk`` (least loaded first) and, when there are none, who streams it."""
        result = await self._call("GET", "/v1/peers", chunk=chunk, node=self.node)
        streaming = result.get("streaming")
        return list(result.get("peers", [])), streaming if isinstance(streaming, dict) else None

    async def report(self, *, peer: str, chunk: int) -> None:
        await self._call("POST", "/v1/report", {"node": self.node, "peer": peer, "chunk": chunk})
