"""Origin duty: the agent the tracker picked pulls chunks nobody holds and seeds them at once.

Rules:
- Only while the tracker grants origin duty (heartbeat ``origin_duty``); only the chunks the
  tracker assigned to us (``POST /v1/origin/claim``), so each chunk leaves the origin once while a
  copy lives inside. Up to ``origin_depth`` pulls read at once, all sharing the origin object's
  rate limit; the next read starts as soon as one has its bytes (hashing and storing run behind
  it), so the pipe never waits for the CPU.
- A pulled chunk is hashed here (off the event loop). With a published manifest the hash must
  match it, else the chunk is dropped and the mismatch logged (the origin changed). Without one,
  the hash is ours to publish: it rides with the chunk's announcement.
- The pulled chunk goes to the memory tier and is announced at once, so peers relay it while we
  pull the next ones. While it arrives, peers may stream its bytes from us (``agent.stream``).
- Publishing the layout: list the origin (or fetch ``--manifest-uri``) and PUT it to the tracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from ringseed.agent import origins, stream, tracker_client
from ringseed.protocol import manifest

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)
LOOKAHEAD_S = 0.5  # start the next origin read when this one has about this long to go


def get_origin(agent: Agent) -> origins.Origin:
    """The agent's origin object, opened on first use (only agents on origin duty open one)."""
    if agent.origin is None:
        agent.origin = origins.open_origin(agent.config.source, rate_limit=agent.config.origin_rate_limit)
    return agent.origin


async def close_origin(agent: Agent) -> None:
    origin, agent.origin = agent.origin, None
    if origin is not None:
        with contextlib.suppress(Exception):
            await origin.close()


async def publish_layout(agent: Agent) -> None:
    """List the source (or load its manifest) and publish it to the tracker."""
    hashes: list[str] | None = None
    if agent.config.manifest_uri:
        published = await origins.fetch_manifest(agent.config.manifest_uri)
        layout, hashes = published.layout, list(published.chunk_hashes)
    else:
        files = await get_origin(agent).list_files()
        layout = manifest.Layout.build(files, chunk_size=agent.config.chunk_size)
    log.info("Publishing layout: %d files, %d chunks", len(layout.files), layout.chunk_count)
    await agent.tracker.put_manifest(layout=layout.to_dict(), chunk_hashes=hashes)


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


async def origin_loop(agent: Agent) -> None:
    pulling: dict[int, asyncio.Task[None]] = {}
    reads = _Reads()
    while True:
        for index in [i for i, t in pulling.items() if t.done()]:
            task = pulling.pop(index)
            reads.finish(index)
            if not task.cancelled() and task.exception() is not None:
                log.warning("Pull of chunk %d from the origin failed: %r", index, task.exception())
        if not agent.origin_duty or agent.layout is None or not agent.missing:
            await asyncio.sleep(0.1)
            continue
        reads.changed.clear()
        free = reads.free(agent.config.origin_depth)
        if free > 0:
            for index in await _claim(agent, free, pulling):
                reads.start(index)
                pulling[index] = asyncio.create_task(pull(agent, index, reads=reads))
        if pulling:
            waiter = asyncio.ensure_future(reads.changed.wait())
            await asyncio.wait([*pulling.values(), waiter], timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        else:
            await asyncio.sleep(0.05)


async def _claim(agent: Agent, free: int, pulling: dict[int, asyncio.Task[None]]) -> list[int]:
    # Chunks pulled but not yet acknowledged stay assigned to us: ask for enough to see past them.
    count = min(1024, agent.config.origin_depth + len(agent.announce) + len(pulling) + 4)
    try:
        claimed = await agent.tracker.claim_origin(count)
    except tracker_client.TrackerClientError as exc:
        log.debug("Origin claim refused: %s", exc)
        return []
    return [i for i in claimed if i not in pulling and i not in agent.held][:free]


async def pull(agent: Agent, index: int, *, reads: _Reads | None = None) -> None:
    """Pull one chunk from the origin (peers may stream it meanwhile), hash it, seed it.

    With ``reads``, the pull hands the origin pipe on (:meth:`_Reads.hand_on`) as soon as the rest
    of its read should take less than ``LOOKAHEAD_S`` at the rate seen so far: the next read then
    starts while this one ends, so the pipe never idles between chunks (claiming and starting a
    request take a round trip or two, longer on a loaded node). The read's end is reported with
    :meth:`_Reads.finish` (hashing and storing run behind it).
    """
    assert agent.layout is not None
    origin = get_origin(agent)
    inflight = stream.Inflight(index, agent.layout.chunk_length(index))
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
        seconds = time.monotonic() - started
        log.info("Chunk %d pulled from the origin in %.2f s (%.1f MiB/s)", index, seconds, len(data) / seconds / 2**20)
        agent.fetched_bytes += len(data)
        digest = await asyncio.to_thread(manifest.chunk_sha256, memoryview(data))
        known = agent.hashes.get(index)
        if known is not None and known != digest:
            log.error("Chunk %d from the origin does not match the published hash; dropped", index)
            inflight.fail()
            return
        await agent.accept(index, data, digest=digest, from_origin=True)
    finally:
        agent.inflight.pop(index, None)
