"""The training group's membership state machine: peers, votes, ring epochs and verdicts.

Owns everything the coordinator decides; the coordinator's HTTP layer only translates.
Pure: no I/O, no clock (``now`` is an argument), no threads.

Peers: ``register`` -> Registered. The first ``min_peers`` registered peers are Accepted
together (bootstrap); afterwards a newcomer is Accepted only by an *accept vote* of every
Accepted peer. A peer silent for longer than the heartbeat timeout (``expire``) or reported
dead is removed: it leaves the ring, the epoch rises, and every collective it takes part in
gets the abort verdict.

Rounds: every group decision is a round of one kind (collective, accept, sync, bandwidth)
that closes when *every Accepted peer at that moment* has voted; a removal re-checks open
rounds, so survivors never wait for a dead peer past the timeout. Round numbers rise per kind;
a collective round's number is the operation's tag.

Collectives, per tag: VoteInitiate (round open) -> Performing (round closed; the tag, the
epoch and the ring go to every participant) -> VoteComplete (ends arriving) -> exactly one
verdict. The verdict is ``abort`` as soon as one participant reports a failure, a participant
is removed, or the votes disagree on the operation; it is ``complete`` when every participant
reported success. A verdict is final: a later abort for the same tag is ignored, and an abort
names its tag, so a stale abort can never hit the next operation. Every abort raises the
epoch, so survivors rebuild their ring links before they retry under a new tag.

Phases (for status): VotingAcceptPeers while an accept round is open, SyncingState while a
sync round is open, CollectiveRunning while a collective round is open or a tag has no
verdict yet, otherwise Idle.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ringseed.protocol import topology

_KEEP = 256


class PeerStatus(enum.Enum):
    REGISTERED = "Registered"
    ACCEPTED = "Accepted"


class Phase(enum.Enum):
    IDLE = "Idle"
    VOTING_ACCEPT_PEERS = "VotingAcceptPeers"
    SYNCING_STATE = "SyncingState"
    COLLECTIVE_RUNNING = "CollectiveRunning"


class OpStage(enum.Enum):
    VOTE_INITIATE = "VoteInitiate"
    PERFORMING = "Performing"
    VOTE_COMPLETE = "VoteComplete"


class Verdict(enum.Enum):
    COMPLETE = "complete"
    ABORT = "abort"


class RoundKind(enum.Enum):
    COLLECTIVE = "collective"
    ACCEPT = "accept"
    SYNC = "sync"
    BANDWIDTH = "bandwidth"


class MembershipError(ValueError):
    """A request the state machine refuses; ``code`` is a short machine word."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclass(frozen=True)
class PeerInfo:
    peer_id: str
    host: str
    port: int
    status: PeerStatus
    last_seen: float
    order: int

    def address(self) -> dict[str, Any]:
        return {"peer_id": self.peer_id, "host": self.host, "port": self.port}


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str


@dataclass
class _Round:
    kind: RoundKind
    number: int
    votes: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Op:
    tag: int
    op: str
    nbytes: int
    participants: frozenset[str]
    started: float
    ended_ok: set[str] = field(default_factory=set)
    decision: Decision | None = None


