"""Request handlers of the coordinator: parse, call the state machine, hold, answer.

Owns the translation between JSON bodies and :mod:`ringseed.protocol.membership`; the rules
are in ``coordinator.py``'s docstring. Every body is checked field by field before the state
machine sees it (``ringseed.web``: types, ranges, lengths; a vote's payload against the schema
of its round), so that no vote can break a round for the others. A refusal of the state machine
(:class:`membership.MembershipError`) becomes a JSON error through ``ERRORS`` in one place
(404 unknown round or tag, 409 not accepted, 410 removed peer).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web as aioweb

from ringseed import web
from ringseed.protocol import membership

if TYPE_CHECKING:
    from ringseed.master.coordinator import Coordinator

Get = Callable[[], "Coordinator"]
Handler = Callable[[aioweb.Request], Any]
MAX_U63 = (1 << 63) - 1
MAX_ENTRIES = 4096  # shared tensors per sync vote, peers per bandwidth row
PEER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
HOST = re.compile(r"[A-Za-z0-9._:\[\]-]{1,253}")
OP = re.compile(r"[a-z][a-z0-9_]{0,63}")
_STATUS = {"unknown_peer": 410, "not_accepted": 409, "not_participant": 409}


def _status(exc: Exception) -> int:
    return _STATUS.get(getattr(exc, "code", ""), 404)


ERRORS: web.ErrorMap = {membership.MembershipError: _status}


def _wait(body: dict[str, Any]) -> float:
    value = web.field_of(body, "wait", (int, float), required=False)
    return float(value) if value is not None else 0.0


def _peer_id(body: dict[str, Any]) -> str:
    return str(web.text(body, "peer_id", max_length=253, pattern=PEER_ID, what="a peer id"))


def _begin(body: dict[str, Any]) -> dict[str, Any]:
    op = web.text(body, "op", max_length=64, pattern=OP, what="an operation name")
    return {"op": op, "nbytes": web.integer(body, "nbytes", low=0, high=MAX_U63)}


def _sync(body: dict[str, Any]) -> dict[str, Any]:
    hashes = web.field_of(body, "hashes", dict)
    if len(hashes) > MAX_ENTRIES or not all(
        isinstance(k, str) and 0 < len(k) <= 256 and isinstance(v, str) and 0 < len(v) <= 128 for k, v in hashes.items()
    ):
        raise web.problem(400, "bad_field", f"field 'hashes' must map at most {MAX_ENTRIES} names to digests")
    return {"revision": web.integer(body, "revision", low=0, high=MAX_U63), "hashes": hashes}


def _bandwidth(body: dict[str, Any]) -> dict[str, Any]:
    row = web.field_of(body, "row", dict)
    if len(row) > MAX_ENTRIES or not all(
        isinstance(k, str)
        and PEER_ID.fullmatch(k) is not None
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and v >= 0
        for k, v in row.items()
    ):
        raise web.problem(400, "bad_field", "field 'row' must map peer ids to bandwidths (non-negative numbers)")
    return {"row": row}


SCHEMAS: dict[membership.RoundKind, Callable[[dict[str, Any]], dict[str, Any]]] = {
    membership.RoundKind.COLLECTIVE: _begin,
    membership.RoundKind.ACCEPT: lambda body: {},
    membership.RoundKind.SYNC: _sync,
    membership.RoundKind.BANDWIDTH: _bandwidth,
}


def join(get: Get) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        body = await web.read_json(request)
        peer_id = _peer_id(body)
        host = str(web.text(body, "host", max_length=253, pattern=HOST, what="a host name or address"))
        port = web.integer(body, "port", low=1, high=65535)
        c.group.register(peer_id=peer_id, host=host, port=port, now=c.clock())
        c.changed()

        def accepted() -> bool | None:
            info = c.group.peers.get(peer_id)
            return True if info is not None and info.status is membership.PeerStatus.ACCEPTED else None

        await c.wait_for(accepted, wait=_wait(body))
        info = c.group.peers.get(peer_id)
        return aioweb.json_response(
            {
                "status": info.status.value if info else "Removed",
                "epoch": c.group.epoch,
                "ring": c.group.ring_addresses(),
                "heartbeat_interval": c.interval,
                "heartbeat_timeout": c.timeout,
                "abort_seq": c.group.abort_seq,
            }
        )

    return handler


def heartbeat(get: Get) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        body = await web.read_json(request)
        peer_id = _peer_id(body)
        seq = web.integer(body, "abort_seq", low=0, high=MAX_U63, default=0)
        info = c.group.heartbeat(peer_id=peer_id, now=c.clock())
        c.held[peer_id] += 1
        try:
            await c.wait_for(
                lambda: c.group.aborts_since(seq) or None,
                wait=min(_wait(body), c.interval),
                connected=lambda: _connected(request),
            )
        finally:
            c.held[peer_id] -= 1
            if c.held[peer_id] <= 0:
                del c.held[peer_id]
        if not _connected(request):  # the peer hung up a held heartbeat: its process is gone
            c.lost(peer_id, reason="its heartbeat connection closed (process gone)")
            raise web.problem(410, "removed", f"peer {peer_id!r} closed its heartbeat connection")
        info = c.group.peers.get(peer_id, info)
        return aioweb.json_response(
            {
                "status": info.status.value,
                "epoch": c.group.epoch,
                "abort_seq": c.group.abort_seq,
                "aborts": c.group.aborts_since(seq),
                "pending_peers": c.group.pending(),
            }
        )

    return handler


def _connected(request: aioweb.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


def round_(get: Get, kind: membership.RoundKind) -> Handler:
    """A vote (no ``round``: the payload is checked against ``SCHEMAS[kind]``) or a poll."""
    schema = SCHEMAS[kind]

    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        body = await web.read_json(request)
        peer_id = _peer_id(body)
        number: int | None = None
        if "round" in body:
            number = web.integer(body, "round", low=0, high=MAX_U63)
        c.seen(peer_id)
        if number is None:
            payload = schema(body)
            number = c.group.vote(kind, peer_id=peer_id, payload=payload, now=c.clock())
            c.changed()
        result = await c.wait_for(lambda: c.group.result(kind, number), wait=_wait(body))
        return aioweb.json_response({"round": number, "done": result is not None, "result": result})

    return handler


def end(get: Get) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        body = await web.read_json(request)
        peer_id = _peer_id(body)
        tag = web.integer(body, "tag", low=0, high=MAX_U63)
        ok = web.field_of(body, "ok", bool)
        reason = " ".join(str(web.field_of(body, "reason", str, required=False) or "").split())[:1024]
        c.seen(peer_id)
        before = c.group.abort_seq
        c.group.end(peer_id=peer_id, tag=tag, ok=ok, reason=reason, now=c.clock())
        if c.group.abort_seq != before:
            c.metrics.inc("coordinator_aborts_total")
        c.changed()
        decision = await c.wait_for(lambda: c.group.decision(tag), wait=_wait(body))
        return aioweb.json_response(
            {
                "verdict": decision.verdict.value if decision else None,
                "reason": decision.reason if decision else "",
                "epoch": c.group.epoch,
            }
        )

    return handler


def leave(get: Get) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        body = await web.read_json(request)
        peer_id = _peer_id(body)
        c.group.remove(peer_id, reason="left the group", now=c.clock())
        c.changed()
        return aioweb.json_response({"ok": True})

    return handler


def topology(get: Get) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        return aioweb.json_response(
            {
                "epoch": c.group.epoch,
                "ring": c.group.ring_addresses(),
                "optimize": c.group.optimize_topology,
            }
        )

    return handler


def status(get: Get) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        return aioweb.json_response({**c.group.status(), "held_heartbeats": sorted(c.held)})

    return handler
