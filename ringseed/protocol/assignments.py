"""Origin assignments: which node pulls which chunk from the origin, since when, and when a puller is stuck.

Owns the bookkeeping of origin pulls for the tracker (:mod:`ringseed.protocol.tracker` decides
who may pull and what happens to a stuck puller). Pure: no I/O; time is the ``now`` argument.

Rules:
- A chunk is assigned to one puller at a time, with the time it was assigned. The assignment
  ends when any node announces the chunk (the first verified copy), or when it is released
  (its puller left origin duty, went silent, or is stuck).
- The origin rate is learned from completed pulls: a pull's service time runs from the later
  of its assignment and its puller's previous completion to its completion, and
  ``rate = bytes / service time``, smoothed (each new sample weighs ``1/4``). Before the first
  completion the rate is taken to be ``ASSUMED_RATE``.
- A puller makes progress when one of its pulls completes or when its count of bytes read from
  the origin grows (its heartbeats report it): a slow pull that moves is never stuck.
- A puller with open assignments is *stuck* once ``now`` passes its deadline: the later of its
  last progress and its oldest open assignment, plus ``factor`` times the expected duration of
  a chunk (``chunk_bytes / rate``), plus ``slack``. The tracker then hands its chunks on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

ASSUMED_RATE = 10e6  # bytes/s, until the first pull completes
FACTOR = 4.0
SMOOTHING = 0.25


@dataclass(frozen=True)
class Pull:
    node: str
    at: float  # when it was assigned


class Assignments:
    """Open origin assignments (chunk -> pull), the learned origin rate, each puller's progress."""

    def __init__(self, *, factor: float = FACTOR, slack: float = 10.0, assumed_rate: float = ASSUMED_RATE) -> None:
        self.factor = factor
        self.slack = slack
        self.rate: float | None = None
        self.assumed_rate = assumed_rate
        self._open: dict[int, Pull] = {}
        self._progress: dict[str, float] = {}  # puller -> last progress
        self._done: dict[str, float] = {}  # puller -> last completion

    def __contains__(self, index: int) -> bool:
        return index in self._open

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[int]:
        return iter(self._open)

    def split(self, indices: Iterable[int]) -> tuple[list[int], list[int]]:
        """``indices`` (repeats allowed) split into those pulled now and the others, each sorted."""
        changed = set(indices)
        open_now = changed & self._open.keys()
        return sorted(open_now), sorted(changed - open_now)

    def puller(self, index: int) -> str | None:
        pull = self._open.get(index)
        return pull.node if pull is not None else None

    def of(self, node: str) -> list[int]:
        """Open assignments of ``node``, in index order."""
        return sorted(i for i, p in self._open.items() if p.node == node)

    def as_dict(self) -> dict[int, str]:
        return {i: p.node for i, p in self._open.items()}

    def assign(self, index: int, node: str, *, now: float) -> None:
        self._open[index] = Pull(node=node, at=now)

    def complete(self, index: int, *, node: str, now: float, nbytes: int) -> str | None:
        """``node`` announced ``index``: the assignment ends; returns its puller (None if none was open).

        When the puller itself announced it, the pull's service time feeds the rate."""
        pull = self._open.pop(index, None)
        if pull is None:
            return None
        if pull.node == node:
            started = max(pull.at, self._done.get(node, pull.at))
            if now > started and nbytes > 0:
                sample = nbytes / (now - started)
                self.rate = sample if self.rate is None else (1 - SMOOTHING) * self.rate + SMOOTHING * sample
            self._done[node] = now
            self._progress[node] = now
        return pull.node

    def release(self, index: int) -> str | None:
        pull = self._open.pop(index, None)
        return pull.node if pull is not None else None

    def release_all_but(self, keep: Collection[str]) -> list[int]:
        """Release the assignments of every puller not in ``keep``; returns the chunks released."""
        gone = [i for i, p in self._open.items() if p.node not in keep]
        for index in gone:
            del self._open[index]
        return gone

    def progressed(self, node: str, *, now: float) -> None:
        """``node`` read bytes from the origin since its last report."""
        self._progress[node] = now

    def forget(self, node: str) -> None:
        """``node`` left: its progress record goes (its assignments are released by the caller)."""
        self._progress.pop(node, None)
        self._done.pop(node, None)

    def expected(self, chunk_bytes: int) -> float:
        """Seconds one chunk of ``chunk_bytes`` is expected to take from the origin."""
        rate = self.rate if self.rate is not None and self.rate > 0 else self.assumed_rate
        return chunk_bytes / rate

    def deadline(self, node: str, *, chunk_bytes: int) -> float | None:
        """When ``node`` counts as stuck (None while it has no open assignment)."""
        oldest = min((p.at for p in self._open.values() if p.node == node), default=None)
        if oldest is None:
            return None
        start = max(oldest, self._progress.get(node, oldest))
        return start + self.factor * self.expected(chunk_bytes) + self.slack

    def stuck(self, *, now: float, chunk_bytes: int) -> list[str]:
        """Pullers past their deadline, by name (O(open assignments))."""
        oldest: dict[str, float] = {}
        for pull in self._open.values():
            if pull.at < oldest.get(pull.node, float("inf")):
                oldest[pull.node] = pull.at
        allowance = self.factor * self.expected(chunk_bytes) + self.slack
        return sorted(node for node, at in oldest.items() if now > max(at, self._progress.get(node, at)) + allowance)