class Membership:
    """One training group's state; every method is a transition or a read."""

    def __init__(self, *, min_peers: int = 1, optimize_topology: bool = False) -> None:
        if min_peers < 1:
            raise ValueError(f"min_peers must be at least 1, got {min_peers}")
        self.min_peers = min_peers
        self.optimize_topology = optimize_topology
        self.peers: dict[str, PeerInfo] = {}
        self.ring: tuple[str, ...] = ()
        self.epoch = 0
        self.abort_seq = 0
        self.last_all_reduce: dict[str, float] | None = None
        self._aborts: list[tuple[int, int]] = []
        self._registrations = 0
        self._open: dict[RoundKind, _Round] = {}
        self._next: dict[RoundKind, int] = dict.fromkeys(RoundKind, 1)
        self._results: dict[tuple[RoundKind, int], dict[str, Any]] = {}
        self._ops: dict[int, _Op] = {}

    # -- peers ---------------------------------------------------------------------------

    def register(self, *, peer_id: str, host: str, port: int, now: float) -> PeerInfo:
        """Registered (idempotent for the same address; a new address replaces a lost peer)."""
        old = self.peers.get(peer_id)
        if old is not None and (old.host, old.port) == (host, port):
            return self.heartbeat(peer_id=peer_id, now=now)
        if old is not None:
            self.remove(peer_id, reason="registered again with a new address", now=now)
        self._registrations += 1
        info = PeerInfo(peer_id, host, port, PeerStatus.REGISTERED, now, self._registrations)
        self.peers[peer_id] = info
        self._bootstrap()
        return self.peers[peer_id]

    def _bootstrap(self) -> None:
        if self.ring or len(self.peers) < self.min_peers:
            return
        self._accept(sorted(self.peers.values(), key=lambda p: p.order))

    def _accept(self, newcomers: list[PeerInfo]) -> None:
        for info in newcomers:
            self.peers[info.peer_id] = _with(info, status=PeerStatus.ACCEPTED)
        self.ring = self.ring + tuple(p.peer_id for p in newcomers)
        self.epoch += 1

    def heartbeat(self, *, peer_id: str, now: float) -> PeerInfo:
        info = self._peer(peer_id)
        self.peers[peer_id] = _with(info, last_seen=max(info.last_seen, now))
        return self.peers[peer_id]

    def _peer(self, peer_id: str) -> PeerInfo:
        info = self.peers.get(peer_id)
        if info is None:
            raise MembershipError("unknown_peer", f"peer {peer_id!r} is not registered (removed or never joined)")
        return info

    def expire(self, *, now: float, timeout: float) -> list[str]:
        """Remove every peer silent for longer than ``timeout``; returns their ids."""
        lost = sorted(p.peer_id for p in self.peers.values() if now - p.last_seen > timeout)
        for peer_id in lost:
            self.remove(peer_id, reason=f"no heartbeat for more than {timeout:g} s", now=now)
        return lost

    def remove(self, peer_id: str, *, reason: str, now: float) -> None:
        info = self.peers.pop(peer_id, None)
        if info is None:
            return
        for round_ in self._open.values():
            round_.votes.pop(peer_id, None)
        if peer_id in self.ring:
            self.ring = tuple(p for p in self.ring if p != peer_id)
            self.epoch += 1
        for op in list(self._ops.values()):
            if op.decision is None and peer_id in op.participants:
                self._decide(op, Verdict.ABORT, f"peer {peer_id} lost: {reason}", now=now)
        for kind in list(self._open):
            self._try_close(kind, now=now)

    def accepted(self) -> list[str]:
        return list(self.ring)

    def pending(self) -> list[str]:
        waiting = [p for p in self.peers.values() if p.status is PeerStatus.REGISTERED]
        return [p.peer_id for p in sorted(waiting, key=lambda p: p.order)]

    def ring_addresses(self) -> list[dict[str, Any]]:
        return [self.peers[p].address() for p in self.ring]

    # -- rounds --------------------------------------------------------------------------

    def vote(self, kind: RoundKind, *, peer_id: str, payload: Mapping[str, Any], now: float) -> int:
        """Record an Accepted peer's vote in the open round of ``kind``; returns the round number."""
        if self._peer(peer_id).status is not PeerStatus.ACCEPTED:
            raise MembershipError("not_accepted", f"peer {peer_id!r} has not been accepted into the group yet")
        round_ = self._open.get(kind)
        if round_ is None:
            round_ = self._open[kind] = _Round(kind, self._next[kind])
            self._next[kind] += 1
        round_.votes[peer_id] = dict(payload)
        number = round_.number
        self._try_close(kind, now=now)
        return number

    def result(self, kind: RoundKind, number: int) -> dict[str, Any] | None:
        """The closed round's result, or None while it is open."""
        found = self._results.get((kind, number))
        if found is not None:
            return found
        open_round = self._open.get(kind)
        if open_round is not None and open_round.number == number:
            return None
        raise MembershipError("unknown_round", f"{kind.value} round {number} is not open and has no result")

    def _try_close(self, kind: RoundKind, *, now: float) -> None:
        round_ = self._open.get(kind)
        if round_ is None or not self.ring or not set(self.ring) <= set(round_.votes):
            return
        del self._open[kind]
        votes = {p: round_.votes[p] for p in self.ring}
        resolve = {
            RoundKind.COLLECTIVE: self._close_collective,
            RoundKind.ACCEPT: self._close_accept,
            RoundKind.SYNC: self._close_sync,
            RoundKind.BANDWIDTH: self._close_bandwidth,
        }[kind]
        self._results[(kind, round_.number)] = resolve(round_.number, votes, now)
        _trim(self._results)

    def _close_collective(self, tag: int, votes: dict[str, dict[str, Any]], now: float) -> dict[str, Any]:
        kinds = {(str(v.get("op")), int(v.get("nbytes", 0))) for v in votes.values()}
        op_name, nbytes = min(kinds)
        op = _Op(tag, op_name, nbytes, frozenset(votes), now)
        self._ops[tag] = op
        _trim(self._ops)
        if len(kinds) > 1:
            self._decide(op, Verdict.ABORT, f"peers disagree on the operation: {sorted(kinds)}", now=now)
        return {"tag": tag, "epoch": self.epoch, "ring": self.ring_addresses(), "op": op_name}

    def _close_accept(self, number: int, votes: dict[str, dict[str, Any]], now: float) -> dict[str, Any]:
        newcomers = [self.peers[p] for p in self.pending()]
        if newcomers:
            self._accept(newcomers)
        return {"accepted": [p.peer_id for p in newcomers], "epoch": self.epoch, "ring": self.ring_addresses()}

    def _close_sync(self, number: int, votes: dict[str, dict[str, Any]], now: float) -> dict[str, Any]:
        return decide_sync(votes, ring=self.ring)

    def _close_bandwidth(self, number: int, votes: dict[str, dict[str, Any]], now: float) -> dict[str, Any]:
        ids = list(self.ring)
        rows = [dict(votes[p].get("row") or {}) for p in ids]
        matrix = [[float(rows[i].get(b, 0.0)) if a != b else 0.0 for b in ids] for i, a in enumerate(ids)]
        if self.optimize_topology and len(ids) > 2:
            order = topology.solve(matrix)
            new_ring = tuple(ids[i] for i in order)
            if new_ring != self.ring:
                self.ring = new_ring
                self.epoch += 1
        ring_ids = list(self.ring)
        slowest = topology.bottleneck([ids.index(p) for p in ring_ids], matrix)
        return {"epoch": self.epoch, "ring": self.ring_addresses(), "bottleneck_bps": _finite(slowest)}

    # -- collectives ---------------------------------------------------------------------

    def end(self, *, peer_id: str, tag: int, ok: bool, reason: str = "", now: float) -> None:
        """A participant's outcome for ``tag`` (VoteComplete); may decide the verdict."""
        op = self._ops.get(tag)
        if op is None:
            raise MembershipError("unknown_tag", f"collective tag {tag} is unknown or too old")
        if peer_id not in op.participants:
            raise MembershipError("not_participant", f"peer {peer_id!r} does not take part in tag {tag}")
        if op.decision is not None:
            return
        if not ok:
            self._decide(op, Verdict.ABORT, f"peer {peer_id} failed: {reason or 'no reason given'}", now=now)
            return
        op.ended_ok.add(peer_id)
        if op.ended_ok >= op.participants:
            self._decide(op, Verdict.COMPLETE, "every participant completed", now=now)

    def abort(self, *, tag: int, reason: str, now: float) -> None:
        op = self._ops.get(tag)
        if op is not None and op.decision is None:
            self._decide(op, Verdict.ABORT, reason, now=now)

    def _decide(self, op: _Op, verdict: Verdict, reason: str, *, now: float) -> None:
        if op.decision is not None:
            return
        op.decision = Decision(verdict, reason)
        if verdict is Verdict.ABORT:
            self.epoch += 1
            self.abort_seq += 1
            self._aborts = [*self._aborts[-_KEEP:], (self.abort_seq, op.tag)]
        elif op.op == "all_reduce" and now > op.started:
            world = len(op.participants)
            algbw = op.nbytes / (now - op.started)
            busbw = algbw * 2 * (world - 1) / world if world else 0.0
            self.last_all_reduce = {"bytes": op.nbytes, "busbw_gbps": busbw / 1e9}

    def decision(self, tag: int) -> Decision | None:
        op = self._ops.get(tag)
        if op is None:
            raise MembershipError("unknown_tag", f"collective tag {tag} is unknown or too old")
        return op.decision

    def stage(self, tag: int) -> OpStage | None:
        """VoteInitiate, Performing or VoteComplete; None once the verdict is out."""
        open_round = self._open.get(RoundKind.COLLECTIVE)
        if open_round is not None and open_round.number == tag:
            return OpStage.VOTE_INITIATE
        op = self._ops.get(tag)
        if op is None or op.decision is not None:
            return None
        return OpStage.VOTE_COMPLETE if op.ended_ok else OpStage.PERFORMING

    def aborts_since(self, seq: int) -> list[int]:
        """Tags aborted after abort sequence number ``seq``."""
        return [tag for s, tag in self._aborts if s > seq]

    # -- views ---------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        if RoundKind.ACCEPT in self._open:
            return Phase.VOTING_ACCEPT_PEERS
        if RoundKind.SYNC in self._open:
            return Phase.SYNCING_STATE
        running = any(op.decision is None for op in self._ops.values())
        if RoundKind.COLLECTIVE in self._open or running:
            return Phase.COLLECTIVE_RUNNING
        return Phase.IDLE

    def status(self) -> dict[str, Any]:
        """The coordinator part of ``GET /v1/status`` (see docs/contracts.md)."""
        return {
            "role": "coordinator",
            "peers": len(self.peers),
            "world_size": len(self.ring),
            "ring_order": list(self.ring),
            "last_all_reduce": self.last_all_reduce,
            "phase": self.phase.value,
            "epoch": self.epoch,
            "pending_peers": self.pending(),
            "collectives": [
                {
                    "tag": op.tag,
                    "op": op.op,
                    "stage": OpStage.VOTE_COMPLETE.value if op.ended_ok else OpStage.PERFORMING.value,
                    "waiting_for": sorted(op.participants - op.ended_ok),
                }
                for op in self._ops.values()
                if op.decision is None
            ],
        }


