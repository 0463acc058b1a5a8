"""Origin duty: the agent the tracker picked pulls chunks nobody holds and seeds them at once.

Rules:
- Only while the tracker grants origin duty (heartbeat ``origin_duty``) and this node holds the
  tracker's revision, confirmed from the source; only the chunks the tracker assigned to us
  (``POST /v1/origin/claim``), so each chunk leaves the origin once while a copy lives inside.
  Up to ``origin_depth`` pulls read at once, all sharing the origin object's rate limit; the
  next read starts as soon as one has its bytes (hashing and storing run behind it), so the
  pipe never waits for the CPU. Nothing is pulled while staging is full (``writes_paused``).
- Every read is pinned to the revision (``Origin.pin``: size and tag per file). A read that
  finds a file changed (:class:`origins.SourceChanged`) is discarded whole, never kept in part:
  pulling stops and the revision is taken from the source again (``source_changed``), so the
  swarm moves to the new revision; never a chunk of two versions.
- A pulled chunk is hashed here (off the event loop). With a published manifest the hash must
  match it, else the chunk is dropped, the manifest is fetched again (a new one is a new
  revision) and the chunk retried with back-off; after ``MAX_MISMATCHES`` such pulls the chunk
  is given up under this revision with the problem ``SourceChanged`` (the origin is never
  re-read without end). Without a manifest the hash is ours to publish: it rides with the
  chunk's announcement.
- Failed pulls back off per chunk (``ringseed.protocol.backoff``); ``OriginError`` is reported
  once a chunk failed ``PROBLEM_AFTER`` times, and cleared by the next good pull.
- A claimed chunk whose bytes stayed in staging from another revision is checked or proven
  locally first (``revisions``): only what changed is read from the origin again.
- The pulled chunk goes to the memory tier and is announced at once, so peers relay it while we
  pull the next ones. While it arrives, peers may stream its bytes from us (``agent.stream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from ringseed.agent import chunks, origins, problems, revisions, stream, tracker_client
from ringseed.protocol import backoff

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)
LOOKAHEAD_S = 0.5  # start the next origin read when this one has about this long to go
MAX_MISMATCHES = 3  # pulls of one chunk contradicting the published manifest before giving it up
PROBLEM_AFTER = 3  # consecutive failed pulls of a chunk before OriginError is reported


class Mismatch(Exception):
    """A pulled chunk does not match the published manifest's hash."""


def get_origin(agent: Agent) -> origins.Origin:
    """The agent's origin object, opened on first use (only agents on origin duty open one)."""
    if agent.origin is None:
        agent.origin = origins.open_origin(agent.config.source, rate_limit=agent.config.origin_rate_limit)
        pin_origin(agent)
    return agent.origin


def pin_origin(agent: Agent) -> None:
    """Pin the origin's reads to the revision this node holds."""
    if agent.origin is not None and agent.revision is not None:
        agent.origin.pin(agent.revision.pins())


async def close_origin(agent: Agent) -> None:
    origin, agent.origin = agent.origin, None
    if origin is not None:
        with contextlib.suppress(Exception):
            await origin.close()


class _Reads:
    """Which pulls still read from the origin; ``leading`` ones have not handed the pipe on yet."""

    def __init__(self) -> None:
        self.open: set[int] = set()
        self.leading: set[int] = set()
        self.changed = asyncio.Event()

    def start(self, index: int) -> None:
        self.open.add(index)
        self.leading.add(index)

    def hand_on(self, index: int) -> None:
        self.leading.discard(index)
        self.changed.set()

    def finish(self, index: int) -> None:
        self.open.discard(index)
        self.leading.discard(index)
        self.changed.set()

    def free(self, depth: int) -> int:
        # ``depth`` leading reads, plus one ending read overlapping the next (never more).
        return min(depth - len(self.leading), depth + 1 - len(self.open))


