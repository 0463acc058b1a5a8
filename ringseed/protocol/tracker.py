"""Tracker state: who holds which chunk, which hashes are known, who pulls from the origin, whom to trust.

Owns the soft state of one distribution (the master's tracker role keeps one :class:`Tracker`;
the simulator drives the same object). Pure: no I/O; time is the ``now`` argument (seconds,
any monotonic origin); randomness is a ``random.Random`` argument.

Rules:
- Nodes register (name, peer URL, session id) and heartbeat; at most ``MAX_NODES`` names are
  kept (registered and departed), a new name beyond that is refused. A node silent for more than
  ``offline_after`` seconds is purged by :meth:`Tracker.purge`: its holdings stop counting,
  its origin assignments are released and its origin duty moves to another online node.
  A purged node that comes back re-registers; its record starts afresh from what it announces.
- Source revision (``ringseed.protocol.revision``): the tracker distributes one revision at a
  time (``source``; ``revision`` is its id). The first one known (published by the agent on
  origin duty, or restored from a registration after a master restart) is *unconfirmed* until
  the agent on origin duty has taken the revision from the source and published it
  (``publish``): no node counts as verified and no chunk is assigned for an origin pull before
  that, so copies cached from an older source never pass as current. A publication of another
  revision by a node on duty that names the current one (``replaces``) moves the swarm to it:
  layout, hashes, holdings and assignments start afresh (nodes reuse their bytes by hash); any
  other different layout is a :class:`Conflict`. Chunks announced or registered under another
  revision than the node's current one are ignored (refused at registration), and a node on
  another revision gets no hashes or availability: heartbeat replies carry ``revision`` so that
  it moves over.
- A chunk hash is learned from a published manifest, or from the node on origin duty that
  pulled the chunk (it hashes what it pulls). A hash claim from any other node is refused;
  a claim that differs from a known hash is refused. After a master restart (the tracker is
  soft state) agents re-register with the chunks they verified and their hashes; unknown
  hashes are then restored from those registrations (any registered token holder is trusted
  that far), conflicting ones are refused.
- A chunk counts as held only once its hash is known. An announcement may name the node the
  chunk came from (a *vouch* for that node, see :mod:`ringseed.protocol.trust`); a node that
  drops a chunk says so and stops being listed as its holder. Availability (for rarest first)
  counts holders that are not penalised.
- Trust (:mod:`ringseed.protocol.trust`) judges from reports of bad chunks and vouches for good
  ones. Recording evidence is O(1); it is judged on the periodic pass (:meth:`Tracker.purge`,
  every second in the master), so a flood of reports or announcements costs at most one
  judgement per pass. A node is never handed a peer it reported itself, from the report on. A
  penalised node is never handed out as a source (nor as a stream source), does not count in
  availability and never holds origin duty. A copy that enough nodes reported bad stops being
  listed, and its holder is told (``suspect`` in every heartbeat reply until it drops or
  announces the chunk again) so that it checks its copy.
- Origin duty goes to ``seeders`` online, unpenalised nodes, fit ones first (not discredited,
  not reporting a problem that stops its pulls: ``DUTY_BLOCKERS``), earliest registered first;
  a holder keeps its duty while it stays eligible, but an unfit holder gives way to a fit node.
  A duty holder claims chunks nobody holds; each such chunk is assigned to one holder at a
  time, so a chunk is pulled from the origin once while a copy lives inside. A node that leaves
  duty for any reason (purged, penalised, unfit) loses its open assignments at once, so another
  holder pulls them. For
  ``claim_grace`` seconds after the tracker starts no chunk is assigned: after a master
  restart, agents first get the time to re-register and re-announce what they hold, so held
  chunks are not pulled again; when the layout is first published by PUT (no agent brought
  one), nothing is held anywhere and the grace ends at once.
- Peers for a chunk: online holders other than the asker, fewest active uploads first (the
  load reported in heartbeats plus the hand-outs since), penalised peers excluded. A chunk
  nobody holds yet may have a stream source: the node pulling it from the origin now (its
  assignment), which can send the bytes as they arrive. Heartbeat replies list the chunks
  being pulled (``pulling``) so that idle nodes know what they could stream.
- Each node's latest blocking problem (reason, message) and source revision are kept as it
  last reported them (a heartbeat that leaves them out changes nothing).
- Completion is derived from availability: a node is complete when it holds every chunk, and
  verified when it also reported a materialised model of the current, confirmed revision whose
  manifest digest matches.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ringseed.protocol import choice, manifest, tracker_view, trust
from ringseed.protocol import revision as revisions  # (``Tracker.revision`` is the current id)

MAX_CHUNKS = 1 << 21  # 2 TiB at the smallest chunk size, 128 TiB at the default
MAX_NODES = 1 << 16  # node names the tracker keeps (registered and departed): bounded memory
DUTY_BLOCKERS = frozenset({"DiskFull", "WriteFailed", "OriginError"})  # node problems that stop its pulls


class TrackerError(Exception):
    """A refused request; ``code`` is a short machine name, the message a sentence."""

    code = "tracker_error"


class UnknownNode(TrackerError):
    code = "unknown_node"


class Conflict(TrackerError):
    code = "conflict"


class Forbidden(TrackerError):
    code = "forbidden"


class Keep(enum.Enum):
    """The type of :data:`KEEP`."""

    KEEP = "keep"


KEEP: Literal[Keep.KEEP] = Keep.KEEP
"""Heartbeat argument meaning "unchanged since the last report"."""

# (index, hash or None, node it came from or None); a 2-tuple leaves out where it came from
Announcement = tuple[int, str | None] | tuple[int, str | None, str | None]


@dataclass(frozen=True)
class Problem:
    """A node's current blocking problem: a CamelCase reason and one sentence."""

    reason: str
    message: str


