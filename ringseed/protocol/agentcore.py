"""The agent's decisions without I/O: one state machine fed events, returning actions.

Owns what one node holds and wants of the revision it is on (held chunks, known hashes, missing
chunks, candidates kept from another revision), what it learned from the tracker (availability,
chunks being pulled, origin duty, the tracker's revision), the announcements still to send, and
every download decision: slots, which chunk next, which holder, retries and back-off, streams
from the origin puller, the end game, origin duty's claims and pulls, avoid lists, reports and
the problems these decisions raise. The aiohttp agent (``ringseed/agent``) and the simulator
(``ringseed/sim``) drive the same object: events in (a method call, time as ``now``), actions
out (frozen values to carry out). Every event is the sole writer of the state it touches; nothing
here sleeps, reads a clock or does I/O, and randomness comes from the ``random.Random`` given.

Rules (the agent's module docs give the why of each number):
- Jobs: every download is a *job* (an id), a chain of steps: ``FindHolders`` (ask the
  tracker), ``Fetch`` (ask one holder), ``Store`` (hold the verified bytes), each
  answered by an event naming the job; a job's next step is the action carrying its id, and a
  job with no next step has ended. A stream job starts with ``FindSource`` and may
  ``AwaitHash``; an origin pull is ``Pull`` then ``Store``; a claimed candidate
  is ``Reuse``. Jobs of an earlier revision (``generation``) are forgotten; their events
  return nothing.
- Slots: at most ``download_slots`` fetch and stream jobs at once. :meth:`AgentCore.tick` picks
  the chunks: streams first (chunks being pulled from the origin that nobody holds, at most
  ``max_streams``), then :func:`ringseed.protocol.choice.rarest_first` over the wanted chunks
  (missing, hash known, not a candidate, ready), then the end game
  (:func:`~ringseed.protocol.choice.endgame`, ``endgame_requests`` requests per chunk).
- Nothing is verified unless its length and SHA-256 match the known hash. A holder that served
  a wrong body is reported (``Report``) and avoided for good; a stream that does not
  match is dropped without blame (its bytes were never claimed verified).
- Holders in the tracker's order (least loaded first); an avoided one is skipped. steps.Unreachable:
  avoided ``unreachable_avoid`` seconds; ``unreachable_problem_after`` in a row raise
  ``PeerUnreachable`` until a peer answers. Busy (429): avoided about ``retry_after``. A body
  cut short: avoided ``unreachable_avoid`` (not for a stream).
- Retries: a chunk that nobody could give is ready again after ``retry_after`` x U(0.5, 1.5);
  one whose fetch failed backs off per chunk (``retry_after`` doubling to ``retry_cap``); a
  chunk whose availability grows is ready at once.
- Origin duty: pulls only while the tracker grants the duty and its revision is ours and
  confirmed, something is missing, staging has room and the source is not known to have
  changed (``source_stale``). Reads: ``origin_depth`` leading reads, plus one ending read
  overlapping the next; a read hands the pipe on when its rest should take less than
  ``lookahead`` seconds. Claims ask for enough to see past what is pulled, unacknowledged or
  backing off. Failed pulls back off per chunk (``origin_retry_base`` doubling to
  ``origin_retry_cap``), ``OriginError`` after ``origin_problem_after`` failures of a chunk; a
  pull that contradicts the published manifest is retried at most ``max_mismatches`` times
  (``SourceChanged`` then), and asks for the source to be taken again (``Retake``) at most
  every ``manifest_recheck`` seconds. A source found changed stops pulling and asks for a
  ``Retake``; gaining the duty does too (a new duty holder checks the source first).
- Announcements: a held chunk is announced once (with its hash when it came from the origin,
  else with the peer it came from); a dropped chunk is withdrawn from the queue and announced
  as dropped.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from ringseed.protocol import agentsteps as steps
from ringseed.protocol import backoff, choice, manifest

PEER_UNREACHABLE = "PeerUnreachable"
ORIGIN_ERROR = "OriginError"
SOURCE_CHANGED = "SourceChanged"

# (index, hash when pulled from the origin, the peer it came from)
Announcement = tuple[int, str | None, str | None]


@dataclass(frozen=True)
class Settings:
    """The agent's knobs (the agent's ``Config`` sets the slots; the rest are its defaults)."""

    download_slots: int = 4
    origin_depth: int = 1
    retry_after: float = 0.1
    retry_cap: float = 2.0
    unreachable_avoid: float = 5.0
    unreachable_problem_after: int = 20
    endgame_requests: int = 1
    max_streams: int = 1
    stream_retry: float = 0.5
    hash_wait: float = 30.0
    lookahead: float = 0.5
    origin_retry_base: float = 0.5
    origin_retry_cap: float = 60.0
    origin_problem_after: int = 3
    max_mismatches: int = 3
    claim_retry: float = 0.05
    manifest_recheck: float = 10.0


class Outcome(enum.Enum):
    """How one job ended."""

    HELD = "held"
    NOT_NOW = "not_now"  # no holder yet, every holder busy, nothing to check against
    FAILED = "failed"  # a peer unreachable, a body cut short, a wrong hash


class Kind(enum.Enum):
    FETCH = "fetch"
    STREAM = "stream"
    PULL = "pull"
    REUSE = "reuse"


@dataclass
class Job:
    """One job's progress (mutable, owned by the core)."""

    id: int
    index: int
    kind: Kind
    generation: int
    holders: list[choice.Holder] = field(default_factory=list)
    position: int = 0
    failed: bool = False
    storing: bool = False
    got: steps.Got | None = None
    holder: choice.Holder | None = None
    leading: bool = True  # a pull whose read has not handed the origin pipe on
    reading: bool = True  # a pull whose read is still open


