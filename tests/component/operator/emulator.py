"""A KMock Kubernetes emulator close enough to a real API server for kopf and ringseed's operator.

KMock 0.8 stores objects but gives them no ``uid``, ``resourceVersion``, ``generation`` or
``creationTimestamp``, and every watch replays all objects (so an object that exists before the
operator starts is seen twice). This subclass fixes what the operator relies on:

- create stamps ``uid``, ``creationTimestamp`` and ``generation: 1``;
- a patch that touches ``spec`` (not through ``/status``) bumps ``generation``;
- every change gets the next ``resourceVersion`` (one global counter, as in etcd);
- ``lean=True`` (benchmarks) drops KMock's costs that only assertions and custom reactions need:
  no request log (while KMock matches a request, the log holds only that request: KMock walks the
  log for every reaction it tries, quadratic in a benchmark); the matching reaction remembered per
  method and action; one object read or written by key (KMock scans every object it holds); no
  server-side traceback in the body of a 404 or 409;
- a list answers with the current ``resourceVersion``; a watch that carries
  ``resourceVersion=N`` replays only the changes after ``N`` (kept in a bounded history), then
  streams live ones, so nothing is lost between kopf's list and its watch and nothing is
  seen twice.

Used by the component tests (``@pytest.mark.kmock(cls=Emulator)``) and by ``bench/operator.py``.
"""

from __future__ import annotations

import collections
import contextvars
import copy
import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import aiobus, apps, enums, k8s, rendering

HISTORY_LIMIT = 100_000

# The request that the current task (one per HTTP request, in aiohttp) is handling.
_handling: contextvars.ContextVar[rendering.Request] = contextvars.ContextVar("_handling")


class _OwnRequestOnly(list[rendering.Request]):
    """A request log that records nothing; iterated, it holds the caller's own request only.

    KMock decides whether a reaction applies by checking that the request is among those its
    filters let through from the log; that answer is the same when the log holds just the request.
    """

    def append(self, request: rendering.Request) -> None:
        pass

    def __iter__(self) -> Any:
        request = _handling.get(None)
        return iter(() if request is None else (request,))


@attrs.mutable(weakref_slot=True)
class _RecordingBus(aiobus.Bus[Any]):
    """A KMock bus that lets the emulator stamp and record each event as it is put."""

    on_put: Any = None

    async def put(self, *items: Any) -> None:
        if self.on_put is not None:
            items = tuple(self.on_put(item) for item in items)
        await super().put(*items)


class _RememberedDispatch(apps.RawHandler):
    """KMock's reaction matching, remembered per kind of request when the emulator is lean.

    KMock tries its reactions in priority order and serves the first whose filters let the request
    through: over a dozen filter checks per request. The emulator's own reactions are fixed, always
    answer (never disabled or depleted), and depend on the method, the action and (outside the
    resources) the path only, so the first match for a kind of request is the match for all of
    that kind. Hence lean mode is for a bare emulator: no reactions of one's own.
    """

    __slots__ = ()

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        remembered: dict[Any, Any] | None = getattr(self, "_remembered", None)
        if remembered is None:
            return await super()._handle(request)
        key = (request.method, request.action, request.subresource, None if request.resource else request.url.path)
        payload = remembered.get(key)
        if payload is None:
            for candidate in sorted(self._payloads, key=_order):
                if request in candidate._source:
                    payload = remembered[key] = candidate
                    break
            else:
                return await super()._handle(request)  # KMock's own answer to the unmatched
        return await payload(request)


def _order(payload: Any) -> tuple[float, ...]:
    """KMock's order of reactions: highest priority first, priorities padded with zeros."""
    return tuple(-p for p in payload.priorities) + (0,) * (8 - len(payload.priorities))


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator, _RememberedDispatch):
    """KMock's emulator with uids, generations, resource versions and resumable watches."""

    # Benchmarks (see the module docstring); tests keep KMock's bookkeeping (they assert on the log).
    lean: bool = False
    _remembered: dict[Any, Any] | None = attrs.field(default=None, init=False)
    _revision: int = attrs.field(default=0, init=False)
    _history: collections.deque[tuple[int, Any, dict[str, Any]]] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY_LIMIT), init=False
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = collections.defaultdict(self._new_bus)
        if self.lean:
            self._requests = _OwnRequestOnly()
            self._remembered = {}

    def _new_bus(self) -> _RecordingBus:
        return _RecordingBus(on_put=None)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        _handling.set(request)  # this task's own (each aiohttp request runs in a task of its own)
        if request.resource is not None:
            bus = self._buses[request.resource]
            if isinstance(bus, _RecordingBus) and bus.on_put is None:
                resource = request.resource
                bus.on_put = lambda event: self._record(resource, event)
            self._stamp(request)
        return await super()._handle(request)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if not self.lean or not isinstance(exc, k8s.KubernetesError):
            return await super()._render_error(exc)
        body = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": exc.status}
        body.update(reason=exc.reason or type(exc).__name__, message=exc.message or repr(exc))
        body["details"] = exc.details or {}
        return aiohttp.web.json_response(body, status=exc.status)

    def _KubernetesEmulator__get_objs(self, request: rendering.Request, strict: bool) -> list[Any]:
        """KMock's own object search (name-mangled), a lookup by key for one named object when lean."""
        if not (self.lean and strict and request.name is not None and request.resource is not None):
            found: list[Any] = super()._KubernetesEmulator__get_objs(request, strict)  # type: ignore[misc]
            return found
        obj = self._objects._objects.get((request.resource, request.namespace, request.name))
        return [] if obj is None else [obj]

    def _stamp(self, request: rendering.Request) -> None:
        data = request.data
        if request.action == enums.action.CREATE and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["generation"] = 1
        elif request.action == enums.action.UPDATE and isinstance(data, dict) and "spec" in data:
            key = (request.resource, request.namespace, request.name)
            current = (
                self._objects[key]
                if request.name and request.subresource != "status" and key in self._objects
                else None
            )
            if current is not None and not current.deleted:
                generation = int(current.get("metadata", {}).get("generation", 1))
                data.setdefault("metadata", {})["generation"] = generation + 1

    def _record(self, resource: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Give the changed object the next resourceVersion; keep the event for resumed watches."""
        self._revision += 1
        obj = event.get("object", {})
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta["resourceVersion"] = str(self._revision)  # the stored object shares this dict
        recorded = {"type": event["type"], "object": copy.deepcopy(obj)}
        self._history.append((self._revision, resource, recorded))
        return recorded

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_list(request)
        assert isinstance(payload, dict)
        payload["metadata"] = {"resourceVersion": str(self._revision)}
        return payload

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        since = request.params.get("resourceVersion")
        if not since or not since.isdigit():
            async for item in super()._serve_watch(request):
                yield item
            return
        yield b""
        assert request.resource is not None
        bus = self._buses[request.resource]
        async with self._lock:  # no event can be put between the snapshot and the mark
            missed = [ev for rev, res, ev in self._history if rev > int(since) and res == request.resource]
            marker = await bus.mark()
        try:
            for event in missed:
                if self._matches(request, event):
                    yield event
            async for event in bus.stream(since=marker):
                if self._matches(request, event):
                    yield event
        finally:
            await bus.unmark(marker)

    @staticmethod
    def _matches(request: rendering.Request, event: dict[str, Any]) -> bool:
        meta = event.get("object", {}).get("metadata", {})
        namespace_ok = request.namespace is None or meta.get("namespace") == request.namespace
        name_ok = request.name is None or meta.get("name") == request.name
        return namespace_ok and name_ok
