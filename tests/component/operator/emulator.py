"""A KMock Kubernetes emulator close enough to a real API server for kopf and ringseed's operator.

KMock 0.8 stores objects but gives them no ``uid``, ``resourceVersion``, ``generation`` or
``creationTimestamp``, and every watch replays all objects (so an object that exists before the
operator starts is seen twice). This subclass fixes what the operator relies on:

- create stamps ``uid``, ``creationTimestamp`` and ``generation: 1``;
- a patch that touches ``spec`` (not through ``/status``) bumps ``generation``;
- every change gets the next ``resourceVersion`` (one global counter, as in etcd);
- a list answers with the current ``resourceVersion``; a watch that carries
  ``resourceVersion=N`` replays only the changes after ``N`` (kept in a bounded history), then
  streams live ones, so nothing is lost between kopf's list and its watch and nothing is
  seen twice.

Built on KMock's public API only (names from ``kmock``): it subclasses ``KubernetesEmulator`` as
KMock's docstring invites ("inherit and implement for your cases") and overrides its request
hook (``_handle``), its list and watch answers (``_serve_list``, ``_serve_watch``), and gives it
event buses (``kmock.Bus``) that stamp each event as it is put. ``bench/kmock_lean.py`` adds the
benchmark's shortcuts, which do reach into KMock's internals, on top of this class.

Used by the component tests (``@pytest.mark.kmock(cls=Emulator)``) and by ``bench/operator.py``.
"""

from __future__ import annotations

import collections
import copy
import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import kmock

HISTORY_LIMIT = 100_000


@attrs.mutable(weakref_slot=True)
class RecordingBus(kmock.Bus[Any]):
    """A KMock event bus that lets the emulator stamp and record each event as it is put."""

    on_put: Any = None

    async def put(self, *items: Any) -> None:
        if self.on_put is not None:
            items = tuple(self.on_put(item) for item in items)
        await super().put(*items)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """KMock's emulator with uids, generations, resource versions and resumable watches."""

    _revision: int = attrs.field(default=0, init=False)
    _history: collections.deque[tuple[int, Any, dict[str, Any]]] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY_LIMIT), init=False
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = collections.defaultdict(RecordingBus)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None:
            bus = self._buses[request.resource]
            if isinstance(bus, RecordingBus) and bus.on_put is None:
                resource = request.resource
                bus.on_put = lambda event: self._record(resource, event)
            self._stamp(request)
        return await super()._handle(request)

    def _stamp(self, request: kmock.Request) -> None:
        data = request.data
        if request.action == kmock.action.CREATE and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["generation"] = 1
        elif request.action == kmock.action.UPDATE and isinstance(data, dict) and "spec" in data:
            key = (request.resource, request.namespace, request.name)
            current = (
                self.objects[key] if request.name and request.subresource != "status" and key in self.objects else None
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

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        payload = await super()._serve_list(request)
        assert isinstance(payload, dict)
        payload["metadata"] = {"resourceVersion": str(self._revision)}
        return payload

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
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
    def _matches(request: kmock.Request, event: dict[str, Any]) -> bool:
        meta = event.get("object", {}).get("metadata", {})
        namespace_ok = request.namespace is None or meta.get("namespace") == request.namespace
        name_ok = request.name is None or meta.get("name") == request.name
        return namespace_ok and name_ok
