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
- Pacing (:mod:`ringseed.protocol.pacing`, with a ``budget``): every heartbeat reply names the
  node's pace, the regular interval and the least gap between its early heartbeats, scaled with
  the number of registered nodes so that the swarm stays within the budget's heartbeats per
  second (origin-duty nodes keep the base gap, and so do the few nodes that last announced a
  chunk few nodes hold: the front of the pipeline); ``offline_after`` grows to 3 intervals while a
  slower pace than the base one is in force, and returns to the configured value after.
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
  pulled the chunk (it hashes what it pulls) or holds its assignment. A hash claim from any
  other node is refused; a claim that differs from a known hash is refused (the first verified
  copy wins). After a master restart (the tracker is soft state) agents re-register with the
  chunks they verified and their hashes; unknown hashes are then restored from those
  registrations (any registered token holder is trusted that far), conflicting ones are refused.
- A chunk counts as held only once its hash is known. An announcement may name the node the
  chunk came from (a *vouch* for that node, see :mod:`ringseed.protocol.trust`); a node that
  drops a chunk says so and stops being listed as its holder. Availability (for rarest first)
  counts holders that are not penalised. Holdings are kept compact
  (:mod:`ringseed.protocol.holdings`: a byte per chunk per node).
- What a node learns (:class:`View`, :mod:`ringseed.protocol.tracker_log`): every heartbeat
  names the version of the shared view the node last absorbed (``since``) and the reply carries
  what changed since then: availability levels (0, 1, 2, 4, ...) of the chunks it lacks, hashes
  learned, pulls started and ended; a snapshot only when the node is too far behind or comes
  from another epoch. Its cost is O(changes since), never O(chunks), except for a snapshot.
  :data:`tracker_log.Replies.FULL` keeps the behaviour before deltas (exact counts, the whole
  vector whenever any count changed) for the side-by-side benchmark.
- Long-polls (:mod:`ringseed.protocol.watches`): a node waiting for news of some chunks (or of
  any chunk it lacks) parks a watch; a new copy or a pull that starts wakes it (watches of any
  chunk a few per new copy), else its deadline does.
- Trust (:mod:`ringseed.protocol.trust`) judges from reports of bad chunks and vouches for good
  ones. Recording evidence is O(1); it is judged on the periodic pass (:meth:`Tracker.purge`,
  every second in the master), so a flood of reports or announcements costs at most one
  judgement per pass. A node is never handed a peer it reported itself, from the report on. A
  penalised node is never handed out as a source (nor as a stream source), does not count in
  availability and never holds origin duty. A copy that enough nodes reported bad stops being
  listed, and its holder is told (``suspect`` in every heartbeat reply until it drops or
  announces the chunk again) so that it checks its copy.
- Origin duty goes to ``seeders`` online, unpenalised nodes, fit ones first (not discredited,
  not reporting a problem that stops its pulls: ``DUTY_BLOCKERS``, not stuck lately), earliest
  registered first; a holder keeps its duty while it stays eligible, but an unfit holder gives
  way to a fit node. A duty holder claims chunks nobody holds; each such chunk is assigned to
  one holder at a time (:mod:`ringseed.protocol.assignments`), so a chunk is pulled from the
  origin once while a copy lives inside. A node that leaves duty for any reason (purged,
  penalised, unfit) loses its open assignments at once, so another holder pulls them. For
  ``claim_grace`` seconds after the tracker starts no chunk is assigned: after a master
  restart, agents first get the time to re-register and re-announce what they hold, so held
  chunks are not pulled again; when the layout is first published by PUT (no agent brought
  one), nothing is held anywhere and the grace ends at once.
- Stuck pulls: a puller that made no progress (no pull completed, no byte read from the origin)
  for ``factor`` times the expected duration of a chunk at the learned origin rate plus a slack
  is *stuck*: on the periodic pass it leaves origin duty with its assignments for
  ``stall_cooloff`` seconds (unless nobody else can hold it), and the chunks go to the next
  puller. Its late result is an ordinary announcement: accepted only when its hash equals the
  one the first verified copy set, since it holds neither duty nor the assignment any more.
- Peers for a chunk: up to ``limit`` online holders other than the asker, least loaded (the
  load reported in heartbeats plus the hand-outs since) among ``SAMPLE`` drawn at random,
  penalised peers and peers the asker reported excluded: O(1) in the number of holders. A
  chunk nobody holds yet may have a stream source: the node pulling it from the origin now.