def _may_pull(agent: Agent) -> bool:
    return (
        agent.origin_duty
        and agent.revision is not None
        and agent.tracker_confirmed
        and agent.tracker_revision == agent.revision.id
        and bool(agent.missing)
        and not agent.writes_paused
        and not agent.source_changed.is_set()
    )


class _Failures:
    """Per-chunk back-off and give-ups of origin pulls, valid for one revision (``generation``)."""

    def __init__(self) -> None:
        self.backoff: backoff.Backoff[int] = backoff.Backoff(base=0.5, cap=60.0)
        self.mismatches: dict[int, int] = {}
        self.given_up: set[int] = set()
        self.generation = -1
        self.manifest_checked = 0.0

    def renew(self, generation: int) -> None:
        if generation != self.generation:
            self.backoff.clear()
            self.mismatches.clear()
            self.given_up.clear()
            self.generation = generation

    def ready(self, index: int, now: float) -> bool:
        return index not in self.given_up and self.backoff.ready(index, now=now)


async def origin_loop(agent: Agent) -> None:
    pulling: dict[int, asyncio.Task[None]] = {}
    local: dict[int, asyncio.Task[None]] = {}
    reads = _Reads()
    failures = _Failures()
    while True:
        failures.renew(agent.generation)
        _reap(agent, pulling, reads, failures)
        for index in [i for i, t in local.items() if t.done()]:
            local.pop(index)
        if not _may_pull(agent):
            await asyncio.sleep(0.1)
            continue
        reads.changed.clear()
        free = reads.free(agent.config.origin_depth)
        if free > 0:
            for index in await _claim(agent, free, pulling, local, failures):
                if index in agent.candidates:
                    local[index] = asyncio.create_task(_reuse_or_release(agent, index))
                    continue
                reads.start(index)
                pulling[index] = asyncio.create_task(pull(agent, index, reads=reads))
        if pulling or local:
            waiter = asyncio.ensure_future(reads.changed.wait())
            tasks = [*pulling.values(), *local.values(), waiter]
            await asyncio.wait(tasks, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        else:
            await asyncio.sleep(0.05)


def _reap(agent: Agent, pulling: dict[int, asyncio.Task[None]], reads: _Reads, failures: _Failures) -> None:
    now = time.monotonic()
    for index in [i for i, t in pulling.items() if t.done()]:
        task = pulling.pop(index)
        reads.finish(index)
        error = task.exception() if not task.cancelled() else None
        if task.cancelled() or failures.generation != agent.generation:
            continue
        if error is None:
            failures.backoff.succeeded(index)
            agent.problems.clear(problems.ORIGIN_ERROR)
        elif isinstance(error, origins.SourceChanged):
            log.warning("The source changed during a pull (%s); taking its new revision", error)
            failures.backoff.failed(index, now=now)
            agent.source_changed.set()
            agent.revision_news.set()
        elif isinstance(error, Mismatch):
            _mismatch(agent, index, error, failures, now)
        else:
            wait = failures.backoff.failed(index, now=now)
            log.warning("Pull of chunk %d from the origin failed (retry in %.1f s): %r", index, wait, error)
            if failures.backoff.failures(index) >= PROBLEM_AFTER:
                agent.problems.set(problems.ORIGIN_ERROR, f"pulling chunk {index} failed repeatedly: {error}")


def _mismatch(agent: Agent, index: int, error: Mismatch, failures: _Failures, now: float) -> None:
    count = failures.mismatches[index] = failures.mismatches.get(index, 0) + 1
    if count >= MAX_MISMATCHES:
        failures.given_up.add(index)
        digest = agent.revision.id[:16] if agent.revision is not None else "?"
        agent.problems.set(
            problems.SOURCE_CHANGED,
            f"chunk {index} read from the source {count} times does not match manifest {digest}: "
            "the source changed; publish a new manifest",
        )
        return
    wait = failures.backoff.failed(index, now=now)
    log.warning("%s (retry in %.1f s)", error, wait)
    if now - failures.manifest_checked > 10.0:  # a new manifest may have been published
        failures.manifest_checked = now
        agent.source_changed.set()
        agent.revision_news.set()


async def _claim(
    agent: Agent,
    free: int,
    pulling: dict[int, asyncio.Task[None]],
    local: dict[int, asyncio.Task[None]],
    failures: _Failures,
) -> list[int]:
    # Chunks pulled but not yet acknowledged, or waiting out a back-off, stay assigned to us:
    # ask for enough to see past them.
    waiting = len(failures.given_up) + len(failures.backoff)
    count = min(1024, agent.config.origin_depth + len(agent.announce) + len(pulling) + len(local) + waiting + 4)
    try:
        claimed = await agent.tracker.claim_origin(count)
    except tracker_client.TrackerClientError as exc:
        log.debug("Origin claim refused: %s", exc)
        return []
    now = time.monotonic()
    fresh = [i for i in claimed if i not in pulling and i not in local and i not in agent.held]
    return [i for i in fresh if failures.ready(i, now)][:free]


async def _reuse_or_release(agent: Agent, index: int) -> None:
    """A claimed chunk with bytes kept from another revision: hold it if they check out."""
    if index in agent.hashes:
        await revisions.check_candidate(agent, index)
        return
    generation = agent.generation
    digest = await revisions.prove(agent, index)
    agent.candidates.discard(index)  # proven now, or pulled from the origin on the next claim
    if digest is not None and generation == agent.generation and index not in agent.held:
        log.info("Chunk %d is unchanged in the new revision; proven from the bytes kept here", index)
        agent.reused_chunks += 1
        chunks.hold(agent, index, None, digest=digest, from_origin=True)
        agent.uncommitted.append((index, digest))


async def pull(agent: Agent, index: int, *, reads: _Reads | None = None) -> None:
    """Pull one chunk from the origin (peers may stream it meanwhile), hash it, seed it.

    With ``reads``, the pull hands the origin pipe on (:meth:`_Reads.hand_on`) as soon as the rest
    of its read should take less than ``LOOKAHEAD_S`` at the rate seen so far: the next read then
    starts while this one ends, so the pipe never idles between chunks (claiming and starting a
    request take a round trip or two, longer on a loaded node). The read's end is reported with
    :meth:`_Reads.finish` (hashing and storing run behind it). Raises what the read raised, or
    :class:`Mismatch`.
    """
    assert agent.layout is not None
    generation = agent.generation
    origin = get_origin(agent)
    inflight = stream.Inflight(index, agent.chunk_buffer(agent.layout.chunk_length(index)))
    agent.inflight[index] = inflight  # streamable until it is held (or dropped)
    started = time.monotonic()

    def progress(filled: int) -> None:
        inflight.advance(filled)
        if reads is not None and index in reads.leading:
            elapsed = time.monotonic() - started
            if elapsed > 0 and (inflight.length - filled) * elapsed < LOOKAHEAD_S * filled:
                reads.hand_on(index)

    try:
        try:
            await origins.read_chunk_into(origin, agent.layout, index, inflight.buffer, progress=progress)
        except BaseException:
            inflight.fail()
            raise
        finally:
            agent.origin_bytes = origin.bytes_read
            if reads is not None:
                reads.finish(index)
        data = inflight.buffer
        seconds = max(time.monotonic() - started, 1e-9)
        log.info("Chunk %d pulled from the origin in %.2f s (%.1f MiB/s)", index, seconds, len(data) / seconds / 2**20)
        agent.fetched_bytes += len(data)
        digest = await inflight.digest()  # hashed as it landed (stream.FillHash)
        known = agent.hashes.get(index)
        if known is not None and known != digest and generation == agent.generation:
            inflight.fail()
            raise Mismatch(f"chunk {index} from the origin does not match the published manifest; dropped")
        await chunks.accept(agent, index, data, digest=digest, from_origin=True, generation=generation)
    finally:
        agent.inflight.pop(index, None)
