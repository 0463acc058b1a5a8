"""KMock without the bookkeeping only assertions need: the benchmark's emulator (bench/operator.py).

KMock 0.8 keeps a log of every request and, for each request, walks that log once per reaction it
tries; it finds an object by scanning every object it holds; it puts a server-side traceback in
the body of each 404 and 409. Over the few hundred requests of bench/operator.py that is
quadratic: measured 21-27 CPU-seconds for 50 resources instead of about 2. :class:`LeanEmulator`
(the tests' :class:`Emulator` plus these shortcuts) keeps no request log (while KMock matches a
request the log holds that request only), remembers the matching reaction per kind of request,
reads and writes one object by key, and answers errors without tracebacks.

Unlike the tests' emulator this reaches into KMock's internals (its reactions, its request log,
its object store), which is why it lives with the benchmark and refuses any KMock but the version
it was written against. ``tests/component/operator/test_children.py`` checks that the operator
sees the same world through it.
"""

from __future__ import annotations

import contextvars
import importlib.metadata
from typing import Any

import aiohttp.web
import attrs
import kmock

from tests.component.operator.emulator import Emulator

KMOCK_VERSION = "0.8"
if importlib.metadata.version("kmock") != KMOCK_VERSION:
    raise ImportError(
        f"bench/kmock_lean.py relies on KMock {KMOCK_VERSION}'s internals; "
        f"found {importlib.metadata.version('kmock')}: check it against the new version"
    )

# The request that the current task (one per HTTP request, in aiohttp) is handling.
_handling: contextvars.ContextVar[kmock.Request] = contextvars.ContextVar("_handling")


class _OwnRequestOnly(list[kmock.Request]):
    """A request log that records nothing; iterated, it holds the caller's own request only.

    KMock decides whether a reaction applies by checking that the request is among those its
    filters let through from the log; that answer is the same when the log holds just the request.
    """

    def append(self, request: kmock.Request) -> None:
        pass

    def __iter__(self) -> Any:
        request = _handling.get(None)
        return iter(() if request is None else (request,))


class _RememberedDispatch(kmock.RawHandler):
    """KMock's reaction matching, remembered per kind of request.

    KMock tries its reactions in priority order and serves the first whose filters let the request
    through: over a dozen filter checks per request. The emulator's own reactions are fixed, always
    answer (never disabled or depleted), and depend on the method, the action and (outside the
    resources) the path only, so the first match for a kind of request is the match for all of
    that kind. Hence this is for a bare emulator: no reactions of one's own.
    """

    __slots__ = ()

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        remembered: dict[Any, Any] = self._remembered  # type: ignore[attr-defined]
        key = (request.method, request.action, request.subresource, None if request.resource else request.url.path)
        payload = remembered.get(key)
        if payload is None:
            for candidate in sorted(self._payloads, key=_order):
                if request in candidate._source:
                    payload = remembered[key] = candidate
                    break
            else:
                return await super()._handle(request)  # KMock's own answer to the unmatched
        return await payload(request)  # type: ignore[no-any-return]


def _order(payload: Any) -> tuple[float, ...]:
    """KMock's order of reactions: highest priority first, priorities padded with zeros."""
    return tuple(-p for p in payload.priorities) + (0,) * (8 - len(payload.priorities))


@attrs.define(kw_only=True)
class LeanEmulator(Emulator, _RememberedDispatch):
    """The tests' emulator with KMock's assertion bookkeeping trimmed (see the module docstring)."""

    _remembered: dict[Any, Any] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._requests = _OwnRequestOnly()

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        _handling.set(request)  # this task's own (each aiohttp request runs in a task of its own)
        return await super()._handle(request)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if not isinstance(exc, kmock.KubernetesError):
            return await super()._render_error(exc)
        body = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": exc.status}
        body.update(reason=exc.reason or type(exc).__name__, message=exc.message or repr(exc))
        body["details"] = exc.details or {}
        return aiohttp.web.json_response(body, status=exc.status)

    def _KubernetesEmulator__get_objs(self, request: kmock.Request, strict: bool) -> list[Any]:
        """KMock's own object search (name-mangled), a lookup by key for one named object."""
        if not (strict and request.name is not None and request.resource is not None):
            found: list[Any] = super()._KubernetesEmulator__get_objs(request, strict)  # type: ignore[misc]
            return found
        obj = self._objects._objects.get((request.resource, request.namespace, request.name))
        return [] if obj is None else [obj]