- Each node's latest blocking problem (reason, message) and source revision are kept as it
  last reported them (a heartbeat that leaves them out changes nothing).
- Completion is derived from availability: a node is complete when it holds every chunk, and
  verified when it also reported a materialised model of the current, confirmed revision whose
  manifest digest matches.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ringseed.protocol import (
    assignments,
    choice,
    digests,
    holdings,
    manifest,
    pacing,
    tracker_log,
    tracker_view,
    trust,
    watches,
)
from ringseed.protocol import revision as revisions  # (``Tracker.revision`` is the current id)

MAX_CHUNKS = 1 << 21  # 2 TiB at the smallest chunk size, 128 TiB at the default
MAX_NODES = 1 << 16  # node names the tracker keeps (registered and departed): bounded memory
DUTY_BLOCKERS = frozenset({"DiskFull", "WriteFailed", "OriginError"})  # node problems that stop its pulls
VOUCHES_PER_BATCH = 8  # distinct sources one announcement batch vouches for, at most
SAMPLE = 16  # holders drawn at random per peer query; the least loaded of them are offered
STALL_COOLOFF = 300.0  # seconds a stuck puller stays off origin duty


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
    """What the tracker knows of one registered node (mutable, owned by the tracker); what it
    holds is in :attr:`Tracker.holdings`."""

    name: str
    url: str
    session: str
    registered_at: float
    last_seen: float
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
class View:
    """What a node learns of the shared view: the changes since the version it named, or a snapshot.

    ``full``: ``availability`` holds every chunk's level and ``pulling`` every chunk being
    pulled (replace what you had). Otherwise ``levels`` maps a level to the chunks (that the
    node lacks) now at it, ``pulling``/``pulling_stopped`` list pulls that started/ended, and in
    exact mode ``availability`` is the whole vector of counts when any count changed. ``hashes``
    always adds to what the node knows. ``version``: name it as ``since`` next time (-1: nothing
    was absorbed)."""

    version: int
    full: bool = False
    availability: list[int] | None = None
    levels: dict[int, list[int]] = field(default_factory=dict)
    hashes: Mapping[int, str] = field(default_factory=dict)
    pulling: list[int] = field(default_factory=list)
    pulling_stopped: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class HeartbeatReply:
    """What a node learns from a heartbeat."""

    origin_duty: bool
    view: View
    rejected: list[int]
    layout_known: bool
    suspect: list[int] = field(default_factory=list)
    revision: str | None = None
    revision_confirmed: bool = False
    pace: pacing.Pace | None = None  # None: the tracker sets no pace (no ``budget``)


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
        replies: tracker_log.Replies = tracker_log.Replies.DELTA,
        stall_factor: float = assignments.FACTOR,
        stall_slack: float | None = None,
        stall_cooloff: float = STALL_COOLOFF,
        budget: pacing.Budget | None = None,
    ) -> None:
        self.epoch = epoch
        self.budget = budget
        self.claim_grace = claim_grace
        self.claims_from = now + claim_grace
        self.configured_offline = offline_after
        self.offline_after = offline_after  # the configured silence, longer while the pace is slow (``budget``)
        self.seeders = max(1, seeders)
        self.replies = replies
        self.layout: manifest.Layout | None = None
        self.source: revisions.Revision | None = None
        self.confirmed = False
        self.hashes: list[str | None] = []
        self._known = bytearray()  # 1 where the chunk's hash is known (checked per run in C)
        self._raw = bytearray()  # the known hashes as binary digests, 32 bytes per chunk (replies pack from it)
        self._raw_ok = True  # every known hash is in _raw
        self.holdings = holdings.Holdings()
        self.log = tracker_log.ChangeLog()
        self.watches = watches.Watches()
        self.nodes: dict[str, NodeState] = {}
        self.departed: dict[str, dict[str, Any]] = {}
        self.duty: list[str] = []
        slack = stall_slack if stall_slack is not None else offline_after
        self.pulls = assignments.Assignments(factor=stall_factor, slack=slack)
        self.stall_cooloff = stall_cooloff
        self.stalled: dict[str, float] = {}  # stuck pullers -> until when they stay off duty
        self.trust = judge if judge is not None else trust.Trust()
        self.penalised: frozenset[str] = frozenset()
        self.discredited: frozenset[str] = frozenset()
        self.origin_bytes_gone = 0
        self._avail: list[int] = []
        self._level: list[int] = []
        self._pull_began: list[int] = []
        self._unheld_from = 0  # every chunk below is held or assigned
        self._last_index, self._last_length = 0, 0  # the last chunk may be shorter
        self._digest: str | None = None

    # -- layout and hashes -------------------------------------------------------------

    @property
    def revision(self) -> str | None:
        """The id of the revision the swarm distributes (None until one is known)."""
        return self.source.id if self.source is not None else None

    @property
    def assigned(self) -> dict[int, str]:
        """Open origin assignments, chunk -> puller (a copy)."""
        return self.pulls.as_dict()

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
        if self.layout is None and not any(self.holdings.held_count(n) for n in self.nodes):
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
            state.have_bytes, state.verified_digest = 0, None
            state.suspect = set()
        self.pulls.release_all_but(())
        self.claims_from = now + self.claim_grace  # nodes first reuse what they hold, by hash
        self._set_layout(new.layout, new)

    def _set_layout(self, layout: manifest.Layout, source: revisions.Revision | None = None) -> None:
        if self.layout is not None:
            if layout != self.layout:
                raise Conflict("a different layout is already published for this model")
            return
        if layout.chunk_count > MAX_CHUNKS:
            raise TrackerError(f"layout has {layout.chunk_count} chunks, more than {MAX_CHUNKS}: use bigger chunks")
        count = layout.chunk_count
        self.layout = layout
        self._last_index, self._last_length = count - 1, layout.chunk_length(count - 1)
        self.source = source if source is not None else revisions.Revision(layout=layout)
        self.confirmed = False
        self.hashes = [None] * count
        self._known = bytearray(count)
        self._raw = bytearray(digests.DIGEST_BYTES * count)
        self._raw_ok = True
        self._digest = None
        self.holdings.reset(count)
        self._avail, self._level = [0] * count, [0] * count
        self._pull_began = [0] * count  # the version at which each chunk's latest pull began
        self._unheld_from = 0
        self.log.restart(limit=max(1 << 16, 4 * count))

    def _learn_hash(self, index: int, digest: str) -> None:
        if self.hashes[index] is None:
            self.hashes[index] = digest
            self._known[index] = 1
            try:
                raw = bytes.fromhex(digest)
            except ValueError:
                raw = b""
            if len(raw) == digests.DIGEST_BYTES:
                self._raw[index * digests.DIGEST_BYTES : (index + 1) * digests.DIGEST_BYTES] = raw
            else:  # (not a hex SHA-256: the master refuses such, a direct caller may not; hex replies then)
                self._raw_ok = False
            self.log.add(tracker_log.HASH, index)

    def _claim_hash(self, *, node: str, index: int, digest: str, restoring: bool) -> bool:
        known = self.hashes[index]
        if known is not None:
            return known == digest
        if not (restoring or node in self.duty or self.pulls.puller(index) == node):
            return False
        self._learn_hash(index, digest)
        return True

    @property
    def hash_log(self) -> list[int]:
        """The chunks whose hash is known, in the order learned (read-only)."""
        return self.log.all(tracker_log.HASH)

    @property
    def hashes_known(self) -> int:
        return len(self.log.all(tracker_log.HASH))

    @property
    def digest(self) -> str | None:
        """The manifest digest, once every chunk hash is known (computed once)."""
        if self._digest is None and self.layout is not None and self.hashes_known == len(self.hashes):
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
        self.holdings.join(node)
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

    def _add_chunks(
        self,
        node: str,
        items: Iterable[Announcement],
        *,
        restoring: bool,
        now: float,
        runs: Iterable[tuple[int, int]] = (),
        sources: Iterable[tuple[int, str]] = (),
    ) -> list[int]:
        """The hot path of a busy swarm (every verified chunk of every node passes here once).

        ``items`` one by one (with a hash, or naming where the chunk came from); ``runs``
        ``(first, count)``: chunks ``first .. first + count - 1`` verified, no hash, no source,
        held in bulk (O(1) Python steps per run for the checks and the node's own bytes, one
        tight step per chunk for the counts); ``sources`` ``(index, source)``: where a chunk of
        this batch came from, evidence only (a vouch). Each distinct source named in one call is
        one vouch (a node names the holders it fetched from many times over;
        :mod:`ringseed.protocol.trust` counts distinct vouchers), for at most
        ``VOUCHES_PER_BATCH`` sources not vouched for lately: a paced heartbeat of a big swarm
        names a hundred sources, and trust keeps at most 32 vouches per node anyway; the sources
        left out are vouched for in later batches)."""
        rejected: list[int] = []
        fresh: list[int] = []
        hashes, holds, known = self.hashes, self.holdings.holds, self._known
        vouched: set[str] = set()
        for item in items:
            index, digest = item[0], item[1]
            if self.layout is None or not 0 <= index < len(hashes):
                rejected.append(index)
                continue
            if digest is not None and not self._claim_hash(node=node, index=index, digest=digest, restoring=restoring):
                rejected.append(index)
                continue
            if not known[index]:
                rejected.append(index)
                continue
            source = item[2] if len(item) > 2 else None
            if source is not None:
                self._vouch(node, source, index, vouched, now)
            fresh.append(index)
        batches: list[Sequence[int]] = [fresh] if fresh else []
        for first, count in runs:
            stop = first + count
            if self.layout is None or first < 0 or count < 1 or stop > len(hashes):
                rejected.extend(range(max(0, first), max(0, first) + max(0, min(count, len(hashes)))))
            elif known.find(0, first, stop) < 0:
                batches.append(range(first, stop))
            else:  # (some hashes not known here: those are refused, the rest held)
                batches.append([i for i in range(first, stop) if known[i]])
                rejected.extend(i for i in range(first, stop) if not known[i])
        for batch in batches:
            self._hold(node, batch, now)
        for index, source in sources:
            if 0 <= index < len(hashes) and holds(node, index):
                self._vouch(node, source, index, vouched, now)
        return rejected

    def _vouch(self, node: str, source: str, index: int, vouched: set[str], now: float) -> None:
        """``node`` verified ``index`` from ``source``: a vouch, at most ``VOUCHES_PER_BATCH`` per call."""
        if (
            len(vouched) < VOUCHES_PER_BATCH
            and source not in vouched
            and self.holdings.holds(source, index)
            and not self.trust.recent(fetcher=node, peer=source, now=now)
        ):
            vouched.add(source)
            self.trust.vouch(fetcher=node, peer=source, now=now)

    def _hold(self, node: str, indices: Sequence[int], now: float) -> None:
        """``node`` holds ``indices`` (hashes known, in range): holdings, bytes, pulls, counts."""
        if isinstance(indices, range):
            added = self.holdings.add_run(node, indices.start, indices.stop)
        else:
            added = self.holdings.add_many(node, indices)
        if not added:
            return
        assert self.layout is not None
        state, pulls = self.nodes[node], self.pulls
        last = self._last_index
        state.have_bytes += len(added) * self.layout.chunk_size
        if last in added:
            state.have_bytes -= self.layout.chunk_size - self._last_length
        if len(pulls):
            within = added if isinstance(added, range) else set(added)
            for index in sorted(i for i in pulls if i in within):
                if pulls.complete(index, node=node, now=now, nbytes=self._length(index)) is not None:
                    self._pull_ended(index)
        least = self._count_up(added) if node not in self.penalised else min(self._avail[i] for i in added)
        if self.budget is not None and least <= pacing.FRONT_HOLDERS:
            self.budget.rare_copy(node)

    def _count_up(self, indices: Iterable[int]) -> int:
        """:meth:`_count` ``+1`` for each of ``indices`` (one tight step per chunk: the level
        moves only where the count reaches a power of two); returns the least new count."""
        avail, exact = self._avail, self.replies is tracker_log.Replies.FULL
        least = MAX_NODES + 1
        for index in indices:
            count = avail[index] = avail[index] + 1
            if count < least:
                least = count
            if exact or not count & (count - 1):
                self._level_to(index, count)
        return least

    def _length(self, index: int) -> int:
        assert self.layout is not None
        return self.layout.chunk_size if index < self._last_index else self._last_length

    def _remove_chunk(self, state: NodeState, index: int) -> bool:
        if self.layout is None or not 0 <= index < len(self.hashes) or not self.holdings.remove(state.name, index):
            return False
        state.have_bytes -= self._length(index)
        if state.name not in self.penalised:
            self._count(index, -1)
        return True

    def _count(self, index: int, step: int) -> None:
        """One unpenalised holder more or less: the availability, its level, the log, the watches."""
        count = self._avail[index] = self._avail[index] + step
        exact = self.replies is tracker_log.Replies.FULL
        if not exact and count & (count - 1) and (count + 1) & count:
            return  # neither at nor just below a power of two: the level did not move
        self._level_to(index, count if exact else tracker_log.level(count))

    def _level_to(self, index: int, new: int) -> None:
        old = self._level[index]
        if new == old:
            return
        self._level[index] = new
        self.log.add(tracker_log.AVAIL, index)
        if new > old:
            self.watches.news(index, copies=new - old, lacks=self._lacks(index))
        elif new == 0:
            self._unheld_from = min(self._unheld_from, index)

    def _lacks(self, index: int) -> Callable[[str], bool]:
        return lambda name: not self.holdings.holds(name, index)

    def heartbeat(
        self,
        *,
        node: str,
        now: float,
        load: int = 0,
        counters: Mapping[str, int] | None = None,
        chunks: Iterable[Announcement] = (),
        runs: Iterable[tuple[int, int]] = (),
        sources: Iterable[tuple[int, str]] = (),
        dropped: Iterable[int] = (),
        verified_digest: str | None = None,
        since: int | None = None,
        epoch: str | None = None,
        problem: Problem | Literal[Keep.KEEP] | None = KEEP,
        revision: str | Literal[Keep.KEEP] | None = KEEP,
    ) -> HeartbeatReply:
        """Record liveness, load, counters, dropped and new chunks (``chunks`` one by one, ``runs``
        ``(first, count)`` in bulk with ``sources`` ``(index, source)`` as evidence of where
        some came from: :meth:`_add_chunks`), problem and revision; answer
        with duty, what changed since version ``since`` of epoch ``epoch`` (:class:`View`) and
        which of its chunks to check.

        A node whose revision is not the tracker's (None: not known yet, taken as current) gets
        no hashes or availability and its chunks are ignored: it must move to the current
        revision (``HeartbeatReply.revision``) first."""
        state = self._node(node, now)
        state.load, state.handed = max(0, load), 0
        if problem is not KEEP:
            state.problem = problem
        if revision is not KEEP:
            state.revision = revision
        ours = self._ours(state)
        state.verified_digest = verified_digest if ours else None
        self._counters(state, counters or {}, now)
        rejected: list[int] = []
        lost: list[int] = []
        if ours:
            chunks, runs = list(chunks), list(runs)
            for index in dropped:
                if self._remove_chunk(state, index):
                    lost.append(index)
                state.suspect.discard(index)
            rejected = self._add_chunks(node, chunks, restoring=False, now=now, runs=runs, sources=sources)
            if state.suspect:
                state.suspect.difference_update(item[0] for item in chunks)
                state.suspect.difference_update(i for first, count in runs for i in range(first, first + count))
        self._refresh_duty(now)
        return HeartbeatReply(
            origin_duty=node in self.duty,
            pace=self.pace(node, now=now),
            view=self._view(state, since=since, epoch=epoch, also=lost) if ours else View(version=-1),
            rejected=rejected,
            layout_known=self.layout is not None,
            suspect=sorted(state.suspect),
            revision=self.revision,
            revision_confirmed=self.confirmed,
        )

    def pace(self, node: str, *, now: float) -> pacing.Pace | None:
        """The pace ``node`` is told now (:mod:`ringseed.protocol.pacing`; None without a budget)."""
        if self.budget is None:
            return None
        pace = self.budget.pace(nodes=len(self.nodes), duty=node in self.duty, node=node)
        told = self.budget.told(pace, now=now)
        self.offline_after = max(self.offline_after, self.budget.silence(now=now))
        return told

    def _ours(self, state: NodeState) -> bool:
        return state.revision is None or self.revision is None or state.revision == self.revision

    def _counters(self, state: NodeState, counters: Mapping[str, int], now: float) -> None:
        origin = max(state.origin_bytes, int(counters.get("origin_bytes", state.origin_bytes)))
        if origin > state.origin_bytes:
            self.pulls.progressed(state.name, now=now)
        state.origin_bytes = origin
        fetched = int(counters.get("fetched_bytes", state.fetched_bytes))
        if state.sample is not None and now > state.sample[0]:
            rate = max(0, fetched - state.sample[1]) / (now - state.sample[0])
            state.throughput = 0.5 * state.throughput + 0.5 * rate
        state.sample = (now, fetched)
        state.fetched_bytes = fetched

    # -- what a node learns ------------------------------------------------------------

    def view(self, *, node: str, since: int | None, epoch: str | None, now: float) -> View:
        """What ``node`` learns of the shared view since ``since`` (the answer of a watch)."""
        state = self._node(node, now)
        return self._view(state, since=since, epoch=epoch) if self._ours(state) else View(version=-1)

    def _view(self, state: NodeState, *, since: int | None, epoch: str | None, also: Sequence[int] = ()) -> View:
        """The changes since ``since`` (chunks in ``also``, which the node just dropped, are
        told whether they changed or not: it heard nothing of them while it held them)."""
        version = self.log.version
        known = since if epoch == self.epoch else None
        counts = self.log.since(tracker_log.AVAIL, known) if known is not None else None
        pulls = self.log.since(tracker_log.PULL, known) if known is not None else None
        hashes = self._hashes_since(known, state.name)
        if known is None or counts is None or pulls is None or len(counts) + len(pulls) > max(64, len(self._avail)):
            # an unknown version, or the snapshot is the smaller answer
            return View(
                version=version, full=True, availability=list(self._level), hashes=hashes, pulling=sorted(self.pulls)
            )
        mine, level = self.holdings.have_of(state.name), self._level
        levels: dict[int, list[int]] = {}
        for index in counts:  # (each changed chunk once: tracker_log)
            if not mine[index]:
                levels.setdefault(level[index], []).append(index)
        pulling, stopped = self.pulls.split(pulls)
        if stopped:  # a pull that began after ``since`` and ended: the node never heard of it
            began = self._pull_began
            stopped = [i for i in stopped if began[i] <= known]
        told = {i for listed in levels.values() for i in listed} if also else set()
        for index in also:
            if index not in told:
                levels.setdefault(level[index], []).append(index)
        if self.replies is tracker_log.Replies.FULL:
            vector = list(self._avail) if counts else None
            return View(version=version, availability=vector, hashes=hashes, pulling=pulling, pulling_stopped=stopped)
        for listed in levels.values():
            listed.sort()
        return View(version=version, levels=levels, hashes=hashes, pulling=pulling, pulling_stopped=stopped)

    def _hashes_since(self, since: int | None, node: str) -> Mapping[int, str]:
        """Hashes learned after version ``since`` (all when None, older than the layout or
        unknown), of chunks ``node`` does not hold (read on demand: :class:`digests.Learned`)."""
        changed = self.log.since(tracker_log.HASH, since) if since is not None else None
        learned = changed if changed is not None else self.log.all(tracker_log.HASH)
        mine = self.holdings.have_of(node)
        lacked = sorted(i for i in learned if not mine[i])
        if not lacked:
            return {}
        hashes = self.hashes
        return digests.Learned(lacked, hashes, self._raw) if self._raw_ok else {i: hashes[i] or "" for i in lacked}

    # -- long-polls ----------------------------------------------------------------------

    def watch(
        self,
        *,
        node: str,
        chunks: Collection[int] | None,
        since: int | None,
        epoch: str | None,
        now: float,
        wait: float,
    ) -> watches.Ticket | None:
        """Park a watch of ``chunks`` (None: any chunk ``node`` lacks) for ``wait`` seconds at most;
        None when there is news since ``since`` already (answer at once with :meth:`view`)."""
        state = self._node(node, now)
        if chunks is not None:
            if len(chunks) > watches.MAX_CHUNKS:
                raise TrackerError(f"a watch names at most {watches.MAX_CHUNKS} chunks, not {len(chunks)}")
            if any(not 0 <= i < len(self.hashes) for i in chunks):
                raise TrackerError("a watched chunk is out of range")
        if wait <= 0 or not self._ours(state) or self._news(state, chunks, since=since, epoch=epoch):
            return None
        return self.watches.add(node=node, chunks=chunks, now=now, wait=wait)

    def unwatch(self, ticket: int) -> None:
        self.watches.remove(ticket)

    def _news(self, state: NodeState, chunks: Collection[int] | None, *, since: int | None, epoch: str | None) -> bool:
        """Whether something ``state`` may fetch or stream (of ``chunks``) changed after ``since``."""
        if since is None or epoch != self.epoch:
            return True
        mine = self.holdings.have_of(state.name)
        for kind in (tracker_log.HASH, tracker_log.AVAIL, tracker_log.PULL):
            changed = self.log.since(kind, since)
            if changed is None:
                return True
            for index in set(changed):
                if mine[index] or (chunks is not None and index not in chunks):
                    continue
                if kind == tracker_log.HASH and chunks is not None:
                    return True
                if kind == tracker_log.AVAIL and self._level[index] > 0:
                    return True
                if kind == tracker_log.PULL and index in self.pulls:
                    return True
        return False

    # -- the periodic pass -----------------------------------------------------------------

    def purge(self, *, now: float) -> list[str]:
        """The periodic pass (the master runs it every second or more often): drop nodes silent
        for longer than ``offline_after``, take origin duty from stuck pullers, then judge the
        evidence gathered since the last pass (and let old evidence decay); returns the names of
        the nodes dropped."""
        if self.budget is not None:
            self.offline_after = max(self.configured_offline, self.budget.silence(now=now))
        gone = [n for n, s in self.nodes.items() if now - s.last_seen > self.offline_after]
        for name in gone:
            state = self.nodes.pop(name)
            self.departed[name] = tracker_view.node_entry(self, state, online=False)
            self._drop(state, keep_counters=False)
        self._unstick(now)
        self._judge(now)
        return gone

    def _unstick(self, now: float) -> None:
        """Stuck pullers leave origin duty for ``stall_cooloff`` seconds; their chunks go to others."""
        self.stalled = {n: t for n, t in self.stalled.items() if t > now}
        if self.layout is None:
            return
        for name in self.pulls.stuck(now=now, chunk_bytes=self.layout.chunk_size):
            self.stalled[name] = now + self.stall_cooloff
            for index in self.pulls.of(name):
                self.pulls.release(index)
                self._pull_ended(index)
            self.pulls.forget(name)

    def _drop(self, state: NodeState, *, keep_counters: bool) -> None:
        counted = state.name not in self.penalised
        for index in self.holdings.leave(state.name):
            if counted:
                self._count(index, -1)
        state.have_bytes = 0
        for index in self.pulls.of(state.name):
            self.pulls.release(index)
            self._pull_ended(index)
        self.pulls.forget(state.name)
        if state.name in self.duty:
            self.duty.remove(state.name)
        if self.budget is not None:
            self.budget.forget(state.name)
        if not keep_counters:
            self.origin_bytes_gone += state.origin_bytes

    def _online(self, state: NodeState, now: float) -> bool:
        return now - state.last_seen <= self.offline_after and state.name not in self.penalised

    def _refresh_duty(self, now: float) -> None:
        """Keep ``seeders`` eligible duty holders, fit ones first; leavers lose their assignments.

        Cheap while every seat holds an eligible, fit node (every heartbeat calls it); the full
        choice walks every node."""
        kept = [n for n in self.duty if n in self.nodes and self._online(self.nodes[n], now)]
        if len(kept) >= self.seeders and not any(self._unfit(self.nodes[n], now) for n in kept):
            if len(kept) < len(self.duty):
                self._set_duty(kept)
            return
        eligible = {n: s for n, s in self.nodes.items() if self._online(s, now)}
        fit = sum(1 for s in eligible.values() if not self._unfit(s, now))
        kept = [n for n in self.duty if n in eligible and not self._unfit(eligible[n], now)]
        doubtful = [n for n in self.duty if n in eligible and self._unfit(eligible[n], now)]
        kept += doubtful[: max(0, self.seeders - fit)]  # seats no fit node can take
        ranked = sorted(
            (s for n, s in eligible.items() if n not in kept),
            key=lambda s: (self._unfit(s, now), s.name in self.discredited, s.registered_at, s.name),
        )
        kept += [s.name for s in ranked[: max(0, self.seeders - len(kept))]]
        self._set_duty(kept)

    def _unfit(self, state: NodeState, now: float) -> bool:
        """Discredited, reporting a problem that keeps it from pulling (full disk, failing writes
        or origin), or stuck not long ago: such a node holds origin duty only while no fit node can."""
        impaired = state.problem is not None and state.problem.reason in DUTY_BLOCKERS
        return state.name in self.discredited or impaired or self.stalled.get(state.name, now) > now

    def _set_duty(self, duty: list[str]) -> None:
        if any(n not in duty for n in self.duty):  # leavers lose their open assignments at once
            for index in self.pulls.release_all_but(duty):
                self._pull_ended(index)
        self.duty = duty

    # -- origin, peers, trust -----------------------------------------------------------

    def claim_origin(self, *, node: str, count: int, now: float) -> list[int]:
        """Chunks ``node`` (on origin duty) should pull: its open assignments, topped up to ``count``
        with chunks nobody holds or pulls (lowest index first; amortised O(count))."""
        self._node(node, now)
        self._refresh_duty(now)
        if node not in self.duty:
            raise Forbidden(f"node {node!r} does not hold origin duty")
        if self.layout is None or now < self.claims_from or not self.confirmed:
            return []  # (an unconfirmed revision may be stale: the duty holder takes it from the source first)
        mine = self.pulls.of(node)
        index, avail = self._unheld_from, self._avail
        while len(mine) < count and index < len(avail):
            if avail[index] == 0 and index not in self.pulls:
                self.pulls.assign(index, node, now=now)
                self.log.add(tracker_log.PULL, index)
                self._pull_began[index] = self.log.version
                self.watches.news(index, copies=1, lacks=self._lacks(index))
                mine.append(index)
            index += 1
        self._unheld_from = index
        return mine[:count]

    def _pull_ended(self, index: int) -> None:
        self.log.add(tracker_log.PULL, index)
        if self._avail[index] == 0:
            self._unheld_from = min(self._unheld_from, index)

    def peers(self, *, chunk: int, node: str, now: float, rng: random.Random, limit: int = 4) -> list[choice.Holder]:
        """Online, unpenalised holders of ``chunk`` other than ``node`` and the peers it reported,
        the least loaded of ``SAMPLE`` drawn at random first."""
        if not 0 <= chunk < len(self.hashes):
            raise TrackerError(f"chunk {chunk} is out of range")
        shunned = self.trust.reported_by(node)
        nodes, penalised = self.nodes, self.penalised

        def usable(name: str) -> bool:
            state = nodes.get(name)
            return (
                state is not None
                and name != node
                and name not in shunned
                and name not in penalised
                and now - state.last_seen <= self.offline_after
            )

        drawn = (nodes[n] for n in self.holdings.sample(chunk, k=SAMPLE, rng=rng, accept=usable))
        candidates = [choice.Holder(name=s.name, url=s.url, load=s.load + s.handed) for s in drawn]
        chosen = choice.least_loaded(candidates, rng=rng)[:limit]
        if chosen:
            nodes[chosen[0].name].handed += 1
        return chosen

    def stream_source(self, *, chunk: int, node: str, now: float) -> choice.Holder | None:
        """The online, unpenalised node pulling ``chunk`` from the origin now (not ``node``, nor
        a peer it reported), if any."""
        if not 0 <= chunk < len(self.hashes):
            raise TrackerError(f"chunk {chunk} is out of range")
        puller = self.pulls.puller(chunk)
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
        if not 0 <= chunk < len(self.hashes):
            raise TrackerError(f"chunk {chunk} is out of range")
        self.trust.report(reporter=reporter, peer=peer, chunk=chunk, now=now)

    def _judge(self, now: float) -> None:
        """Apply the trust verdict: availability, suspect copies, origin duty."""
        verdict = self.trust.judge(now=now)
        for name in verdict.penalised.symmetric_difference(self.penalised):
            if name in self.nodes:
                step = -1 if name in verdict.penalised else 1
                for index in self.holdings.held(name):
                    self._count(index, step)
        self.penalised, self.discredited = verdict.penalised, verdict.discredited
        for peer, chunk in verdict.suspect:
            self.trust.spend(peer=peer, chunk=chunk)
            state = self.nodes.get(peer)
            if state is not None and self.holdings.holds(peer, chunk):
                self._remove_chunk(state, chunk)
                state.suspect.add(chunk)
        self._refresh_duty(now)

    def availability(self) -> list[int]:
        """Unpenalised holders per chunk, kept up to date incrementally (do not mutate)."""
        return self._avail

    def holders_of(self, chunk: int) -> set[str]:
        """Every node listed as holding ``chunk`` (penalised ones included; O(nodes) for a
        widely held chunk: for status and tests)."""
        return self.holdings.holders(chunk)

    def status(self, *, now: float) -> dict[str, Any]:
        """The master's ``/v1/status`` body (tracker role), see docs/contracts.md."""
        return tracker_view.status(self, now=now)
