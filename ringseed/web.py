"""Shared HTTP plumbing for every ringseed server (master, agent): auth, errors, limits, metrics.

Rules every endpoint follows:
- Every request carries ``Authorization: Bearer <token>``; a missing or wrong token gets 401.
  Paths in ``public_paths`` (health probes) are exempt.
- Every error is JSON ``{"error": <short code>, "reason": <sentence a user can act on>}``.
- Request bodies are capped (``max_body_bytes``); a bigger body gets 413 with a reason.
- ``read_json`` parses a body into a dict and names the problem when it is not JSON or not an object.
  Numbers are bounded at parse time: integers of more than ``MAX_INT_DIGITS`` digits, ``NaN``,
  ``Infinity`` and floats that overflow are refused (400), so no number a client sends can break
  a later computation or rendering. ``field_of``, ``integer`` and ``text`` check single fields
  (type, range, length, pattern) and name the field in the 400.
- Domain errors become JSON in one place: ``make_app(errors={ExceptionType: status})`` maps an
  exception a handler lets out to that status (or to ``status(exc)`` when a callable is given),
  with ``exc.code`` as the error code; handlers never catch their own domain errors.
- A malformed request (bad HTTP framing, a broken body) costs one debug line, never an ERROR
  with a traceback: an unauthenticated client must not be able to flood the log.
- ``/metrics`` is rendered from a :class:`Metrics` in the Prometheus text format.
- A replicated master (a leader and a follower) answers on a follower with 503 ``not_leader``
  and the leader's URL in ``LEADER_HEADER``; its clients reach the leader through
  :class:`Leaders` (the one rule for every client of a replicated master).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import http_exceptions, web

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

DEFAULT_MAX_BODY_BYTES = 1 << 20
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
MAX_INT_DIGITS = 20  # any 64-bit integer fits; anything longer is refused while parsing
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (MAX_INT_DIGITS + 1))  # a body that may hold a too-long integer
ErrorMap = Mapping[type[Exception], int | Callable[[Exception], int]]
LEADER_HEADER = "X-Ringseed-Leader"


class HTTPProblem(web.HTTPException):
    """An HTTP error whose body is JSON with a machine code and a human reason."""

    def __init__(self, status: int, error: str, reason: str, *, headers: Mapping[str, str] | None = None) -> None:
        self.status_code = status
        super().__init__(
            headers=headers,
            text=json.dumps({"error": error, "reason": reason}),
            content_type="application/json",
        )


def problem(status: int, error: str, reason: str, *, headers: Mapping[str, str] | None = None) -> HTTPProblem:
    """Build (not raise) a JSON HTTP error: ``raise problem(400, "bad_request", "...")``."""
    return HTTPProblem(status, error, reason, headers=headers)


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value:
        return None
    return value.strip()


def token_ok(presented: str | None, expected: str) -> bool:
    """Constant-time token comparison."""
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def auth_middleware(token: str, *, public_paths: Iterable[str] = PUBLIC_PATHS) -> Any:
    """Reject any request without the group's bearer token (401, JSON reason)."""
    public = frozenset(public_paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in public and not token_ok(_bearer(request), token):
            raise problem(
                401,
                "unauthorized",
                "missing or wrong bearer token for this group",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    return middleware


def error_middleware(errors: ErrorMap | None = None) -> Any:
    """Turn every error into JSON with a reason; never let a handler's bug kill the server.

    ``errors`` maps domain exceptions (and their subclasses; the first match wins) to a status."""
    table = dict(errors or {})

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except HTTPProblem:
            raise
        except web.HTTPRequestEntityTooLarge as exc:
            raise _too_large(request) from exc
        except web.HTTPException as exc:
            if exc.status_code < 400:
                raise
            kept = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
            code = exc.reason.lower().replace(" ", "_")
            raise problem(exc.status_code, code, exc.text or exc.reason, headers=kept) from exc
        except http_exceptions.HttpProcessingError as exc:
            raise _malformed(request, exc) from exc
        except Exception as exc:
            status = _mapped(table, exc)
            if status is not None:
                raise problem(status, str(getattr(exc, "code", "bad_request")), str(exc)) from exc
            log.exception("Handler failed for %s %s", request.method, request.path)
            raise problem(500, "internal", f"internal error: {type(exc).__name__}") from exc

    return middleware


def _mapped(table: ErrorMap, exc: Exception) -> int | None:
    for kind, status in table.items():
        if isinstance(exc, kind):
            return status(exc) if callable(status) else status
    return None


def _malformed(request: web.Request, exc: http_exceptions.HttpProcessingError) -> HTTPProblem:
    log.debug("Malformed request %s %s from %s: %s", request.method, request.path, request.remote, _one_line(exc))
    return problem(400, "bad_request", f"malformed request: {_one_line(exc)}")


def _one_line(exc: http_exceptions.HttpProcessingError) -> str:
    return " ".join(str(exc.message or type(exc).__name__).split())[:200]


class _QuietMalformed(logging.Filter):
    """On aiohttp's server logger: a malformed request becomes one debug line, not an ERROR traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            log.debug("Malformed request refused: %s", _one_line(exc))
            return False
        return True


_QUIET = _QuietMalformed()


def _too_large(request: web.Request) -> HTTPProblem:
    limit = request.app._client_max_size
    return problem(413, "body_too_large", f"request body exceeds the limit of {limit} bytes")


async def read_json(request: web.Request) -> dict[str, Any]:
    """Read a JSON object body; 400 naming the problem when it is not one (see the module rules)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise _too_large(request) from exc
    except http_exceptions.HttpProcessingError as exc:
        raise _malformed(request, exc) from exc
    # Integers are checked one by one only when the body has a long run of digits somewhere (a
    # Python call per integer is most of the cost of a big heartbeat); else none can be too long.
    decoder = _DECODE_CHECKED if _LONG_DIGITS.search(raw) else _DECODE
    try:
        body = decoder(raw.decode(json.detect_encoding(raw), "surrogatepass"))  # (as json.loads does bytes)
    except RecursionError as exc:
        raise problem(400, "bad_json", "request body is nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and the number checks
        raise problem(400, "bad_json", f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise problem(400, "bad_body", "request body must be a JSON object")
    return body


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} characters is too large (at most {MAX_INT_DIGITS} digits)")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:32]} is out of range")
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number JSON allows")


# (built once: json.loads with any option builds a decoder a call)
_DECODE = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant).decode
_DECODE_CHECKED = json.JSONDecoder(
    parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
).decode


def field_of(
    body: Mapping[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    *,
    required: bool = True,
    label: str | None = None,
) -> Any:
    """Return ``body[name]`` checked against ``kind``; 400 naming the field (or ``label``, for a
    nested one: ``"field 'problem.reason'"``) otherwise."""
    label = label or f"field {name!r}"
    if name not in body:
        if required:
            raise problem(400, "missing_field", f"{label} is required")
        return None
    value = body[name]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise problem(400, "bad_field", f"{label} must be {_kind_name(kind)}, not a boolean")
    if not isinstance(value, kind):
        raise problem(400, "bad_field", f"{label} must be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def integer(
    body: Mapping[str, Any], name: str, *, low: int, high: int, default: int | None = None, label: str | None = None
) -> int:
    """``body[name]`` as an integer in ``[low, high]`` (required unless ``default`` is given);
    400 naming the field (or ``label``) otherwise."""
    if name not in body and default is not None:
        return default
    return bounded(body.get(name), label or f"field {name!r}", low=low, high=high, present=name in body)


def bounded(value: Any, label: str, *, low: int, high: int, present: bool = True) -> int:
    """``value`` checked to be an integer (not a boolean) in ``[low, high]``; 400 naming ``label``."""
    if not present:
        raise problem(400, "missing_field", f"{label} is required")
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise problem(400, "bad_field", f"{label} must be an integer from {low} to {high}")
    return value


def text(
    body: Mapping[str, Any],
    name: str,
    *,
    max_length: int,
    pattern: re.Pattern[str] | None = None,
    required: bool = True,
    what: str = "",
    label: str | None = None,
) -> str | None:
    """``body[name]`` as a string of 1 to ``max_length`` characters (matching ``pattern``, described
    by ``what``); None when absent and not required; 400 naming the field (or ``label``) otherwise."""
    label = label or f"field {name!r}"
    value: str | None = field_of(body, name, str, required=required, label=label)
    if value is None:
        return None
    if not 0 < len(value) <= max_length:
        raise problem(400, "bad_field", f"{label} must be 1 to {max_length} characters")
    if pattern is not None and pattern.fullmatch(value) is None:
        raise problem(400, "bad_field", f"{label} must be {what or 'of the form ' + pattern.pattern}")
    return value


def make_app(
    *,
    token: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    public_paths: Iterable[str] = PUBLIC_PATHS,
    errors: ErrorMap | None = None,
) -> web.Application:
    """An aiohttp application with ringseed's error, auth and body-limit rules, and /healthz;
    ``errors`` maps domain exceptions to statuses (see the module rules)."""
    server_log = logging.getLogger("aiohttp.server")
    if _QUIET not in server_log.filters:
        server_log.addFilter(_QUIET)
    app = web.Application(
        client_max_size=max_body_bytes,
        middlewares=[error_middleware(errors), auth_middleware(token, public_paths=public_paths)],
    )
    app.router.add_get("/healthz", _healthz)
    return app


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


@dataclass
class Metrics:
    """A minimal Prometheus text-format registry: counters and gauges, optional labels."""

    prefix: str = "ringseed"
    _help: dict[str, tuple[str, str]] = field(default_factory=dict)
    _values: dict[str, dict[tuple[tuple[str, str], ...], float]] = field(default_factory=dict)

    def declare(self, name: str, kind: str, help_text: str) -> None:
        self._help[name] = (kind, help_text)
        self._values.setdefault(name, {})

    def set(self, name: str, value: float, **labels: str) -> None:
        self._values.setdefault(name, {})[tuple(sorted(labels.items()))] = float(value)

    def clear(self, name: str) -> None:
        """Drop every series of ``name`` (before setting the ones that exist now)."""
        self._values[name] = {}

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        series = self._values.setdefault(name, {})
        key = tuple(sorted(labels.items()))
        series[key] = series.get(key, 0.0) + amount

    def render(self) -> str:
        lines: list[str] = []
        for name, series in sorted(self._values.items()):
            full = f"{self.prefix}_{name}"
            kind, help_text = self._help.get(name, ("gauge", name))
            lines.append(f"# HELP {full} {help_text}")
            lines.append(f"# TYPE {full} {kind}")
            for labels, value in sorted(series.items()):
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{full}{{{label_text}}} {value:g}" if label_text else f"{full} {value:g}")
        return "\n".join(lines) + "\n"

    def handler(self, refresh: Callable[[], None] | None = None) -> Handler:
        async def metrics(request: web.Request) -> web.StreamResponse:
            if refresh is not None:
                refresh()
            return web.Response(text=self.render(), content_type="text/plain", charset="utf-8")

        return metrics


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _reason(text: str) -> str:
    """``": <reason>"`` of a JSON problem body (:func:`problem`), else nothing."""
    try:
        body = json.loads(text)
    except ValueError:
        return ""
    return f": {body['reason']}" if isinstance(body, dict) and isinstance(body.get("reason"), str) else ""


class NoLeader(Exception):
    """No URL of a replicated master answered as its leader; the message lists what each said."""


class Leaders:
    """The URLs of a replicated master, for its clients: which to call, in which order.

    A call goes to the URL that last answered as leader first, then to the others in the order
    given. A 503 naming the leader (``LEADER_HEADER``; a pod's URL need not be among those given,
    a Service in a cluster) is tried next; a connection error or any 5xx moves on to the next
    URL. When every URL failed, :class:`NoLeader` (the caller retries later)."""

    def __init__(self, urls: Iterable[str]) -> None:
        self.urls = [u.rstrip("/") for u in urls if u.strip()]
        if not self.urls:
            raise ValueError("at least one master URL is needed")
        self.leader = self.urls[0]

    async def call(self, attempt: Callable[[str], Awaitable[tuple[int, str, str | None]]]) -> tuple[int, str]:
        """``attempt(url)`` -> (status, body, leader hint); the first answer that is not a 5xx."""
        tried: list[str] = []
        candidates = [self.leader, *[u for u in self.urls if u != self.leader]]
        problems: list[str] = []
        while candidates:
            url = candidates.pop(0)
            if url in tried:
                continue
            tried.append(url)
            try:
                status, text, hint = await attempt(url)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                problems.append(f"{url}: {type(exc).__name__}: {exc}")
                continue
            if status >= 500:
                problems.append(f"{url}: HTTP {status}{_reason(text)}")
                if hint and hint.rstrip("/") not in tried:
                    candidates.insert(0, hint.rstrip("/"))
                continue
            self.leader = url
            return status, text
        raise NoLeader("; ".join(problems))


def background(
    run: Callable[[], Coroutine[Any, Any, None]], *, after: Callable[[], Awaitable[None] | None] | None = None
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context: ``run()`` as a task while the app runs; at cleanup the task is
    cancelled and awaited, then ``after()`` (awaited when it returns an awaitable)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if after is not None:
            result = after()
            if inspect.isawaitable(result):
                await result

    return ctx