@dataclass
class NodeState:
    """What the tracker knows of one registered node (mutable, owned by the tracker)."""

    name: str
    url: str
    session: str
    registered_at: float
    last_seen: float
    have: set[int] = field(default_factory=set)
    have_bytes: int = 0
    load: int = 0
    handed: int = 0
    origin_bytes: int = 0
    fetched_bytes: int = 0
    verified_digest: str | None = None
    throughput: float = 0.0
    sample: tuple[float, int] | None = None
    problem: Problem | None = None
    revision: str | None = None
    suspect: set[int] = field(default_factory=set)  # reported bad here: told until dropped or announced


@dataclass(frozen=True)
class HeartbeatReply:
    """What a node learns from a heartbeat."""

    origin_duty: bool
    hashes: dict[int, str]
    hash_cursor: int
    availability: list[int] | None
    avail_version: int
    rejected: list[int]
    layout_known: bool
    pulling: list[int] = field(default_factory=list)
    suspect: list[int] = field(default_factory=list)
    revision: str | None = None
    revision_confirmed: bool = False


class Tracker:
    """The tracker's soft state for one model."""

    def __init__(
        self,
        *,
        epoch: str,
        offline_after: float,
        seeders: int = 1,
        now: float = 0.0,
        claim_grace: float = 0.0,
        judge: trust.Trust | None = None,
    ) -> None:
        self.epoch = epoch
        self.claim_grace = claim_grace
        self.claims_from = now + claim_grace
        self.offline_after = offline_after
        self.seeders = max(1, seeders)
        self.layout: manifest.Layout | None = None
        self.source: revisions.Revision | None = None
        self.confirmed = False
        self.hashes: list[str | None] = []
        self.hash_log: list[int] = []
        self.holders: list[set[str]] = []
        self.nodes: dict[str, NodeState] = {}
        self.departed: dict[str, dict[str, Any]] = {}
        self.duty: list[str] = []
        self.assigned: dict[int, str] = {}
        self.trust = judge if judge is not None else trust.Trust()
        self.penalised: frozenset[str] = frozenset()
        self.discredited: frozenset[str] = frozenset()
        self.origin_bytes_gone = 0
        self.avail_version = 0
        self._avail: list[int] = []
        self._digest: str | None = None

    # -- layout and hashes -------------------------------------------------------------

    @property
    def revision(self) -> str | None:
        """The id of the revision the swarm distributes (None until one is known)."""
        return self.source.id if self.source is not None else None

    def publish(
        self,
        *,
        node: str,
        layout: manifest.Layout,
        hashes: Sequence[str] | None,
        now: float,
        source: revisions.Revision | None = None,
        replaces: str | None = None,
    ) -> None:
        """Publish the revision ``node`` took from the source (``source``; default: ``layout``, no tags).

        First wins; the same again confirms it (from a node on duty); another one replaces the
        current revision only from a node on duty naming it in ``replaces``. From a manifest,
        ``hashes`` sets every chunk hash.
        """
        self._node(node, now)
        new = source if source is not None else revisions.Revision(layout=layout)
        if new.layout != layout:
            raise Conflict("the revision's layout differs from the layout published with it")
        if self.layout is None and not any(s.have for s in self.nodes.values()):
            self.claims_from = min(self.claims_from, now)  # a fresh start: nothing to wait for
        self._refresh_duty(now)
        if self.source is not None and new.id != self.source.id:
            self._replace(node=node, new=new, replaces=replaces, now=now)
        else:
            self._set_layout(layout, new)
        if node in self.duty:
            self.confirmed = True
        if hashes is None:
            return
        checked = manifest.Manifest(layout=layout, chunk_hashes=tuple(hashes)).chunk_hashes
        clash = [i for i, h in enumerate(checked) if self.hashes[i] not in (None, h)]
        if clash:
            raise Conflict(f"manifest disagrees with known hashes of chunks {clash[:8]}")
        for index, digest in enumerate(checked):
            self._learn_hash(index, digest)

    def _replace(self, *, node: str, new: revisions.Revision, replaces: str | None, now: float) -> None:
        assert self.source is not None
        if node not in self.duty:
            raise Conflict(
                f"a different revision is current; only the node on origin duty may replace it, not {node!r}"
            )
        if replaces != self.source.id:
            raise Conflict(
                f"revision {self.source.id[:16]} is current; a new revision must name it in 'replaces'"
                f" (got {str(replaces)[:16]})"
            )
        if new.layout.chunk_count > MAX_CHUNKS:
            raise TrackerError(f"layout has {new.layout.chunk_count} chunks, more than {MAX_CHUNKS}: use bigger chunks")
        self.source, self.layout = None, None
        for state in self.nodes.values():
            state.have, state.have_bytes, state.verified_digest = set(), 0, None
            state.suspect = set()
        self.assigned = {}
        self.claims_from = now + self.claim_grace  # nodes first reuse what they hold, by hash
        self._set_layout(new.layout, new)

    def _set_layout(self, layout: manifest.Layout, source: revisions.Revision | None = None) -> None:
        if self.layout is not None:
            if layout != self.layout:
                raise Conflict("a different layout is already published for this model")
            return
        if layout.chunk_count > MAX_CHUNKS:
            raise TrackerError(f"layout has {layout.chunk_count} chunks, more than {MAX_CHUNKS}: use bigger chunks")
        self.layout = layout
        self.source = source if source is not None else revisions.Revision(layout=layout)
        self.confirmed = False
        self.hashes = [None] * layout.chunk_count
        self.hash_log = []
        self._digest = None
        self.holders = [set() for _ in range(layout.chunk_count)]
        self._avail = [0] * layout.chunk_count
        self._changed()

    def _learn_hash(self, index: int, digest: str) -> None:
        if self.hashes[index] is None:
            self.hashes[index] = digest
            self.hash_log.append(index)

    def _claim_hash(self, *, node: str, index: int, digest: str, restoring: bool) -> bool:
        known = self.hashes[index]
        if known is not None:
            return known == digest
        if not (restoring or node in self.duty or self.assigned.get(index) == node):
            return False
        self._learn_hash(index, digest)
        return True

    @property
    def digest(self) -> str | None:
        """The manifest digest, once every chunk hash is known (computed once)."""
        if self._digest is None and self.layout is not None and len(self.hash_log) == len(self.hashes):
            hashes = tuple(h or "" for h in self.hashes)
            self._digest = manifest.Manifest(layout=self.layout, chunk_hashes=hashes).digest
        return self._digest

    # -- membership --------------------------------------------------------------------

    def register(
        self,
        *,
        node: str,
        url: str,
        session: str,
        now: float,
        chunks: Mapping[int, str] | None = None,
        layout: manifest.Layout | None = None,
        source: revisions.Revision | None = None,
    ) -> list[int]:
        """(Re-)register a node with the chunks it verified; returns the chunk indices refused.

        The node's revision (``source``, default ``layout`` without tags) becomes the tracker's
        unconfirmed one if it has none; chunks of another revision are all refused. What others
        said about the node (:mod:`ringseed.protocol.trust`) is keyed by its name and survives
        re-registration."""
        if node not in self.nodes and node not in self.departed and len(self.nodes) + len(self.departed) >= MAX_NODES:
            raise TrackerError(f"this swarm already knows {MAX_NODES} nodes; refusing a new name")
        if layout is not None:
            source = source if source is not None else revisions.Revision(layout=layout)
            if self.layout is None:
                self._set_layout(layout, source)
        ours = source is None or source.id == self.revision
        old = self.nodes.get(node)
        if old is not None:
            self._drop(old, keep_counters=old.session == session)
        self.departed.pop(node, None)
        self.nodes[node] = NodeState(name=node, url=url, session=session, registered_at=now, last_seen=now)
        if old is not None and old.session == session:
            self.nodes[node].origin_bytes = old.origin_bytes
        self.nodes[node].revision = source.id if source is not None else None
        if not ours:
            self._refresh_duty(now)
            return sorted(chunks or {})
        rejected = self._add_chunks(node, ((i, h) for i, h in (chunks or {}).items()), restoring=True, now=now)
        self._refresh_duty(now)
        return rejected

    def _node(self, name: str, now: float) -> NodeState:
        state = self.nodes.get(name)
        if state is None:
            raise UnknownNode(f"node {name!r} is not registered (register again)")
        state.last_seen = now
        return state

    def _add_chunks(self, node: str, items: Iterable[Announcement], *, restoring: bool, now: float) -> list[int]:
        state = self.nodes[node]
        rejected: list[int] = []
        for item in items:
            index, digest = item[0], item[1]
            if self.layout is None or not 0 <= index < len(self.hashes):
                rejected.append(index)
                continue
            if digest is not None and not self._claim_hash(node=node, index=index, digest=digest, restoring=restoring):
                rejected.append(index)
                continue
            if self.hashes[index] is None:
                rejected.append(index)
                continue
            source = item[2] if len(item) > 2 else None
            if source is not None and source in self.holders[index]:
                self.trust.vouch(fetcher=node, peer=source, now=now)
            if index not in state.have:
                state.have.add(index)
                state.have_bytes += self.layout.chunk_length(index)
                self.holders[index].add(node)
                self.assigned.pop(index, None)
                self._avail[index] += node not in self.penalised
                self._changed()
        return rejected

    def _remove_chunk(self, state: NodeState, index: int) -> None:
        if index not in state.have or self.layout is None:
            return
        state.have.discard(index)
        state.have_bytes -= self.layout.chunk_length(index)
        self.holders[index].discard(state.name)
        self._avail[index] -= state.name not in self.penalised
        self._changed()

    def heartbeat(
        self,
        *,
        node: str,
        now: float,
        load: int = 0,
        counters: Mapping[str, int] | None = None,
        chunks: Iterable[Announcement] = (),
        dropped: Iterable[int] = (),
        verified_digest: str | None = None,
        hash_cursor: int = 0,
        epoch: str | None = None,
        avail_version: int = -1,
        problem: Problem | Literal[Keep.KEEP] | None = KEEP,
        revision: str | Literal[Keep.KEEP] | None = KEEP,
    ) -> HeartbeatReply:
        """Record liveness, load, counters, dropped and new chunks, problem and revision; answer
        with duty, hashes, availability, what is being pulled and which of its chunks to check.

        A node whose revision is not the tracker's (None: not known yet, taken as current) gets
        no hashes or availability and its chunks are ignored: it must move to the current
        revision (``HeartbeatReply.revision``) first."""
        state = self._node(node, now)
        state.load, state.handed = max(0, load), 0
        if problem is not KEEP:
            state.problem = problem
        if revision is not KEEP:
            state.revision = revision
        ours = state.revision is None or self.revision is None or state.revision == self.revision
        state.verified_digest = verified_digest if ours else None
        self._counters(state, counters or {}, now)
        rejected: list[int] = []
        if ours:
            chunks = list(chunks)
            for index in dropped:
                self._remove_chunk(state, index)
                state.suspect.discard(index)
            rejected = self._add_chunks(node, chunks, restoring=False, now=now)
            state.suspect.difference_update(item[0] for item in chunks)
        self._refresh_duty(now)
        cursor = hash_cursor if epoch == self.epoch and 0 <= hash_cursor <= len(self.hash_log) else 0
        new = {i: self.hashes[i] or "" for i in self.hash_log[cursor:]} if ours else {}
        fresh = avail_version == self.avail_version and epoch == self.epoch
        avail = None if fresh or not ours else self.availability()
        return HeartbeatReply(
            origin_duty=node in self.duty,
            hashes=new,
            hash_cursor=len(self.hash_log),
            availability=avail,
            avail_version=self.avail_version,
            rejected=rejected,
            layout_known=self.layout is not None,
            pulling=sorted(self.assigned),
            suspect=sorted(state.suspect),
            revision=self.revision,
            revision_confirmed=self.confirmed,
        )

    def _counters(self, state: NodeState, counters: Mapping[str, int], now: float) -> None:
        state.origin_bytes = max(state.origin_bytes, int(counters.get("origin_bytes", state.origin_bytes)))
        fetched = int(counters.get("fetched_bytes", state.fetched_bytes))
        if state.sample is not None and now > state.sample[0]:
            rate = max(0, fetched - state.sample[1]) / (now - state.sample[0])
            state.throughput = 0.5 * state.throughput + 0.5 * rate
        state.sample = (now, fetched)
        state.fetched_bytes = fetched

    def purge(self, *, now: float) -> list[str]:
        """The periodic pass (the master runs it every second or more often): drop nodes silent
        for longer than ``offline_after``, then judge the evidence gathered since the last pass
        (and let old evidence decay); returns the names of the nodes dropped."""
        gone = [n for n, s in self.nodes.items() if now - s.last_seen > self.offline_after]
        for name in gone:
            state = self.nodes.pop(name)
            self.departed[name] = tracker_view.node_entry(self, state, online=False)
            self._drop(state, keep_counters=False)
        self._judge(now)
        return gone

    def _drop(self, state: NodeState, *, keep_counters: bool) -> None:
        counted = state.name not in self.penalised
        for index in state.have:
            self.holders[index].discard(state.name)
            self._avail[index] -= counted
        if state.have:
            self._changed()
        state.have = set()
        self.assigned = {i: n for i, n in self.assigned.items() if n != state.name}
        if state.name in self.duty:
            self.duty.remove(state.name)
        if not keep_counters:
            self.origin_bytes_gone += state.origin_bytes

    def _online(self, state: NodeState, now: float) -> bool:
        return now - state.last_seen <= self.offline_after and state.name not in self.penalised

    def _refresh_duty(self, now: float) -> None:
        """Keep ``seeders`` eligible duty holders, fit ones first; leavers lose their assignments.

        Cheap while every seat holds an eligible, fit node (every heartbeat calls it); the full
        choice walks every node."""
        kept = [n for n in self.duty if n in self.nodes and self._online(self.nodes[n], now)]
        if len(kept) >= self.seeders and not any(self._unfit(self.nodes[n]) for n in kept):
            if len(kept) < len(self.duty):
                self._set_duty(kept)
            return
        eligible = {n: s for n, s in self.nodes.items() if self._online(s, now)}
        fit = sum(1 for s in eligible.values() if not self._unfit(s))
        kept = [n for n in self.duty if n in eligible and not self._unfit(eligible[n])]
        doubtful = [n for n in self.duty if n in eligible and self._unfit(eligible[n])]
        kept += doubtful[: max(0, self.seeders - fit)]  # seats no fit node can take
        ranked = sorted(
            (s for n, s in eligible.items() if n not in kept),
            key=lambda s: (self._unfit(s), s.name in self.discredited, s.registered_at, s.name),
        )
        kept += [s.name for s in ranked[: max(0, self.seeders - len(kept))]]
        self._set_duty(kept)

    def _unfit(self, state: NodeState) -> bool:
        """Discredited, or reporting a problem that keeps it from pulling (full disk, failing writes
        or origin): such a node holds origin duty only while no fit node can."""
        impaired = state.problem is not None and state.problem.reason in DUTY_BLOCKERS
        return state.name in self.discredited or impaired

    def _set_duty(self, duty: list[str]) -> None:
        if any(n not in duty for n in self.duty):  # leavers lose their open assignments at once
            self.assigned = {i: n for i, n in self.assigned.items() if n in duty}
        self.duty = duty

    # -- origin, peers, trust -----------------------------------------------------------

    def claim_origin(self, *, node: str, count: int, now: float) -> list[int]:
        """Chunks ``node`` (on origin duty) should pull: its open assignments, topped up to ``count``."""
        self._node(node, now)
        self._refresh_duty(now)
        if node not in self.duty:
            raise Forbidden(f"node {node!r} does not hold origin duty")
        if self.layout is None or now < self.claims_from or not self.confirmed:
            return []  # (an unconfirmed revision may be stale: the duty holder takes it from the source first)
        avail = self.availability()
        mine = [i for i, n in sorted(self.assigned.items()) if n == node]
        for index in range(len(avail)):
            if len(mine) >= count:
                break
            if avail[index] == 0 and index not in self.assigned:
                self.assigned[index] = node
                mine.append(index)
        return mine[:count]

    def peers(self, *, chunk: int, node: str, now: float, rng: random.Random, limit: int = 4) -> list[choice.Holder]:
        """Online, unpenalised holders of ``chunk`` other than ``node`` and the peers it reported,
        least loaded first."""
        if not 0 <= chunk < len(self.holders):
            raise TrackerError(f"chunk {chunk} is out of range")
        shunned = self.trust.reported_by(node)
        holders = (self.nodes[n] for n in self.holders[chunk] if n != node and n not in shunned)
        candidates = [
            choice.Holder(name=s.name, url=s.url, load=s.load + s.handed) for s in holders if self._online(s, now)
        ]
        chosen = choice.least_loaded(candidates, rng=rng)[:limit]
        if chosen:
            self.nodes[chosen[0].name].handed += 1
        return chosen

    def stream_source(self, *, chunk: int, node: str, now: float) -> choice.Holder | None:
        """The online, unpenalised node pulling ``chunk`` from the origin now (not ``node``, nor
        a peer it reported), if any."""
        if not 0 <= chunk < len(self.holders):
            raise TrackerError(f"chunk {chunk} is out of range")
        puller = self.assigned.get(chunk)
        if puller is None or puller == node or puller in self.trust.reported_by(node):
            return None
        state = self.nodes.get(puller)
        if state is None or not self._online(state, now):
            return None
        return choice.Holder(name=state.name, url=state.url, load=state.load + state.handed)

    def report(self, *, reporter: str, peer: str, chunk: int, now: float) -> None:
        """``reporter`` got bytes from ``peer`` for ``chunk`` that failed verification."""
        self._node(reporter, now)
        if peer == reporter:
            raise TrackerError("a node cannot report itself")
        if peer not in self.nodes and peer not in self.departed:
            raise TrackerError(f"peer {peer!r} is not a node of this swarm")
        if not 0 <= chunk < len(self.holders):
            raise TrackerError(f"chunk {chunk} is out of range")
        self.trust.report(reporter=reporter, peer=peer, chunk=chunk, now=now)

    def _judge(self, now: float) -> None:
        """Apply the trust verdict: availability, suspect copies, origin duty."""
        verdict = self.trust.judge(now=now)
        for name in verdict.penalised.symmetric_difference(self.penalised):
            state = self.nodes.get(name)
            if state is not None and state.have:
                step = -1 if name in verdict.penalised else 1
                for index in state.have:
                    self._avail[index] += step
                self._changed()
        self.penalised, self.discredited = verdict.penalised, verdict.discredited
        for peer, chunk in verdict.suspect:
            self.trust.spend(peer=peer, chunk=chunk)
            state = self.nodes.get(peer)
            if state is not None and chunk in state.have:
                self._remove_chunk(state, chunk)
                state.suspect.add(chunk)
        self._refresh_duty(now)

    def availability(self) -> list[int]:
        """Unpenalised holders per chunk, kept up to date incrementally (do not mutate)."""
        return self._avail

    def _changed(self) -> None:
        self.avail_version += 1

    def status(self, *, now: float) -> dict[str, Any]:
        """The master's ``/v1/status`` body (tracker role), see docs/contracts.md."""
        return tracker_view.status(self, now=now)
