"""Trust between the nodes of one swarm: who served bad chunks, who served good ones, who is believed.

Owns the evidence the tracker keeps about each node's honesty and the rules that turn it into
judgements. Pure: no I/O; time is the ``now`` argument (seconds, any monotonic origin). The
tracker (:mod:`ringseed.protocol.tracker`) feeds it and applies its :class:`Verdict`; the
simulator drives the same object through the tracker.

Evidence, kept per pair of node names with the time it was last seen:
- a *report* ``(reporter, peer, chunk)``: the reporter received bytes of ``chunk`` from ``peer``
  that failed verification;
- a *vouch* ``(fetcher, peer)``: the fetcher verified a chunk it received from ``peer`` (an
  agent's announcement of a chunk names the node it came from).

Rules (``witnesses`` is K, 2 by default):
- Evidence decays: it counts for ``window`` seconds after it was last seen (a vouch up to
  ``window / 16`` longer), so a transient fault
  or a repaired copy is forgiven, and a liar that lies again is caught again. Evidence is keyed
  by node name, never by registration: re-registering neither clears a penalty nor makes a
  reporter count twice. A node never vouches for or reports itself.
- A reporter is *discredited* when at least K of the peers it reported are contradicted (K other
  nodes vouch for each of them) and those peers outnumber the peers it vouched for itself. A
  receiver whose verification always fails (bad RAM) reports every holder it tries and vouches
  for none: K contradictions discredit it. An honest node that met a liar also vouches for the
  honest peers it fetched from, so it stays credible. Reports of a discredited reporter count
  for nothing.
- A peer is *penalised* when at least K distinct credible reporters reported it within the
  window and they outnumber the distinct nodes that vouched for it: no single reporter can
  remove a peer, and serving verified chunks to others clears a penalty.
- A chunk is *suspect* on a peer when K distinct credible reporters reported that very chunk
  from it: the holder is told (it should check its copy) and stops being listed for the chunk;
  the reports of that pair are then spent, so a re-announced copy starts afresh.
- Memory is bounded: a node's vouchers (and the peers it vouched for) keep the ``cap`` most
  recent; reports are at most one per pair of nodes, and at most ``MAX_CHUNK_REPORTS`` reported
  copies are tracked at once (the least recently reported is forgotten first).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

DEFAULT_WITNESSES = 2
DEFAULT_WINDOW = 600.0  # seconds evidence counts for
DEFAULT_CAP = 32  # vouches remembered per node (a count past that decides nothing)
MAX_CHUNK_REPORTS = 1 << 16  # (peer, chunk) pairs under report at once; the oldest go first


@dataclass(frozen=True)
class Verdict:
    """The judgement at one instant."""

    penalised: frozenset[str] = frozenset()
    discredited: frozenset[str] = frozenset()
    suspect: frozenset[tuple[str, int]] = frozenset()  # (peer, chunk)


@dataclass
class _Ledger:
    """Evidence ``subject -> {other: last seen}``, both directions, bounded per subject."""

    cap: int | None = None
    by_subject: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, subject: str, other: str, now: float) -> None:
        seen = self.by_subject.setdefault(subject, {})
        seen.pop(other, None)  # re-insert: the dict's order is the order of last sight
        seen[other] = now
        if self.cap is not None and len(seen) > self.cap:
            del seen[next(iter(seen))]

    def of(self, subject: str) -> dict[str, float]:
        return self.by_subject.get(subject, {})

    def expire(self, before: float) -> None:
        """Forget what was last seen before ``before``: each subject's entries are in the order
        of last sight (times never go back), so only the expired ones and one more are visited
        (a pass over a big swarm's vouches was one 50 ms stall of the tracker's loop)."""
        for subject in list(self.by_subject):
            seen = self.by_subject[subject]
            for other in list(itertools.takewhile(lambda o: seen[o] < before, seen)):  # noqa: B023 (used at once)
                del seen[other]
            if not seen:
                del self.by_subject[subject]


class Trust:
    """Reports and vouches of one swarm, and the judgement they add up to."""

    def __init__(
        self, *, witnesses: int = DEFAULT_WITNESSES, window: float = DEFAULT_WINDOW, cap: int = DEFAULT_CAP
    ) -> None:
        if witnesses < 2:
            raise ValueError("witnesses must be at least 2: one reporter alone must never remove a peer")
        self.witnesses = witnesses
        self.window = window
        self._reports_on = _Ledger()  # peer -> {reporter: t}
        self._reports_by = _Ledger()  # reporter -> {peer: t}
        self._vouchers_of = _Ledger(cap=cap)  # peer -> {fetcher: t}
        self._vouched_by = _Ledger(cap=cap)  # fetcher -> {peer: t}
        self._chunk_reports: dict[tuple[str, int], dict[str, float]] = {}
        self._vouches_pruned = float("-inf")

    # -- evidence -------------------------------------------------------------------------

    def report(self, *, reporter: str, peer: str, chunk: int, now: float) -> None:
        """``reporter`` got bytes of ``chunk`` from ``peer`` that failed verification."""
        if reporter == peer:
            return
        self._reports_on.add(peer, reporter, now)
        self._reports_by.add(reporter, peer, now)
        seen = self._chunk_reports.pop((peer, chunk), {})
        seen[reporter] = now
        self._chunk_reports[(peer, chunk)] = seen  # re-inserted: the dict's order is the age order
        if len(self._chunk_reports) > MAX_CHUNK_REPORTS:
            del self._chunk_reports[next(iter(self._chunk_reports))]

    def vouch(self, *, fetcher: str, peer: str, now: float) -> bool:
        """``fetcher`` verified a chunk from ``peer``; True when that may change a judgement.

        A pair already seen within ``window / 64`` is not written again (one announcement per
        verified chunk arrives: thousands per second in a big swarm; its decay shifts by 1.6% at most)."""
        if fetcher == peer or self.recent(fetcher=fetcher, peer=peer, now=now):
            return False
        self._vouchers_of.add(peer, fetcher, now)
        self._vouched_by.add(fetcher, peer, now)
        return bool(self._reports_on.of(peer) or self._reports_by.of(fetcher))

    def recent(self, *, fetcher: str, peer: str, now: float) -> bool:
        """Whether ``fetcher`` vouched for ``peer`` within ``window / 64`` (a vouch now is not recorded)."""
        last = self._vouched_by.by_subject.get(fetcher)
        return last is not None and now - last.get(peer, -math.inf) < self.window / 64

    def spend(self, *, peer: str, chunk: int) -> None:
        """Forget the reports of ``chunk`` from ``peer`` (its holder was told; a new copy starts afresh)."""
        self._chunk_reports.pop((peer, chunk), None)

    def expire(self, *, now: float) -> None:
        """Drop reports older than the window, and vouches at least every ``window / 16`` (there
        are many: one pass over them per judgement would cost more than it decides)."""
        before = now - self.window
        for ledger in (self._reports_on, self._reports_by):
            ledger.expire(before)
        if now - self._vouches_pruned >= self.window / 16:
            self._vouches_pruned = now
            self._vouchers_of.expire(before)
            self._vouched_by.expire(before)
        for key in list(self._chunk_reports):
            seen = self._chunk_reports[key]
            for reporter in [r for r, t in seen.items() if t < before]:
                del seen[reporter]
            if not seen:
                del self._chunk_reports[key]

    # -- judgement ------------------------------------------------------------------------

    def reported_by(self, reporter: str) -> dict[str, float]:
        """The peers ``reporter`` reported (never offered to it again while the report lives)."""
        return self._reports_by.of(reporter)

    def vouchers(self, peer: str) -> int:
        """Distinct nodes that verified chunks from ``peer`` (at most ``cap``)."""
        return len(self._vouchers_of.of(peer))

    def judge(self, *, now: float) -> Verdict:
        """Who is penalised, discredited, and which (peer, chunk) copies are suspect, after expiry."""
        self.expire(now=now)
        discredited = frozenset(r for r in self._reports_by.by_subject if self._discredited(r))
        penalised = frozenset(p for p in self._reports_on.by_subject if self._penalised(p, discredited))
        suspect = frozenset(
            key
            for key, seen in self._chunk_reports.items()
            if sum(1 for r in seen if r not in discredited) >= self.witnesses
        )
        return Verdict(penalised=penalised, discredited=discredited, suspect=suspect)

    def _discredited(self, reporter: str) -> bool:
        contradicted = sum(
            1
            for peer in self._reports_by.of(reporter)
            if sum(1 for f in self._vouchers_of.of(peer) if f != reporter) >= self.witnesses
        )
        return contradicted >= self.witnesses and contradicted > len(self._vouched_by.of(reporter))

    def _penalised(self, peer: str, discredited: frozenset[str]) -> bool:
        credible = sum(1 for r in self._reports_on.of(peer) if r not in discredited)
        return credible >= self.witnesses and credible > self.vouchers(peer)
