"""Heartbeat pacing: the tracker names how often agents may call it, scaled to what it can serve.

Pure: no I/O; time is the ``now`` argument (seconds, any monotonic origin).

Two sides:
- :class:`Budget` (the tracker): a swarm of ``nodes`` agents is told a regular heartbeat
  ``interval`` and the least ``gap`` between two heartbeats of one agent (an agent heartbeats
  early when it has news: a verified chunk to announce, a drop, a problem), so that the swarm
  sends at most ``rate`` heartbeats per second, whatever it does: ``gap = max(base gap,
  nodes / rate)``, ``interval = max(base interval, gap)``. The few nodes on origin duty keep
  the base gap (the hashes they announce are what streaming receivers wait for), and so do
  the ``front_seats`` nodes that most recently announced a chunk then held by at most
  :data:`FRONT_HOLDERS` nodes (the front of the pipeline, where a holder known a gap late
  slows every later copy): together they add at most ``(seeders + front_seats) / base gap``
  heartbeats per second to the budget. An agent told
  an interval may be silent that long, so once the pace is slower than the base one, a node
  counts as offline only after :data:`FACTOR` (3) times the largest interval still in force
  (told less than 3 such intervals ago) if that is longer than the configured silence
  (:meth:`Budget.silence`): the purge rule follows the pace, with no window in which a slower
  pace already told makes live nodes look silent. A swarm small enough for the base pace keeps
  the configured silence exactly.
  A scaled pace is *jittered* (``jitter``, the master's default :data:`DEFAULT_JITTER`): each
  reply's gap is ``nodes / rate`` times a factor drawn uniformly from ``[1 - jitter, 1 +
  jitter]`` (and the interval follows it: never below the base pace), so the mean stays the
  nominal one (the budget holds on average) while the phases of the agents drift apart: agents that registered
  while the swarm was small learned short intervals and started together, and without jitter
  they keep heartbeating in waves above the budget (BENCHMARKS section 9, session 5: at 5,000
  agents 1,900 heartbeats due in one second and 117 in another); with a factor as wide as half
  the interval either side, one heartbeat spreads a node's phase over a whole interval.
- :class:`Pacer` (the agent): when the next heartbeat is due; the regular one ``interval``
  after the last, an early one (news waiting) no sooner than ``gap`` after the last. It takes
  the values from every reply that names them and keeps the last ones otherwise (a master of an
  older release names none).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DEFAULT_RATE = 1000  # heartbeats/s a swarm is paced to: ~0.3 of a core of per-request cost (BENCHMARKS section 9)
DEFAULT_GAP = 0.05  # seconds between a node's early heartbeats in a small swarm (the agent's old 50 ms)
DEFAULT_FRONT_SEATS = 8  # nodes at the front of the pipeline that keep the base gap (BENCHMARKS section 3)
FRONT_HOLDERS = 4  # a chunk held by at most this many nodes is at the front
FACTOR = 3.0  # offline after this many intervals in force
DEFAULT_JITTER = 0.5  # a scaled pace is the nominal one times U(1 - jitter, 1 + jitter): phases spread in one beat
MIN_GAP = 0.01  # seconds; the least gap an agent accepts from a reply (bounds a bad reply)
MAX_INTERVAL = 300.0  # seconds; the largest interval an agent accepts from a reply


@dataclass(frozen=True)
class Pace:
    """What one node is told: heartbeat every ``interval`` seconds, early ones no sooner than
    ``gap`` after the last."""

    interval: float
    gap: float


class Budget:
    """The tracker's side: the pace of a swarm and the silence it implies.

    ``rate``: heartbeats per second the tracker aims to serve (None: no scaling, every node is
    told the base pace, the behaviour before pacing); ``jitter``: the spread of a scaled pace
    (0: none; it needs ``rng``, the source of the factors)."""

    def __init__(
        self,
        *,
        interval: float,
        gap: float,
        rate: float | None = None,
        front_seats: int = 0,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError("the heartbeat rate budget must be positive")
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"the pace jitter must be at least 0 and below 1, not {jitter}")
        if jitter and rng is None:
            raise ValueError("a jittered pace needs a random source (rng)")
        self.base = Pace(interval=interval, gap=min(gap, interval))
        self.rate = rate
        self.jitter = jitter
        self.rng = rng
        self.front_seats = max(0, front_seats)
        self.front: dict[str, None] = {}  # the nodes on front seats, least recent first
        self._told = self.base.interval  # the largest interval in force ...
        self._told_until = 0.0  # ... until then (a node told it is offline if silent by then)

    def pace(self, *, nodes: int, duty: bool = False, node: str | None = None) -> Pace:
        """The pace of ``node`` in a swarm of ``nodes`` (``duty``: it holds origin duty); a
        scaled one jittered (one draw per call: per reply)."""
        if self.rate is None:
            return self.base
        gap = nodes / self.rate
        if self.jitter and gap > self.base.gap:
            assert self.rng is not None
            gap *= self.rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)
        gap = max(self.base.gap, gap)
        interval = max(self.base.interval, gap)
        return Pace(interval=interval, gap=self.base.gap if duty or node in self.front else gap)

    def rare_copy(self, node: str) -> None:
        """``node`` announced a chunk held by at most :data:`FRONT_HOLDERS` nodes: it takes a
        front seat (the least recent holder of one gives it up)."""
        if self.front_seats:
            self.front.pop(node, None)
            self.front[node] = None
            while len(self.front) > self.front_seats:
                del self.front[next(iter(self.front))]

    def forget(self, node: str) -> None:
        """``node`` left the swarm."""
        self.front.pop(node, None)

    def told(self, pace: Pace, *, now: float) -> Pace:
        """Record that a node was told ``pace`` now (it heartbeats again within its interval)."""
        until = now + FACTOR * pace.interval  # a node told it now may be silent that long
        if pace.interval > self._told or now > self._told_until:
            self._told, self._told_until = pace.interval, until
        elif pace.interval == self._told:
            self._told_until = max(self._told_until, until)
        return pace

    def silence(self, *, now: float) -> float:
        """The least silence after which a node may count as offline now: :data:`FACTOR` times
        the largest interval in force while that is slower than the base pace, else 0 (the
        configured ``offline_after`` rules)."""
        told = self._told if now <= self._told_until else self.base.interval
        return FACTOR * told if told > self.base.interval else 0.0


class Pacer:
    """The agent's side: when its next heartbeat is due."""

    def __init__(self, *, interval: float, gap: float) -> None:
        self.interval = interval
        self.gap = min(gap, interval)
        self.last = -float("inf")

    def follow(self, *, interval: object, gap: object) -> None:
        """Take the pace a reply named (values that are missing or not numbers are ignored;
        the rest are bounded to ``[MIN_GAP, MAX_INTERVAL]``)."""
        if isinstance(interval, int | float) and not isinstance(interval, bool) and interval > 0:
            self.interval = min(MAX_INTERVAL, max(MIN_GAP, float(interval)))
        if isinstance(gap, int | float) and not isinstance(gap, bool) and gap >= 0:
            self.gap = max(MIN_GAP, float(gap))
        self.gap = min(self.gap, self.interval)

    def sent(self, *, now: float) -> None:
        """A heartbeat left now."""
        self.last = now

    def due(self, *, now: float, news: bool) -> float:
        """Seconds until the next heartbeat is due (0: now): ``gap`` after the last with news
        waiting, else ``interval`` after it."""
        return max(0.0, self.last + (self.gap if news else self.interval) - now)
