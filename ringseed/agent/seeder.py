"""Origin duty's I/O: claims chunks from the tracker, pulls them from the origin, seeds them at once.

The decisions (whether to pull, how many reads, what to claim, back-off, give-ups, when the
source must be taken again) are :class:`ringseed.protocol.agentcore.AgentCore`'s; this module
carries out its :class:`~ringseed.protocol.agentsteps.Claim`, :class:`~ringseed.protocol.agentsteps.Pull`
and :class:`~ringseed.protocol.agentsteps.Reuse` steps. Rules of the I/O:

- Every read is pinned to the revision (``Origin.pin``: size and tag per file). A read that
  finds a file changed (:class:`origins.SourceChanged`) is discarded whole, never kept in part
  (``PullFailure.SOURCE_CHANGED``: the core stops pulling and asks for the source to be taken
  again, so the swarm moves to the new revision; never a chunk of two versions).
- A pulled chunk is hashed here (off the event loop); the core compares it with a published
  manifest's hash. Without a manifest the hash is ours to publish: it rides with the chunk's
  announcement.
- The read reports its progress to the core, which hands the origin pipe on (the next read
  starts) once the rest should take less than ``lookahead``; hashing and storing run behind.
- A claimed chunk whose bytes stayed in staging from another revision is checked or proven
  locally first (``revisions``): only what changed is read from the origin again.
- The pulled chunk goes to the memory tier and is announced at once, so peers relay it while we
  pull the next ones. While it arrives, peers may stream its bytes from us (``agent.stream``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from ringseed.agent import chunks, origins, revisions, stream, tracker_client
from ringseed.protocol import agentsteps

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)


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


async def claim(agent: Agent, step: agentsteps.Claim) -> list[agentsteps.Action]:
    try:
        claimed: list[int] | None = await agent.tracker.claim_origin(step.count)
    except tracker_client.TrackerClientError as exc:
        log.debug("Origin claim refused: %s", exc)
        claimed = None
    return agent.core.claimed(claimed, now=time.monotonic())


async def reuse(agent: Agent, step: agentsteps.Reuse) -> list[agentsteps.Action]:
    """A claimed chunk with bytes kept from another revision: hold it if they check out."""
    index = step.index
    try:
        if index in agent.hashes:
            await revisions.check_candidate(agent, index)
            return []
        generation = agent.generation
        digest = await revisions.prove(agent, index)
        if generation != agent.generation:
            return []
        agent.core.candidate_done(index)  # proven now, or pulled from the origin on the next claim
        if digest is not None and index not in agent.held:
            log.info("Chunk %d is unchanged in the new revision; proven from the bytes kept here", index)
            agent.reused_chunks += 1
            chunks.hold(agent, index, None, digest=digest, from_origin=True)
            chunks.journal(agent, index, digest)
    finally:
        agent.core.reused(step.job)
    return []


async def pull(agent: Agent, step: agentsteps.Pull) -> tuple[memoryview | bytearray | None, list[agentsteps.Action]]:
    """Read one chunk from the origin (peers may stream it meanwhile) and hash it; the bytes and
    the core's next steps (store them, or what the failure calls for)."""
    layout = agent.layout
    assert layout is not None
    index, core = step.index, agent.core
    origin = get_origin(agent)
    inflight = stream.Inflight(index, agent.chunk_buffer(layout.chunk_length(index)))
    agent.inflight[index] = inflight  # streamable until it is held (or dropped)
    started = time.monotonic()

    def progress(filled: int) -> None:
        inflight.advance(filled)
        elapsed = time.monotonic() - started
        if core.pull_progress(step.job, filled=filled, length=inflight.length, elapsed=elapsed):
            agent.changed.set()  # the next read may start

    try:
        await origins.read_chunk_into(origin, layout, index, inflight.buffer, progress=progress)
    except origins.SourceChanged as exc:
        log.warning("The source changed during a pull (%s); taking its new revision", exc)
        return None, _failed(agent, step, agentsteps.PullFailure.SOURCE_CHANGED, exc, inflight)
    except Exception as exc:
        log.warning("Pull of chunk %d from the origin failed: %r", index, exc)
        return None, _failed(agent, step, agentsteps.PullFailure.ERROR, exc, inflight)
    except BaseException:
        inflight.fail()
        agent.inflight.pop(index, None)
        raise
    finally:
        agent.origin_bytes = origin.bytes_read
    core.pull_read(step.job)
    agent.changed.set()
    data = inflight.buffer
    seconds = max(time.monotonic() - started, 1e-9)
    log.info("Chunk %d pulled from the origin in %.2f s (%.1f MiB/s)", index, seconds, len(data) / seconds / 2**20)
    agent.fetched_bytes += len(data)
    digest = await inflight.digest()  # hashed as it landed (stream.FillHash)
    actions = core.pulled(step.job, digest, now=time.monotonic())
    if not any(isinstance(a, agentsteps.Store) for a in actions):
        log.warning("Chunk %d from the origin does not match the published manifest; dropped", index)
        inflight.fail()
        agent.inflight.pop(index, None)
    return data, actions


def pulled_out(agent: Agent, index: int) -> None:
    """The pull's bytes are stored (or refused): new streams of it are not admitted; running
    ones read the whole buffer they hold."""
    agent.inflight.pop(index, None)


def _failed(
    agent: Agent, step: agentsteps.Pull, failure: agentsteps.PullFailure, exc: Exception, inflight: stream.Inflight
) -> list[agentsteps.Action]:
    inflight.fail()
    agent.inflight.pop(step.index, None)
    agent.changed.set()
    return agent.core.pull_failed(step.job, failure, str(exc) or repr(exc), now=time.monotonic())