class AgentCore:
    """One node's download decisions for the revision it holds (see the module rules)."""

    def __init__(self, *, settings: Settings | None = None, rng: random.Random | None = None) -> None:
        self.settings = settings or Settings()
        self.rng = rng or random.Random()
        # the copy: the revision it belongs to, held chunks, hashes, what is missing
        self.generation = 0
        self.layout: manifest.Layout | None = None
        self.revision: str | None = None
        self.held: dict[int, str] = {}
        self.hashes: dict[int, str] = {}
        self.missing: set[int] = set()
        self.candidates: set[int] = set()
        self.wanted: set[int] = set()  # missing, hash known, not a candidate: what peers may give
        # what the tracker said
        self.availability: Sequence[int] = ()
        self.pulling: Set[int] = frozenset()
        self.tracker_revision: str | None = None
        self.confirmed = False
        self.duty = False
        self.source_stale = False
        self.writes_paused = False
        # to announce
        self.announce: list[Announcement] = []
        self.dropped: list[int] = []
        # downloads
        self.jobs: dict[int, Job] = {}
        self.by_chunk: dict[int, set[int]] = {}
        self._next_job = 0
        self._downloading = 0
        s = self.settings
        self.retries: backoff.Backoff[int] = backoff.Backoff(base=s.retry_after, cap=s.retry_cap, rng=self.rng)
        self.not_before: dict[int, float] = {}
        self.stream_at: dict[int, float] = {}
        self.avoid: dict[str, float] = {}
        self.unreachable_in_a_row = 0
        self.rejected_chunks = 0
        self.streamed_chunks = 0
        # origin duty
        self.pulls: dict[int, Job] = {}  # by chunk: pulls and reuses of claimed chunks
        self.pull_failures: backoff.Backoff[int] = backoff.Backoff(
            base=s.origin_retry_base, cap=s.origin_retry_cap, rng=self.rng
        )
        self.mismatches: dict[int, int] = {}
        self.given_up: set[int] = set()
        self.manifest_checked = -math.inf
        self.claiming = False
        self.claim_at = 0.0

    # -- the copy --------------------------------------------------------------------------

    @property
    def ours(self) -> bool:
        """The tracker distributes the revision this node holds."""
        return self.revision is not None and self.tracker_revision == self.revision

    def adopt(
        self,
        *,
        layout: manifest.Layout,
        revision: str,
        held: Mapping[int, str],
        hashes: Mapping[int, str],
        candidates: Iterable[int] = (),
    ) -> None:
        """The node holds ``revision`` now: ``held`` verified here, ``hashes`` known, ``candidates``
        kept from another revision (to check by hash). Work of the previous one is forgotten."""
        self.generation += 1
        self.layout, self.revision = layout, revision
        self.held = dict(held)
        self.hashes = dict(hashes)
        for index, digest in self.held.items():
            self.hashes.setdefault(index, digest)
        self.missing = set(range(layout.chunk_count)) - set(self.held)
        self.candidates = set(candidates) - set(self.held)
        self.wanted = {i for i in self.missing if i in self.hashes} - self.candidates
        self.availability, self.pulling = (), frozenset()
        self.announce, self.dropped = [], []
        self.jobs, self.by_chunk, self.pulls = {}, {}, {}
        self._downloading = 0
        self.retries.clear()
        self.not_before.clear()
        self.stream_at.clear()
        self.pull_failures.clear()
        self.mismatches.clear()
        self.given_up.clear()
        self.claiming = False

    def learn_hashes(self, hashes: Mapping[int, str]) -> list[int]:
        """The tracker's hashes; returns the held chunks that contradict them (to drop)."""
        conflicts = []
        for index, digest in hashes.items():
            if self.held.get(index, digest) != digest:
                conflicts.append(index)
            self.hashes[index] = digest
            if index in self.missing and index not in self.candidates:
                self.wanted.add(index)
        return conflicts

    def held_chunk(
        self, index: int, digest: str, *, from_origin: bool, source: str | None = None
    ) -> list[steps.Action]:
        """A verified chunk is held (and to be announced); other jobs for it stop."""
        self.held[index] = digest
        self.hashes.setdefault(index, digest)
        self.missing.discard(index)
        self.candidates.discard(index)
        self.wanted.discard(index)
        self.announce.append((index, digest if from_origin else None, source))
        self.retries.succeeded(index)
        self.not_before.pop(index, None)
        stop: list[steps.Action] = []
        for job_id in list(self.by_chunk.get(index, ())):
            job = self.jobs[job_id]
            if not job.storing:
                stop.append(steps.Cancel(job_id))
                self._forget(job)
        return stop

    def unheld(self, index: int) -> bool:
        """Forget a held chunk (missing again) without telling the tracker; False if not held."""
        if self.held.pop(index, None) is None:
            return False
        self.missing.add(index)
        if index in self.hashes and index not in self.candidates:
            self.wanted.add(index)
        return True

    def dropped_chunk(self, index: int) -> bool:
        """Stop holding ``index`` and announce that; False if it was not held."""
        if not self.unheld(index):
            return False
        self.announce = [a for a in self.announce if a[0] != index]
        self.dropped.append(index)
        return True

    def candidate_done(self, index: int) -> None:
        """A candidate was checked (held now, or to be fetched)."""
        self.candidates.discard(index)
        if index in self.missing and index in self.hashes:
            self.wanted.add(index)

    def reannounce(self, index: int) -> None:
        """Announce a held chunk again (a check found the copy peers doubted sound)."""
        if index in self.held:
            self.announce.append((index, None, None))

    def pause(self, paused: bool) -> None:
        """Staging is full or writes fail (True): start nothing new until it has room again."""
        self.writes_paused = paused

    def take_announcements(self, limit: int) -> tuple[list[Announcement], list[int]]:
        """Up to ``limit`` announcements and drops for the next heartbeat (give them back if it fails)."""
        batch, self.announce = self.announce[:limit], self.announce[limit:]
        drops, self.dropped = self.dropped[:limit], self.dropped[limit:]
        return batch, drops

    def registered(self, carried: Collection[int]) -> None:
        """A registration listed ``carried`` (what was held when it was sent): the announcements
        and drops it covers are void; those of chunks gained or lost since it was sent stay."""
        self.announce = [a for a in self.announce if a[0] not in carried]
        self.dropped = [i for i in self.dropped if i in carried and i not in self.held]

    def announcements_failed(self, batch: Sequence[Announcement], drops: Sequence[int]) -> None:
        """The heartbeat carrying them failed: send again what is still true."""
        self.announce[:0] = [a for a in batch if a[0] in self.held]
        self.dropped[:0] = list(drops)

    def announcements_rejected(self, indices: Collection[int]) -> None:
        """A heartbeat's reply named ``indices`` as not taken: the tracker did not know their hash
        (a leader that took over learns hashes from the nodes' registrations, and only the origin
        puller may teach one in a heartbeat) or its layout yet. Those still held are told again
        (once each) until it takes them; a tracker hash that differs comes back in its view and
        :meth:`learn_hashes` drops the copy, which ends the telling."""
        queued = {a[0] for a in self.announce}
        self.announce[:0] = [(i, self.held[i], None) for i in indices if i in self.held and i not in queued]

    # -- the tracker's view ----------------------------------------------------------------

    def tracker_state(self, *, revision: str | None, confirmed: bool, duty: bool) -> list[steps.Action]:
        """The tracker's revision, whether it is confirmed, and whether we hold origin duty."""
        gained = duty and not self.duty
        self.tracker_revision, self.confirmed, self.duty = revision, confirmed, duty
        if gained:  # a new duty holder checks the revision against the source first
            self.source_stale = True
            return [steps.Retake()]
        return []

    def tracker_moved(self, revision: str | None) -> None:
        """The tracker distributes ``revision`` (learned from a registration or its manifest)."""
        self.tracker_revision = revision

    def stale_source(self) -> None:
        """The source is known to differ from the revision (a check, a refused publication): pull
        nothing until it is taken again (:meth:`source_taken`)."""
        self.source_stale = True

    def source_taken(self, *, revision: str) -> None:
        """The revision was taken from the source and published: the tracker's, confirmed."""
        self.tracker_revision, self.confirmed, self.source_stale = revision, True, False

    def set_availability(self, availability: Sequence[int]) -> None:
        """The tracker's whole availability vector; chunks whose count grew are ready at once."""
        before = self.availability
        for index, (old, new) in enumerate(zip(before, availability, strict=False)):
            if new > old:
                self._ready_now(index)
        self.availability = availability

    def change_availability(self, levels: Mapping[int, int]) -> None:
        """Changes of the availability vector (chunk -> holders now); grown chunks are ready at once."""
        vector = list(self.availability)
        for index, level in levels.items():
            if 0 <= index < len(vector):
                if level > vector[index]:
                    self._ready_now(index)
                vector[index] = level
        self.availability = vector

    def availability_grew(self, indices: Iterable[int]) -> None:
        """Copies appeared of ``indices`` (the vector, shared, already says so): ready at once."""
        for index in indices:
            self._ready_now(index)

    def set_pulling(self, indices: Iterable[int]) -> None:
        """The chunks being pulled from the origin now (streamable from their puller)."""
        self.pulling = frozenset(indices)

    def pulling_changed(self, *, started: Iterable[int], stopped: Iterable[int]) -> None:
        """Pulls that started and stopped since the last view."""
        self.pulling = (frozenset(self.pulling) | frozenset(started)) - frozenset(stopped)

    def share_view(self, *, availability: Sequence[int], pulling: Set[int]) -> None:
        """Read availability and the chunks being pulled from live containers the caller keeps
        current (the simulator shares the tracker's own: news without a message per node); the
        core never writes them. Copies that appear must still be told (:meth:`availability_grew`)
        for chunks backing off."""
        self.availability, self.pulling = availability, pulling

    def _ready_now(self, index: int) -> None:
        self.retries.reset(index)
        self.not_before.pop(index, None)

    # -- planning --------------------------------------------------------------------------

    @property
    def downloading(self) -> int:
        """steps.Fetch and stream jobs running (each takes a download slot)."""
        return self._downloading

    @property
    def idle(self) -> bool:
        """Nothing left to fetch and nothing in flight."""
        return self.layout is not None and not self.missing and not self.jobs

    @property
    def starved(self) -> bool:
        """Nothing missing can be fetched or streamed now: wait for news (a watch), not a poll."""
        wanted = self.missing - self.candidates
        return not (self.pulling & wanted) and not any(self._available(i) for i in wanted)

    def may_pull(self) -> bool:
        return (
            self.duty
            and self.ours
            and self.confirmed
            and bool(self.missing)
            and not self.writes_paused
            and not self.source_stale
        )

    def tick(self, *, now: float) -> list[steps.Action]:
        """Start what the free slots allow: streams, fetches (rarest first, then the end game), claims."""
        actions: list[steps.Action] = []
        if self.may_pull():
            actions += self._claim(now)
        if self.layout is None or not self.missing or self.writes_paused:
            return actions
        free = self.settings.download_slots - self.downloading
        for index in self._stream_picks(free, now):
            self.stream_at[index] = now + self.settings.stream_retry * (0.5 + self.rng.random())
            job = self._start(index, Kind.STREAM)
            actions.append(steps.FindSource(job.id, index))
            free -= 1
        ready = [i for i in self.wanted if i not in self.by_chunk and self._ready(i, now)]
        picks = choice.rarest_first(candidates=ready, availability=self.availability, count=free, rng=self.rng)
        if not picks:
            flying = {i: self._fetching(i) for i in self.by_chunk if i in self.wanted}
            picks = choice.endgame(
                missing=self.wanted, in_flight=flying, free_slots=free, max_duplicates=self.settings.endgame_requests
            )
        for index in picks:
            job = self._start(index, Kind.FETCH)
            actions.append(steps.FindHolders(job.id, index))
        return actions

    def next_wakeup(self, *, now: float) -> float:
        """The first moment after ``now`` when a back-off, a stream retry or a claim retry ends
        (inf: none); a driver ticks then, and after every event."""
        times: list[float] = []
        if self.layout is not None and not self.writes_paused and self.downloading < self.settings.download_slots:
            waiting = [i for i in self.wanted if i not in self.by_chunk]
            times += [self.not_before.get(i, 0.0) for i in waiting]
            times += [self.retries.until(i) for i in waiting]
            times += [t for i, t in self.stream_at.items() if i in self.pulling and i in self.missing]
        if self.may_pull() and not self.claiming and self._free_reads(self.settings.origin_depth) > 0:
            times.append(self.claim_at)
            times += [self.pull_failures.until(i) for i in self.missing if self.pull_failures.failures(i)]
        return min((t for t in times if t > now), default=math.inf)

    def _ready(self, index: int, now: float) -> bool:
        return self.retries.ready(index, now=now) and self.not_before.get(index, 0.0) <= now

    def _fetching(self, index: int) -> int:
        return len(self.by_chunk.get(index, ()))

    def _available(self, index: int) -> bool:
        return index < len(self.availability) and self.availability[index] > 0

    def _stream_picks(self, free: int, now: float) -> list[int]:
        """Chunks being pulled from the origin that nobody holds yet, to stream from the puller."""
        streaming = sum(1 for i in self.by_chunk if i in self.pulling and not self._available(i))
        room = min(free, self.settings.max_streams - streaming)
        if room <= 0:
            return []
        ready = [
            i
            for i in sorted(self.pulling)
            if i in self.missing and i not in self.candidates and i not in self.by_chunk and i not in self.pulls
            and not self._available(i) and self.stream_at.get(i, 0.0) <= now
        ]  # fmt: skip
        return ready[:room]

    def _start(self, index: int, kind: Kind) -> Job:
        self._next_job += 1
        job = Job(id=self._next_job, index=index, kind=kind, generation=self.generation)
        self.jobs[job.id] = job
        if kind in (Kind.FETCH, Kind.STREAM):
            self.by_chunk.setdefault(index, set()).add(job.id)
            self._downloading += 1
        else:
            self.pulls[index] = job
        return job

    def _forget(self, job: Job) -> None:
        if self.jobs.pop(job.id, None) is not None and job.kind in (Kind.FETCH, Kind.STREAM):
            self._downloading -= 1
        flying = self.by_chunk.get(job.index)
        if flying is not None:
            flying.discard(job.id)
            if not flying:
                del self.by_chunk[job.index]
        if self.pulls.get(job.index) is job:
            del self.pulls[job.index]

    def _job(self, job_id: int) -> Job | None:
        job = self.jobs.get(job_id)
        if job is None or job.generation != self.generation:
            return None
        return job

    def abort(self, job_id: int, *, now: float) -> list[steps.Action]:
        """The job's step broke (not an I/O failure, those are results): end it as failed."""
        job = self._job(job_id)
        if job is None:
            return []
        if job.kind is Kind.PULL:
            return self.pull_failed(job_id, steps.PullFailure.ERROR, "the pull broke", now=now)
        if job.kind is Kind.REUSE:
            self._forget(job)
            return []
        job.failed = True
        return self._end(job, Outcome.FAILED, now)

    # -- fetch and stream jobs -------------------------------------------------------------

    def holders(self, job_id: int, holders: Sequence[choice.Holder] | None, *, now: float) -> list[steps.Action]:
        """The tracker's holders of the job's chunk (least loaded first; None: the tracker failed)."""
        job = self._job(job_id)
        if job is None:
            return []
        if holders is None or job.index not in self.hashes:  # nothing to check against: never blame a peer
            return self._end(job, Outcome.NOT_NOW, now)
        job.holders, job.position = list(holders), 0
        return self._next_holder(job, now)

    def sources(
        self,
        job_id: int,
        holders: Sequence[choice.Holder] | None,
        source: choice.Holder | None,
        *,
        now: float,
    ) -> list[steps.Action]:
        """For a stream job: the chunk's holders (the pull has ended) or the node pulling it now."""
        job = self._job(job_id)
        if job is None:
            return []
        if holders is None:
            return self._end(job, Outcome.NOT_NOW, now)
        if holders:
            job.holders, job.position = list(holders), 0
            if job.index in self.hashes:
                return self._next_holder(job, now)
            return [steps.AwaitHash(job.id, job.index, until=now + self.settings.hash_wait)]
        if source is None or self.avoid.get(source.name, 0.0) > now:
            return self._end(job, Outcome.NOT_NOW, now)
        job.holder = source
        return [steps.Fetch(job.id, job.index, source, stream=True)]

    def hash_waited(self, job_id: int, *, now: float) -> list[steps.Action]:
        """The wait for the job's chunk hash ended (it is known now, or the time is up)."""
        job = self._job(job_id)
        if job is None:
            return []
        if job.index in self.held:
            return self._end(job, Outcome.HELD, now)
        if job.index not in self.hashes:
            return self._end(job, Outcome.NOT_NOW, now)
        if job.got is not None:
            return self._check_stream(job, now)
        return self._next_holder(job, now)

    def fetched(self, job_id: int, result: steps.FetchResult, *, now: float) -> list[steps.Action]:
        """What the job's ``Fetch`` brought back."""
        job = self._job(job_id)
        if job is None or job.holder is None:
            return []
        holder, stream = job.holder, job.kind is Kind.STREAM and not job.holders
        actions = self._reached(holder, result, now)
        if isinstance(result, steps.Got):
            if stream:
                job.got = result
                if job.index not in self.hashes:
                    return [*actions, steps.AwaitHash(job.id, job.index, until=now + self.settings.hash_wait)]
                return [*actions, *self._check_stream(job, now)]
            if self._verified(job.index, result):
                return [*actions, self._store(job, source=holder.name)]
            self.avoid[holder.name] = math.inf
            self.rejected_chunks += 1
            job.failed = True
            return [*actions, steps.Report(peer=holder.name, index=job.index), *self._next_holder(job, now)]
        if isinstance(result, steps.Refused) and result.status == 429:
            self._avoid(holder.name, self.settings.retry_after * (0.5 + self.rng.random()), now)
        if isinstance(result, steps.Broken) and not stream:
            self._avoid(holder.name, self.settings.unreachable_avoid, now)
        job.failed |= isinstance(result, steps.Unreachable | steps.Broken)
        if stream:
            return [*actions, *self._end(job, Outcome.NOT_NOW, now)]
        return [*actions, *self._next_holder(job, now)]

    def stored(self, job_id: int, *, now: float) -> list[steps.Action]:
        """The job's ``Store`` finished (held now, or refused: already held, no room, moved on)."""
        job = self._job(job_id)
        if job is None:
            return []
        job.storing = False
        if job.index in self.held:
            if job.kind is Kind.STREAM:
                self.streamed_chunks += 1
            return self._end(job, Outcome.HELD, now)
        if job.kind is Kind.PULL:
            self._forget(job)
            return []
        return self._end(job, Outcome.FAILED if job.failed else Outcome.NOT_NOW, now)

    def _next_holder(self, job: Job, now: float) -> list[steps.Action]:
        while job.position < len(job.holders):
            holder = job.holders[job.position]
            job.position += 1
            if self.avoid.get(holder.name, 0.0) > now:
                continue
            if job.index in self.held:
                break
            job.holder = holder
            return [steps.Fetch(job.id, job.index, holder, stream=False)]
        if job.index in self.held:
            return self._end(job, Outcome.HELD, now)
        return self._end(job, Outcome.FAILED if job.failed else Outcome.NOT_NOW, now)

    def _check_stream(self, job: Job, now: float) -> list[steps.Action]:
        assert job.got is not None and job.holder is not None
        if job.index in self.held:
            return self._end(job, Outcome.HELD, now)
        if not self._verified(job.index, job.got):
            self.rejected_chunks += 1  # never claimed verified by the puller: no report
            return self._end(job, Outcome.NOT_NOW, now)
        return [self._store(job, source=job.holder.name)]

    def _store(self, job: Job, *, source: str | None) -> steps.Store:
        job.storing = True
        digest = self.hashes[job.index]
        return steps.Store(job.id, job.index, digest, from_origin=False, source=source, generation=job.generation)

    def _verified(self, index: int, got: steps.Got) -> bool:
        expected = self.hashes.get(index)
        if self.layout is None or expected is None or got.length != self.layout.chunk_length(index):
            return False
        return got.digest == expected

    def _reached(self, holder: choice.Holder, result: steps.FetchResult, now: float) -> list[steps.Action]:
        if not isinstance(result, steps.Unreachable):
            was = self.unreachable_in_a_row
            self.unreachable_in_a_row = 0
            return [steps.ClearProblem(PEER_UNREACHABLE)] if was else []
        self.unreachable_in_a_row += 1
        self._avoid(holder.name, self.settings.unreachable_avoid, now)
        if self.unreachable_in_a_row < self.settings.unreachable_problem_after:
            return []
        message = (
            f"the last {self.unreachable_in_a_row} peers asked for chunks could not be reached (latest {holder.name})"
        )
        return [steps.SetProblem(PEER_UNREACHABLE, message)]

    def _avoid(self, name: str, seconds: float, now: float) -> None:
        self.avoid[name] = max(self.avoid.get(name, 0.0), now + seconds)

    def _end(self, job: Job, outcome: Outcome, now: float) -> list[steps.Action]:
        """The job is over; when the chunk's last job ends unheld, the chunk backs off."""
        self._forget(job)
        index = job.index
        if index in self.held:
            self.retries.succeeded(index)
        elif index not in self.by_chunk:
            if outcome is Outcome.FAILED:
                self.retries.failed(index, now=now)
            else:
                self.not_before[index] = now + self.settings.retry_after * (0.5 + self.rng.random())
        return []

    # -- origin duty -----------------------------------------------------------------------

    def _claim(self, now: float) -> list[steps.Action]:
        depth = self.settings.origin_depth
        if self.claiming or now < self.claim_at or self._free_reads(depth) <= 0:
            return []
        waiting = len(self.given_up) + len(self.pull_failures)
        count = min(1024, depth + len(self.announce) + len(self.pulls) + waiting + 4)
        self.claiming = True
        return [steps.Claim(count)]

    def _free_reads(self, depth: int) -> int:
        # ``depth`` leading reads, plus one ending read overlapping the next (never more).
        reads = [j for j in self.pulls.values() if j.kind is Kind.PULL and j.reading]
        leading = sum(1 for j in reads if j.leading)
        return min(depth - leading, depth + 1 - len(reads))

    def claimed(self, indices: Sequence[int] | None, *, now: float) -> list[steps.Action]:
        """The tracker's answer to ``Claim`` (None: refused or failed): pull or reuse what is new."""
        self.claiming = False
        if indices is None or not self.may_pull():
            self.claim_at = now + self.settings.claim_retry
            return []
        fresh = [
            i
            for i in indices
            if i not in self.pulls and i not in self.held and i not in self.given_up
            and self.pull_failures.ready(i, now=now)
        ]  # fmt: skip
        actions: list[steps.Action] = []
        for index in fresh[: max(0, self._free_reads(self.settings.origin_depth))]:
            if index in self.candidates:
                actions.append(steps.Reuse(self._start(index, Kind.REUSE).id, index))
            else:
                actions.append(steps.Pull(self._start(index, Kind.PULL).id, index))
        if not actions:
            self.claim_at = now + self.settings.claim_retry
        return actions

    def reused(self, job_id: int) -> None:
        """A ``Reuse`` finished (the chunk is held now, or will be pulled on a later claim)."""
        job = self._job(job_id)
        if job is not None:
            self._forget(job)

    def pull_progress(self, job_id: int, *, filled: int, length: int, elapsed: float) -> bool:
        """The pull has ``filled`` of ``length`` bytes after ``elapsed`` seconds; True when it hands
        the origin pipe on now (the next read may start: tick)."""
        job = self._job(job_id)
        if job is None or not job.leading or elapsed <= 0:
            return False
        if (length - filled) * elapsed < self.settings.lookahead * filled:
            job.leading = False
            return True
        return False

    def pull_read(self, job_id: int) -> None:
        """The pull's read ended (whole, or failed): the origin pipe is free; hashing runs behind."""
        job = self._job(job_id)
        if job is not None:
            job.reading = job.leading = False

    def pulled(self, job_id: int, digest: str, *, now: float) -> list[steps.Action]:
        """The pulled chunk hashes to ``digest``: store it, unless it contradicts a published hash."""
        job = self._job(job_id)
        if job is None:
            return []
        job.reading = job.leading = False
        known = self.hashes.get(job.index)
        if known is not None and known != digest:
            self._forget(job)
            return self._mismatch(job.index, now)
        self.pull_failures.succeeded(job.index)
        job.storing = True
        store = steps.Store(job.id, job.index, digest, from_origin=True, source=None, generation=job.generation)
        return [steps.ClearProblem(ORIGIN_ERROR), store]

    def pull_failed(self, job_id: int, failure: steps.PullFailure, message: str, *, now: float) -> list[steps.Action]:
        """The pull failed (the source changed under it, or the origin failed)."""
        job = self._job(job_id)
        if job is None:
            return []
        self._forget(job)
        self.pull_failures.failed(job.index, now=now)
        if failure is steps.PullFailure.SOURCE_CHANGED:
            self.source_stale = True
            return [steps.Retake()]
        if self.pull_failures.failures(job.index) >= self.settings.origin_problem_after:
            return [steps.SetProblem(ORIGIN_ERROR, f"pulling chunk {job.index} failed repeatedly: {message}")]
        return []

    def _mismatch(self, index: int, now: float) -> list[steps.Action]:
        count = self.mismatches[index] = self.mismatches.get(index, 0) + 1
        if count >= self.settings.max_mismatches:
            self.given_up.add(index)
            digest = (self.revision or "?")[:16]
            message = (
                f"chunk {index} read from the source {count} times does not match manifest {digest}: "
                "the source changed; publish a new manifest"
            )
            return [steps.SetProblem(SOURCE_CHANGED, message)]
        self.pull_failures.failed(index, now=now)
        if now - self.manifest_checked > self.settings.manifest_recheck:  # a new manifest may be out
            self.manifest_checked = now
            self.source_stale = True
            return [steps.Retake()]
        return []
