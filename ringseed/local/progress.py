"""Progress of a local distribution: per-node bytes, nodes done, rates and an honest ETA.

Owns the numbers ``ringseed local distribute`` shows while it runs, computed from the tracker's
``/v1/status`` bodies and the time each was read (an argument: the model is pure and tested with a
fake clock). The displays in :mod:`ringseed.local.display` only draw a :class:`View`.

Rules:
- Bytes are per node against the model size (never summed over nodes next to the model size);
  the cluster line counts nodes holding a verified copy as they finish, not at the end.
- Rates are measured over the last ``window`` seconds of samples: per node, the cluster's sum,
  and the origin (bytes pulled from the source).
- ETA is the later of two bounds: the swarm bound (bytes still missing on all nodes over the
  cluster rate) and the origin bound (model bytes no node holds yet over the origin rate; the
  rate limit when one is set and the measured rate is higher or unknown). While no byte moved
  for ``stall_after`` seconds and copies are missing, the ETA is "stalled" (with for how long),
  never 0 s; before two samples it is unknown.
- A node's state is its tracker-reported problem (``reason``) when it has one, else
  verified / offline / origin (on origin duty) / waiting (no layout yet) / fetching.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

WINDOW_S = 5.0
STALL_AFTER_S = 10.0


@dataclass(frozen=True)
class NodeRow:
    name: str
    bytes: int
    total: int
    rate: float  # bytes/s over the window
    state: str  # verified | fetching | origin | waiting | offline | a problem reason
    message: str  # the problem's message, or ""

    @property
    def verified(self) -> bool:
        return self.state == "verified"


@dataclass(frozen=True)
class View:
    elapsed: float
    model_bytes: int  # 0 until the layout is known
    nodes: tuple[NodeRow, ...]
    verified: int
    rate: float  # bytes/s delivered to all nodes together
    origin_bytes: int
    origin_rate: float
    eta: float | None  # seconds; None while unknown or stalled
    stalled_for: float  # seconds without progress (0 while moving)

    @property
    def delivered(self) -> int:
        return sum(n.bytes for n in self.nodes)

    @property
    def eta_text(self) -> str:
        if self.model_bytes and self.verified == len(self.nodes) and self.nodes:
            return "done"
        if self.stalled_for >= STALL_AFTER_S:
            return f"stalled {self.stalled_for:.0f}s"
        if self.eta is None:
            return "?"
        return format_seconds(self.eta)


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    s = max(0, math.ceil(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(frozen=True)
class _Sample:
    at: float
    nodes: dict[str, int]
    origin: int


class Progress:
    """Feed it status bodies with their time; ask for the :class:`View`."""

    def __init__(
        self,
        *,
        names: list[str],
        started: float,
        rate_limit: float | None = None,
        window: float = WINDOW_S,
        stall_after: float = STALL_AFTER_S,
    ) -> None:
        self.names = list(names)
        self.started = started
        self.rate_limit = rate_limit
        self.window = window
        self.stall_after = stall_after
        self.status: dict[str, Any] = {}
        self._samples: deque[_Sample] = deque()
        self._last_move = started
        self._last_total = -1

    def update(self, status: dict[str, Any], *, now: float) -> None:
        self.status = status
        nodes = status.get("nodes", {})
        sample = _Sample(
            at=now,
            nodes={n: int(nodes.get(n, {}).get("bytes", 0)) for n in self.names},
            origin=int(status.get("bytes_from_origin", 0)),
        )
        moved = sum(sample.nodes.values()) + sample.origin
        if moved != self._last_total:
            self._last_total = moved
            self._last_move = now
        self._samples.append(sample)
        while len(self._samples) > 2 and now - self._samples[1].at >= self.window:
            self._samples.popleft()

    def view(self, *, now: float) -> View:
        size = int(self.status.get("total_bytes", 0))
        first, last = (self._samples[0], self._samples[-1]) if self._samples else (None, None)
        span = (last.at - first.at) if first is not None and last is not None else 0.0
        rows = tuple(self._row(name, size=size, first=first, last=last, span=span) for name in self.names)
        origin = last.origin if last is not None else 0
        origin_rate = (origin - first.origin) / span if first is not None and span > 0 else 0.0
        verified = sum(1 for r in rows if r.verified)
        done = bool(size) and verified == len(rows)
        stalled = 0.0 if done or not self._samples else now - self._last_move
        return View(
            elapsed=now - self.started,
            model_bytes=size,
            nodes=rows,
            verified=verified,
            rate=sum(r.rate for r in rows),
            origin_bytes=origin,
            origin_rate=max(0.0, origin_rate),
            eta=None if done else self._eta(rows, size=size, origin_rate=origin_rate, span=span),
            stalled_for=stalled,
        )

    def _row(self, name: str, *, size: int, first: _Sample | None, last: _Sample | None, span: float) -> NodeRow:
        entry = self.status.get("nodes", {}).get(name)
        have = last.nodes.get(name, 0) if last is not None else 0
        rate = (have - first.nodes.get(name, 0)) / span if first is not None and span > 0 else 0.0
        state, message = _state(entry, size=size)
        return NodeRow(name=name, bytes=have, total=size, rate=max(0.0, rate), state=state, message=message)

    def _eta(self, rows: tuple[NodeRow, ...], *, size: int, origin_rate: float, span: float) -> float | None:
        if not size or span <= 0:
            return None
        missing = sum(max(0, size - r.bytes) for r in rows)
        rate = sum(r.rate for r in rows)
        swarm = missing / rate if rate > 0 else None
        covered = max([r.bytes for r in rows] + [min(size, int(self.status.get("bytes_from_origin", 0)))])
        from_origin = max(0, size - covered)
        if from_origin == 0:
            return swarm
        pace = origin_rate if origin_rate > 0 else None
        if self.rate_limit:
            pace = min(pace, self.rate_limit) if pace else self.rate_limit
        if pace is None:
            return None
        return max(from_origin / pace, swarm or 0.0)


def _state(entry: dict[str, Any] | None, *, size: int) -> tuple[str, str]:
    if entry is None:
        return "waiting", ""
    if entry.get("reason"):
        return str(entry["reason"]), str(entry.get("message") or "")
    if entry.get("verified"):
        return "verified", ""
    if not entry.get("online", True):
        return "offline", ""
    if not size:
        return "waiting", ""
    return ("origin" if entry.get("origin_duty") else "fetching"), ""
