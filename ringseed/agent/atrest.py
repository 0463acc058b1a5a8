"""What is on disk stays true: publishing, checks of the staged and published copy, repair.

Rules:
- Publishing (:func:`publish_loop`): when every chunk of the current revision is held and
  written, the model is published (``publish.materialise``) and its manifest digest reported
  (``verified_digest``). With an expected digest (``RINGSEED_EXPECTED_DIGEST``) a model whose
  digest differs is never published (problem ``DigestMismatch``). A chunk dropped after
  publishing (``chunks.drop``) withdraws the marker; once the chunk is fetched again the model
  is published again, atomically. The loop looks when the held set, a drop or the revision
  changed (``agent.copy_news``), not on a timer: an idle agent does not wake for it.
- On start (:func:`check_published`): published files whose size, mtime or inode differ from
  what was recorded at publish have every chunk under them hashed again from staging; chunks
  that no longer match are dropped (``CorruptAtRest``, announced to the tracker, fetched again
  from peers) and the model is published again.
- On demand (``POST /v1/verify`` on the agent, ``--verify-on-start``): every held chunk is
  hashed from disk at full speed. In the background (:func:`scrub_loop`): the same, slowly
  (``scrub_rate`` bytes/s, from ``scrub_after`` seconds after publishing), pass after pass.
- When peers reported a chunk from this node as bad, the tracker lists it as ``suspect`` (and no
  longer lists this node as its holder): its copies in memory and on disk are hashed at once; a
  bad one is dropped and fetched again, a sound one is announced again.
- A chunk whose disk write is still in flight is not checked (its bytes are in memory, verified).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringseed.agent import chunks, problems, publish, revisions
from ringseed.protocol import manifest

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)
PUBLISH_SAFETY_NET_S = 1.0  # look again without news this often (a held set changed past ``chunks``)


@dataclass
class CheckState:
    """Checks of the bytes at rest: counters and the running on-demand check."""

    checked: int = 0
    bad: int = 0
    dropped: int = 0
    passes: int = 0
    verifying: asyncio.Task[None] | None = None
    rechecks: set[asyncio.Task[None]] = field(default_factory=set)
    suspects: set[int] = field(default_factory=set)  # being checked after peers reported them
    published_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        running = self.verifying is not None and not self.verifying.done()
        return {"checked": self.checked, "bad": self.bad, "passes": self.passes, "verify_running": running}


def _chunks_of_files(agent: Agent, paths: Iterable[str]) -> list[int]:
    layout = agent.layout
    assert layout is not None
    wanted = set(paths)
    out: set[int] = set()
    for entry in layout.files:
        if entry.path in wanted and entry.size:
            out.update(
                range(entry.offset // layout.chunk_size, (entry.offset + entry.size - 1) // layout.chunk_size + 1)
            )
    return sorted(out)


async def check_chunk(agent: Agent, index: int) -> bool:
    """Hash held chunk ``index`` from disk; drop it if it no longer matches. False if it was bad."""
    expected = agent.held.get(index)
    if expected is None or index in agent.pending_writes:
        return True
    generation = agent.generation
    try:
        digest = await asyncio.to_thread(revisions.local_hash, agent.store, index)
    except OSError as exc:  # a staged file gone or unreadable: the chunk is not there any more
        log.warning("Reading chunk %d from staging failed: %s", index, exc)
        digest = None
    if generation != agent.generation or agent.held.get(index) != expected:
        return True
    agent.check.checked += 1
    if digest == expected:
        return True
    agent.check.bad += 1
    log.warning("Chunk %d on disk no longer matches its hash; dropping it and fetching it again", index)
    agent.problems.set(problems.CORRUPT_AT_REST, f"chunk {index} rotted on disk; fetching it again from peers")
    chunks.drop(agent, index)
    return False


async def check_chunks(agent: Agent, indices: Iterable[int]) -> int:
    """Check ``indices`` one after another; the number found bad."""
    bad = 0
    for index in indices:
        bad += not await check_chunk(agent, index)
    return bad


async def check_published(agent: Agent) -> None:
    """On start: re-check the chunks of published files that changed since they were published."""
    if agent.layout is None or publish.read_marker(agent.model_dir) is None:
        return
    changed = await asyncio.to_thread(publish.changed_files, agent.store, agent.model_dir)
    if not changed:
        return
    log.warning("Published files changed since they were published: %s; checking their chunks", changed[:8])
    agent.must_republish = True
    bad = await check_chunks(agent, _chunks_of_files(agent, changed))
    if bad:
        await asyncio.to_thread(publish.withdraw, agent.model_dir)


def start_verify(agent: Agent) -> bool:
    """Hash every held chunk from disk in the background now; False if a check is running."""
    if agent.check.verifying is not None and not agent.check.verifying.done():
        return False

    async def run() -> None:
        bad = await check_chunks(agent, sorted(agent.held))
        log.info("Full check of the copy at rest done: %d chunk(s) bad", bad)

    agent.check.verifying = asyncio.create_task(run())
    return True


async def stop_verify(agent: Agent) -> None:
    tasks = [t for t in [agent.check.verifying, *agent.check.rechecks] if t is not None]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def start_recheck(agent: Agent, indices: list[int]) -> None:
    """Check chunks peers reported bad from us (the tracker's ``suspect``), each once at a time."""
    for index in indices:
        if index in agent.held and index not in agent.check.suspects:
            agent.check.suspects.add(index)
            task = asyncio.create_task(_recheck(agent, index))
            agent.check.rechecks.add(task)
            task.add_done_callback(agent.check.rechecks.discard)


async def _recheck(agent: Agent, index: int) -> None:
    """Drop a suspect chunk whose copy in memory or on disk is bad; announce it again if both are sound."""
    try:
        expected, cached = agent.held.get(index), agent.memory.get(index)
        if cached is not None and await asyncio.to_thread(manifest.chunk_sha256, memoryview(cached)) != expected:
            log.warning("Chunk %d in memory no longer matches its hash; dropping it", index)
            chunks.drop(agent, index)
            return
        if await check_chunk(agent, index) and agent.held.get(index) == expected and expected is not None:
            log.info("Chunk %d was reported bad by peers but checks out here; announcing it again", index)
            agent.core.reannounce(index)
            agent.news.set()
    finally:
        agent.check.suspects.discard(index)


async def scrub_loop(agent: Agent) -> None:
    """Re-hash the held chunks from disk, slowly, pass after pass, while the model is published."""
    rate = agent.config.scrub_rate
    while True:
        await asyncio.sleep(1.0)
        if rate <= 0 or agent.verified_digest is None or agent.layout is None:
            continue
        if time.monotonic() - agent.check.published_at < agent.config.scrub_after:
            continue
        generation = agent.generation
        for index in sorted(agent.held):
            if generation != agent.generation or agent.verified_digest is None:
                break
            await check_chunk(agent, index)
            await asyncio.sleep(agent.layout.chunk_length(index) / rate if agent.layout else 0)
        else:
            agent.check.passes += 1


def _complete(agent: Agent) -> bool:
    layout = agent.layout
    # every held chunk's hash is in ``hashes`` (chunks.hold), so all held means all hashes known
    return layout is not None and agent.verified_digest is None and len(agent.held) == layout.chunk_count


async def publish_loop(agent: Agent) -> None:
    """Publish the model whenever the current revision is complete and not published yet."""
    refused: tuple[int, int] | None = None  # (generation, drops) of a digest refused as unexpected
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agent.copy_news.wait(), timeout=PUBLISH_SAFETY_NET_S)
        agent.copy_news.clear()
        if not _complete(agent) or refused == (agent.generation, agent.check.dropped):
            continue
        generation, drops = agent.generation, agent.check.dropped
        await chunks.drain_writes(agent)
        if not _complete(agent) or (generation, drops) != (agent.generation, agent.check.dropped):
            continue
        layout = agent.layout
        assert layout is not None
        digest = manifest.Manifest(
            layout=layout, chunk_hashes=tuple(agent.hashes[i] for i in range(layout.chunk_count))
        ).digest
        await chunks.commit(agent)
        if agent.config.expected_digest and digest != agent.config.expected_digest:
            agent.problems.set(
                problems.DIGEST_MISMATCH,
                f"the model's digest {digest[:16]} is not the expected "
                f"{agent.config.expected_digest[:16]}; not published",
            )
            refused = (generation, drops)
            continue
        assert agent.revision is not None
        published = await asyncio.to_thread(
            publish.materialise,
            agent.store,
            model_dir=agent.model_dir,
            digest=digest,
            revision_id=agent.revision.id,
            force=agent.must_republish,
        )
        if not published or (generation, drops) != (agent.generation, agent.check.dropped):
            continue  # moved to another revision, or a chunk was dropped meanwhile: not verified after all
        agent.must_republish = False
        agent.verified_digest = digest
        agent.check.published_at = time.monotonic()
        agent.problems.clear(problems.CORRUPT_AT_REST)
        agent.news.set()
        log.info("Model complete and verified at %s (digest %s)", agent.model_dir, digest[:16])
