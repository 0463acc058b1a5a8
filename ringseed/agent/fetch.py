"""Peer downloads: rarest first, least-loaded holder, bounded slots, end-game, verify before use.

Rules:
- Only chunks whose hash is known are fetched, and only from peers (never from the origin).
- Up to ``download_slots`` requests at once; the chunk is chosen by
  :func:`ringseed.protocol.choice.rarest_first` over the tracker's availability. End-game
  duplicates (:func:`ringseed.protocol.choice.endgame`) are capped by ``ENDGAME_REQUESTS``, now 1
  (off): on the testbed a second request for the last chunk took an upload slot another node
  needed and split the holder's uplink, so the tail got longer (N=16: 30.3 s -> 28.1 s without).
- A chunk nobody could give (no holder yet, every holder busy) is tried again after
  ``RETRY_AFTER_S`` (jittered), short so that a copy or a slot that just appeared is used at
  once. A chunk whose fetch failed (a peer unreachable, a body cut short, a wrong hash) backs
  off per chunk (``ringseed.protocol.backoff``: ``RETRY_AFTER_S`` doubling up to
  ``RETRY_CAP_S``); a chunk whose availability grows (a copy just appeared) is tried at once.
  After ``UNREACHABLE_PROBLEM_AFTER`` peers in a row could not be reached, the node reports
  ``PeerUnreachable`` until one answers.
- Nothing new starts while staging is full (``writes_paused``), and candidates (bytes kept from
  another revision, checked by hash in ``revisions``) are not fetched.
- Requests name the revision (``?revision=``): a peer on another revision answers 409 and is
  not blamed; a chunk received after this node moved to another revision is discarded.
- Holders come from the tracker, least loaded first; a busy holder (429), an unreachable one
  or a 404 makes us try the next. An unreachable peer is avoided for a few seconds, a busy one
  for about ``RETRY_AFTER_S`` (no request for any chunk: its slots free at the pace of whole
  chunks, and every refusal costs it a request's worth of CPU).
- Every received chunk is checked (length and SHA-256) before it is stored, announced or
  served. A mismatch is reported to the tracker (which penalises the peer) and the peer is
  avoided for good by this agent.
- Bytes land in a pooled chunk buffer (``agent.chunk_buffer``) and are hashed as they arrive
  (:mod:`ringseed.agent.peerclient`), so verifying costs no second pass over the chunk.
- Cut-through: a chunk the tracker lists as being pulled from the origin (``pulling``) and
  that nobody holds yet may be streamed from the puller (``?stream=1``, :mod:`ringseed.agent.stream`),
  at most ``MAX_STREAMS`` at once, each taking a download slot. The streamed bytes are checked
  against the tracker's hash, which is known only once the puller has the whole chunk: the
  agent waits for it (a watch of the chunk) for up to ``HASH_WAIT_S``. A stream that breaks, is
  refused (429) or does not match is dropped without penalty (the bytes were never claimed
  verified) and the chunk is fetched from holders as usual.
- Waiting is a long-poll, never a poll: a node that has nothing it can fetch or stream parks a
  watch of any chunk it lacks (``POST /v1/watch``), and one waiting for a streamed chunk's hash
  watches that chunk; the tracker answers when a copy appears or a pull starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ringseed.agent import chunks, problems, tracker_client
from ringseed.protocol import backoff, choice

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)
UNREACHABLE_AVOID_S = 5.0
RETRY_AFTER_S = 0.1
RETRY_CAP_S = 2.0
UNREACHABLE_PROBLEM_AFTER = 20
ENDGAME_REQUESTS = 1  # outstanding requests per chunk in the end game (1: no duplicates)
MAX_STREAMS = 1  # chunks streamed from the origin puller at once
STREAM_RETRY_S = 0.5
HASH_WAIT_S = 30.0


class Outcome(enum.Enum):
    """How one attempt at a chunk ended."""

    HELD = "held"
    NOT_NOW = "not_now"  # no holder yet, every holder busy, nothing to check against: try again soon
    FAILED = "failed"  # a peer unreachable, a body cut short, a wrong hash: back off


class _Retries:
    """When each chunk may be tried again; a chunk whose availability grew is ready at once."""

    def __init__(self, rng: random.Random) -> None:
        self.backoff: backoff.Backoff[int] = backoff.Backoff(base=RETRY_AFTER_S, cap=RETRY_CAP_S, rng=rng)
        self.not_before: dict[int, float] = {}
        self.seen: list[int] = []
        self.generation = -1

    def ready(self, index: int, now: float) -> bool:
        return self.backoff.ready(index, now=now) and self.not_before.get(index, 0.0) <= now

    def renew(self, agent: Agent) -> None:
        if agent.generation != self.generation:
            self.backoff.clear()
            self.not_before.clear()
            self.seen, self.generation = [], agent.generation
        if agent.availability is not self.seen:
            for index, (before, now) in enumerate(zip(self.seen, agent.availability, strict=False)):
                if now > before:
                    self.backoff.reset(index)
                    self.not_before.pop(index, None)
            self.seen = agent.availability


async def download_loop(agent: Agent) -> None:
    rng = random.Random()
    tasks: dict[int, set[asyncio.Task[Outcome]]] = {}
    retries = _Retries(rng)
    stream_retry_at: dict[int, float] = {}
    waiting: asyncio.Task[None] | None = None
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(agent.changed.wait(), timeout=0.2)
        agent.changed.clear()
        retries.renew(agent)
        _reap(agent, tasks, retries)
        if agent.layout is not None and not agent.missing and not tasks:
            agent.buffers.trim()  # nothing left to fetch: give the idle chunk buffers back
        if agent.layout is None or not agent.missing or agent.writes_paused:
            continue
        in_flight = {i: len(ts) for i, ts in tasks.items()}
        free = agent.config.download_slots - sum(in_flight.values())
        now = time.monotonic()
        for index in _stream_picks(agent, tasks, stream_retry_at, free=free, now=now):
            stream_retry_at[index] = now + STREAM_RETRY_S * (0.5 + random.random())
            _launch(agent, tasks, index, stream_chunk(agent, index))
            free -= 1
        wanted = agent.missing - agent.candidates
        ready = [i for i in wanted if i in agent.hashes and i not in tasks and retries.ready(i, now)]
        picks = choice.rarest_first(candidates=ready, availability=agent.availability, count=free, rng=rng)
        if not picks:
            in_flight = {i: len(ts) for i, ts in tasks.items()}
            picks = choice.endgame(
                missing=wanted, in_flight=in_flight, free_slots=free, max_duplicates=ENDGAME_REQUESTS
            )
        for index in picks:
            _launch(agent, tasks, index, fetch_chunk(agent, index))
        if not tasks and (waiting is None or waiting.done()) and _starved(agent, wanted):
            waiting = asyncio.create_task(agent.watch(None, wait=agent.heartbeat_interval))
            waiting.add_done_callback(lambda _: agent.changed.set())


def _starved(agent: Agent, wanted: set[int]) -> bool:
    """Nothing we lack can be fetched or streamed now: wait for news (a watch) instead of polling."""
    return not agent.pulling & wanted and not any(_available(agent, i) for i in wanted)


def _launch(agent: Agent, tasks: dict[int, set[asyncio.Task[Outcome]]], index: int, job: Any) -> None:
    task = asyncio.create_task(job)
    task.add_done_callback(lambda _: agent.changed.set())
    tasks.setdefault(index, set()).add(task)


def _stream_picks(
    agent: Agent, tasks: dict[int, set[asyncio.Task[Outcome]]], retry_at: dict[int, float], *, free: int, now: float
) -> list[int]:
    """Chunks being pulled from the origin that nobody holds yet, to stream from the puller."""
    streaming = sum(1 for i in tasks if i in agent.pulling and not _available(agent, i))
    room = min(free, MAX_STREAMS - streaming)
    if room <= 0:
        return []
    ready = [
        i
        for i in sorted(agent.pulling)
        if i in agent.missing and i not in agent.candidates and i not in tasks and i not in agent.inflight
        and not _available(agent, i) and retry_at.get(i, 0) <= now
    ]  # fmt: skip
    return ready[:room]


def _available(agent: Agent, index: int) -> bool:
    return index < len(agent.availability) and agent.availability[index] > 0


def _reap(agent: Agent, tasks: dict[int, set[asyncio.Task[Outcome]]], retries: _Retries) -> None:
    for index in list(tasks):
        running = {t for t in tasks[index] if not t.done()}
        finished = tasks[index] - running
        outcomes = {Outcome.FAILED if t.cancelled() or t.exception() is not None else t.result() for t in finished}
        if index in agent.held:
            for task in running:
                task.cancel()
            running = set()
            retries.backoff.succeeded(index)
        elif finished and not running and Outcome.FAILED in outcomes:
            retries.backoff.failed(index, now=time.monotonic())
        elif finished and not running:
            retries.not_before[index] = time.monotonic() + RETRY_AFTER_S * (0.5 + random.random())
        for task in finished:
            if not task.cancelled() and task.exception() is not None:
                log.warning("Fetch of chunk %d failed: %r", index, task.exception())
        if running:
            tasks[index] = running
        else:
            del tasks[index]


def _reached(agent: Agent, holder: choice.Holder, *, ok: bool) -> None:
    """Count peers that could not be reached in a row; ``PeerUnreachable`` past a bound."""
    if ok:
        agent.unreachable_in_a_row = 0
        agent.problems.clear(problems.PEER_UNREACHABLE)
        return
    agent.unreachable_in_a_row += 1
    _avoid(agent, holder, UNREACHABLE_AVOID_S)
    if agent.unreachable_in_a_row >= UNREACHABLE_PROBLEM_AFTER:
        agent.problems.set(
            problems.PEER_UNREACHABLE,
            f"the last {agent.unreachable_in_a_row} peers asked for chunks could not be reached (latest {holder.name})",
        )


async def fetch_chunk(agent: Agent, index: int) -> Outcome:
    """Fetch ``index`` from the least-loaded healthy holder; True once it is held."""
    generation = agent.generation
    try:
        peers = await agent.tracker.peers(index)
    except tracker_client.TrackerClientError:
        return Outcome.NOT_NOW
    return await _from_holders(agent, index, peers, generation=generation)


async def _from_holders(agent: Agent, index: int, peers: list[dict[str, Any]], *, generation: int) -> Outcome:
    if index not in agent.hashes:  # nothing to check against (never blame a peer for that)
        return Outcome.NOT_NOW
    failed = False
    now = time.monotonic()
    holders = [choice.Holder(name=p["name"], url=p["url"], load=int(p.get("load", 0))) for p in peers]
    for holder in holders:
        if agent.avoid.get(holder.name, 0.0) > now or index in agent.held or generation != agent.generation:
            continue
        started = time.monotonic()
        body = await _get(agent, holder, index)
        failed |= body is None
        if not isinstance(body, Body) or generation != agent.generation:
            continue
        log.info("Chunk %d from %s in %.2f s", index, holder.name, time.monotonic() - started)
        if _verified(agent, index, body):
            digest = agent.hashes[index]
            await chunks.accept(
                agent, index, body.data, digest=digest, from_origin=False, generation=generation, source=holder.name
            )
            break
        if generation == agent.generation:
            failed = True
            await _penalise(agent, holder, index)
    if index in agent.held:
        return Outcome.HELD
    return Outcome.FAILED if failed else Outcome.NOT_NOW


async def stream_chunk(agent: Agent, index: int) -> Outcome:
    """Stream ``index`` from the node pulling it (or fetch it from holders if there are some now).

    A stream that is refused, cut short or does not match is NOT_NOW, never held against anyone.
    """
    generation = agent.generation
    try:
        peers, source = await agent.tracker.sources(index)
    except tracker_client.TrackerClientError:
        return Outcome.NOT_NOW
    if peers:  # the pull has finished meanwhile; the hash is known to the tracker, soon to us
        if await _await_hash(agent, index) is None:
            return Outcome.NOT_NOW
        return await _from_holders(agent, index, peers, generation=generation)
    if source is None or agent.avoid.get(str(source.get("name")), 0.0) > time.monotonic():
        return Outcome.NOT_NOW
    holder = choice.Holder(name=str(source["name"]), url=str(source["url"]), load=0)
    started = time.monotonic()
    body = await _get(agent, holder, index, stream=True)
    if not isinstance(body, Body):
        return Outcome.NOT_NOW
    expected = await _await_hash(agent, index)
    if expected is None or index in agent.held or generation != agent.generation:
        return Outcome.HELD if index in agent.held else Outcome.NOT_NOW
    if not _verified(agent, index, body):
        log.warning("Chunk %d streamed from %s does not match the tracker's hash; dropped", index, holder.name)
        agent.rejected_chunks += 1
        return Outcome.NOT_NOW
    log.info("Chunk %d streamed from %s in %.2f s (verified)", index, holder.name, time.monotonic() - started)
    if await chunks.accept(
        agent, index, body.data, digest=expected, from_origin=False, generation=generation, source=holder.name
    ):
        agent.streamed_chunks += 1
    return Outcome.HELD if index in agent.held else Outcome.NOT_NOW


async def _await_hash(agent: Agent, index: int) -> str | None:
    """The tracker's hash of ``index``: known once the puller announced it; a watch of the chunk
    (a long-poll) brings it at once."""
    deadline = time.monotonic() + HASH_WAIT_S
    generation = agent.generation
    while index not in agent.hashes and generation == agent.generation:
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning("No hash for streamed chunk %d within %.0f s; dropping it", index, HASH_WAIT_S)
            return None
        await agent.watch([index], wait=min(left, agent.heartbeat_interval))
    return agent.hashes.get(index) if generation == agent.generation else None


def _verified(agent: Agent, index: int, body: Body) -> bool:
    """The body is exactly chunk ``index``: its length and the SHA-256 taken as it arrived."""
    expected = agent.hashes.get(index)
    if agent.layout is None or expected is None or len(body.data) != agent.layout.chunk_length(index):
        return False
    return body.digest == expected


async def _penalise(agent: Agent, holder: choice.Holder, index: int) -> None:
    log.warning("Peer %s served chunk %d with a wrong hash; reporting and avoiding it", holder.name, index)
    agent.avoid[holder.name] = math.inf
    agent.rejected_chunks += 1
    with contextlib.suppress(tracker_client.TrackerClientError):
        await agent.tracker.report(peer=holder.name, chunk=index)


@dataclass(frozen=True)
class Body:
    """A chunk's bytes as received (a pooled buffer's view) and their SHA-256 (None: never a match)."""

    data: memoryview
    digest: str | None


async def _get(agent: Agent, holder: choice.Holder, index: int, *, stream: bool = False) -> Body | int | None:
    """The body of ``GET /v1/chunks/{index}`` from ``holder`` with its digest; the status if it is
    not 200 (busy, not held, another revision); None if the peer failed (unreachable, cut short).

    ``stream``: ask for the bytes as they arrive from the origin (no total time limit, since the
    origin sets the pace; 30 s without a byte ends it). A stream cut short is not held against the
    peer (its origin pull may have failed). A body longer than the chunk comes back without a
    digest, so that it fails verification and the peer is reported.
    """
    assert agent.layout is not None
    length = agent.layout.chunk_length(index)
    deadline = None if stream else time.monotonic() + 30 + length / (4 << 20)
    query = {"revision": agent.revision.id} if agent.revision is not None else {}
    if stream:
        query["stream"] = "1"
    buffer = agent.chunk_buffer(length)
    reply = await agent.peer_client.get(holder.url, index, query=query, into=buffer, read_timeout=30, deadline=deadline)
    agent.fetched_bytes += reply.received
    if reply.status == 0:
        log.info("Peer %s unreachable for chunk %d: %s", holder.name, index, reply.error)
        _reached(agent, holder, ok=False)
        return None
    _reached(agent, holder, ok=True)
    if reply.status == 429:  # its slots free at the pace of whole chunks: ask it for nothing a while
        _avoid(agent, holder, RETRY_AFTER_S * (0.5 + random.random()))
    if reply.status != 200:
        return reply.status
    if reply.too_long:
        return Body(data=buffer, digest=None)
    if reply.complete and reply.received == length:
        return Body(data=buffer, digest=reply.digest)
    log.info("Peer %s broke off chunk %d after %d bytes: %s", holder.name, index, reply.received, reply.error)
    if not stream:
        _avoid(agent, holder, UNREACHABLE_AVOID_S)
    return None


def _avoid(agent: Agent, holder: choice.Holder, seconds: float) -> None:
    agent.avoid[holder.name] = max(agent.avoid.get(holder.name, 0.0), time.monotonic() + seconds)