def decide_sync(votes: Mapping[str, Mapping[str, Any]], *, ring: tuple[str, ...]) -> dict[str, Any]:
    """The shared-state verdict: the most common hash set wins (ties: higher revision, then the
    earlier ring position); outliers fetch every tensor whose hash differs; revision rises by one."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for peer in ring:
        hashes = dict(votes[peer].get("hashes") or {})
        groups.setdefault(tuple(sorted(hashes.items())), []).append(peer)

    def rank(item: tuple[tuple[tuple[str, str], ...], list[str]]) -> tuple[int, int, int]:
        members = item[1]
        revision = max(int(votes[p].get("revision", 0)) for p in members)
        return (len(members), revision, -ring.index(members[0]))

    winner_key, members = max(groups.items(), key=rank)
    winner = dict(winner_key)
    revision = max(int(votes[p].get("revision", 0)) for p in members)
    fetch: set[str] = set()
    error = ""
    for peer in ring:
        theirs = dict(votes[peer].get("hashes") or {})
        if set(theirs) != set(winner):
            error = f"peer {peer} holds tensors {sorted(theirs)}, the group holds {sorted(winner)}"
        fetch.update(name for name, digest in winner.items() if theirs.get(name) != digest)
    outliers = [p for p in ring if p not in members]
    return {
        "revision": revision + 1,
        "source": members[0],
        "hashes": winner,
        "fetch": sorted(fetch),
        "outliers": outliers,
        "error": error,
    }


def _with(info: PeerInfo, **changes: Any) -> PeerInfo:
    return dataclasses.replace(info, **changes)


def _trim(table: dict[Any, Any]) -> None:
    while len(table) > _KEEP:
        del table[next(iter(table))]


def _finite(value: float) -> float | None:
    return value if value != float("inf") else None
