"""Request handlers of the coordinator: parse, call the state machine, hold, answer.

Owns the translation between JSON bodies and :mod:`ringseed.protocol.membership`; the rules
are in ``coordinator.py``'s docstring. Every body is checked field by field (``web.field_of``);
a refusal of the state machine becomes a JSON error (404 unknown round or tag, 409 not
accepted, 410 removed peer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web as aioweb

from ringseed import web
from ringseed.protocol import membership

if TYPE_CHECKING:
    from ringseed.master.coordinator import Coordinator

Get = Callable[[], "Coordinator"]
Handler = Callable[[aioweb.Request], Any]
_STATUS = {"unknown_peer": 410, "not_accepted": 409, "not_participant": 409}


def _refused(exc: membership.MembershipError) -> web.HTTPProblem:
    return web.problem(_STATUS.get(exc.code, 404), exc.code, str(exc))


def _wait(body: dict[str, Any]) -> float:
    value = web.field_of(body, "wait", (int, float), required=False)
    return float(value) if value is not None else 0.0


def join(get: Get) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        body = await web.read_json(request)
        peer_id = web.field_of(body, "peer_id", str)
        host = web.field_of(body, "host", str)
        port = web.field_of(body, "port", int)
        if not peer_id or not 0 < port < 65536:
            raise web.problem(400, "bad_field", "peer_id must be non-empty and port in 1..65535")
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
        peer_id = web.field_of(body, "peer_id", str)
        seq = web.field_of(body, "abort_seq", int, required=False) or 0
        try:
            info = c.group.heartbeat(peer_id=peer_id, now=c.clock())
        except membership.MembershipError as exc:
            raise _refused(exc) from None
        await c.wait_for(
            lambda: c.group.aborts_since(seq) or None,
            wait=min(_wait(body), c.interval),
            connected=lambda: _connected(request),
        )
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


def round_(get: Get, kind: membership.RoundKind, fields: tuple[str, ...]) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        body = await web.read_json(request)
        peer_id = web.field_of(body, "peer_id", str)
        number = web.field_of(body, "round", int, required=False)
        c.seen(peer_id)
        try:
            if number is None:
                payload = {name: body[name] for name in fields if name in body}
                number = c.group.vote(kind, peer_id=peer_id, payload=payload, now=c.clock())
                c.changed()
            result = await c.wait_for(lambda: c.group.result(kind, number), wait=_wait(body))
        except membership.MembershipError as exc:
            raise _refused(exc) from None
        return aioweb.json_response({"round": number, "done": result is not None, "result": result})

    return handler


def end(get: Get) -> Handler:
    async def handler(request: aioweb.Request) -> aioweb.Response:
        c = get()
        body = await web.read_json(request)
        peer_id = web.field_of(body, "peer_id", str)
        tag = web.field_of(body, "tag", int)
        ok = web.field_of(body, "ok", bool)
        reason = web.field_of(body, "reason", str, required=False) or ""
        c.seen(peer_id)
        try:
            before = c.group.abort_seq
            c.group.end(peer_id=peer_id, tag=tag, ok=ok, reason=reason, now=c.clock())
            if c.group.abort_seq != before:
                c.metrics.inc("coordinator_aborts_total")
            c.changed()
            decision = await c.wait_for(lambda: c.group.decision(tag), wait=_wait(body))
        except membership.MembershipError as exc:
            raise _refused(exc) from None
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
        peer_id = web.field_of(body, "peer_id", str)
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
        return aioweb.json_response(get().group.status())

    return handler
