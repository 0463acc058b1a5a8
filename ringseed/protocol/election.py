"""Who may lead: the rules a master replica applies once it holds the lock (or the Lease).

Owns the decision, not the lock: ``ringseed/master/election.py`` takes a local file lock
(cluster-free) or a Kubernetes Lease (in a cluster) and keeps a small :class:`Record` beside
it; this module says what the holder of the lock may do with what the record says. Pure.

The record is written by the leader only, while it holds the lock:
- ``term`` counts leaderships; each new leader takes ``term + 1``.
- ``leader`` / ``leader_url``: the instance that leads ``term`` and where it answers.
- ``sync``: the follower instance that holds every acknowledged entry, or ``""``. The leader
  names a follower only once it has applied everything; before it acknowledges a write that
  the named follower has not applied (the follower is gone or slow) it first writes
  ``sync = ""``. So a follower named ``sync`` never lacks an acknowledged write.
- ``seq``: the leader's log position when it last wrote the record (for status only).
- ``lost``: set when a leader started without the state of the previous one (see below).

Instance ids are unique per process start, so a restarted replica is never mistaken for the
follower it was before (its memory is empty).

Rules for the lock holder (:func:`decide`); a master whose state is *soft* (the tracker: it is
rebuilt from the agents' re-registrations, nothing acknowledged can be lost) leads as soon as it
holds the lock, with empty state and a new epoch, and the rules below are for hard state:
- No term yet (a fresh group): lead, with empty state.
- ``sync`` is this instance and it has the state (it followed): lead, keeping its state.
- ``leader`` is this instance and it still has its state (it lost and regained the lock): lead.
- Otherwise the state lives with someone else: do not lead; release the lock and follow
  ``leader_url``, waiting for that instance to come back. Only after ``grace`` seconds with
  nobody able to lead may the holder lead with empty state, and it says so (``lost``): the
  committed objects of the dead masters are gone from the metadata (persisted checkpoints are
  still in the sink).

Leases (:func:`lease_takeable`, :func:`lease_timing`): a Lease may be taken when it has no
holder, is held by the taker, or was last renewed more than its duration ago. Its timing comes
from how fast a follower must take over (the tracker: within one heartbeat timeout, so agents
never count as silent because their master died): the duration plus one poll of the follower
stays below that bound, and the holder renews three times per duration.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Record:
    term: int = 0
    leader: str = ""
    leader_url: str = ""
    sync: str = ""
    seq: int = 0
    lost: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Record:
        if not d:
            return cls()
        return cls(
            term=int(d.get("term", 0)),
            leader=str(d.get("leader", "")),
            leader_url=str(d.get("leader_url", "")),
            sync=str(d.get("sync", "")),
            seq=int(d.get("seq", 0)),
            lost=bool(d.get("lost", False)),
        )


class Decision(enum.Enum):
    LEAD = "lead"  # lead with the state this instance has (maybe empty: a fresh group)
    LEAD_LOST = "lead_lost"  # lead with empty state although a previous leader had some
    WAIT = "wait"  # release the lock; the state is elsewhere


def decide(record: Record, *, me: str, has_state: bool, waited: float, grace: float, soft: bool = False) -> Decision:
    """What the lock holder ``me`` may do (see the module rules; ``soft``: its state is rebuilt
    from its clients, so it always leads)."""
    if record.term == 0 or soft:
        return Decision.LEAD
    if has_state and me in (record.sync, record.leader):
        return Decision.LEAD
    if waited >= grace:
        return Decision.LEAD_LOST
    return Decision.WAIT


def take_over(record: Record, *, me: str, url: str, seq: int, lost: bool) -> Record:
    """The record a new leader writes when it starts leading."""
    return Record(term=record.term + 1, leader=me, leader_url=url, sync="", seq=seq, lost=lost)


def with_sync(record: Record, *, follower: str, seq: int) -> Record:
    """The record naming ``follower`` in sync (``""``: none)."""
    return replace(record, sync=follower, seq=seq)


@dataclass(frozen=True)
class LeaseTiming:
    duration: float  # seconds a renewal keeps the Lease (whole seconds: leaseDurationSeconds)
    renew_every: float  # the holder renews this often
    poll_every: float  # a follower tries to take it this often


def lease_timing(*, takeover_within: float) -> LeaseTiming:
    """Timing under which a follower takes a dead leader's Lease within ``takeover_within`` seconds
    (at least 2: a Lease counts whole seconds), not counting the API server's own latency."""
    poll = min(1.0, takeover_within / 10)
    duration = max(1.0, math.floor(takeover_within - 2 * poll))
    return LeaseTiming(duration=duration, renew_every=duration / 3, poll_every=poll)


def lease_takeable(*, holder: str | None, renewed_at: float | None, duration: float, me: str, now: float) -> bool:
    """Whether ``me`` may take (or renew) a Lease held by ``holder`` and renewed at ``renewed_at``
    (seconds, the same clock as ``now``) for ``duration`` seconds."""
    if holder in (None, "", me):
        return True
    return renewed_at is None or now - renewed_at > duration
