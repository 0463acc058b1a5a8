"""Holding verified chunks: memory first, disk behind, journal after; drops; a full disk.

Rules:
- A verified chunk is held (pinned in the memory tier, announced, served from memory) at once;
  its disk write runs behind it, at most ``MAX_PENDING_WRITES`` (and the memory budget) at a
  time. Its journal line is queued only after the write finished; materialising waits for
  every pending write.
- A chunk received in place (:func:`accept_landed`: its bytes are in staging already) is held
  and its journal line queued at once, with nothing in the memory tier: it is served from
  staging with ``sendfile``. Every chunk held under the current revision is remembered
  (``agent.once_held``) and never received in place again under it: a journal line may name
  it until its drop is committed.
- Work that started under another revision than the current one (``generation``) is never
  held: its index means another chunk now.
- A chunk the node stops holding after it was announced (its write failed, its bytes rotted,
  its hash disagrees with the tracker's) is *dropped*: forgotten here, journaled as dropped, and
  announced to the tracker (heartbeat ``dropped``) so no peer is sent to it. Dropping any chunk
  of a published model withdraws the model's marker until it is repaired and published again.
- Full disk: before a chunk is held the staging must have room for it (``Store.room_for``: free
  space and the ``--ssd-bytes`` budget). No room, or ENOSPC from a write, sets ``DiskFull`` and
  pauses fetching and origin pulls (``writes_paused``); :func:`disk_loop` resumes them as soon as
  room for a chunk returns. Another write error (EIO, EROFS) sets ``WriteFailed`` and pauses
  with a bounded back-off before trying again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from typing import TYPE_CHECKING

from ringseed.agent import cache, problems, publish, store

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)
MAX_PENDING_WRITES = 8  # write-behind chunks in flight (also bounded by the memory budget)
DISK_CHECK_S = 1.0
COMMIT_BATCH_S = 0.2  # journal lines queued this close together share one commit (one fsync)
SAFETY_NET_S = 5.0  # commit even without news this often (a queue written past ``journal``)


async def accept(
    agent: Agent,
    index: int,
    data: cache.Data | store.Landing,
    *,
    digest: str,
    from_origin: bool,
    generation: int,
    source: str | None = None,
) -> bool:
    """Hold a verified chunk: pinned in memory, announced at once, written to disk behind it
    (received in place, a :class:`store.Landing`: see :func:`accept_landed`).

    ``source`` names the peer the bytes came from: the announcement carries it, as evidence for
    the tracker that the peer serves good chunks.

    False if already held, if the revision changed since the work began, or if staging has no
    room (``DiskFull``: fetching pauses). The journal line is queued only when the write has
    finished. At most ``memory budget // chunk`` writes are in flight (back-pressure on the
    caller); a chunk too big for the memory tier is written before it counts as held.
    """
    if isinstance(data, store.Landing):
        return accept_landed(
            agent, index, data, digest=digest, from_origin=from_origin, generation=generation, source=source
        )
    if not _current(agent, index, generation):
        return False
    if not _has_room(agent, len(data)):
        return False
    limit = min(MAX_PENDING_WRITES, agent.memory.budget // max(1, len(data)))
    if limit < 1:
        try:
            await asyncio.to_thread(agent.store.write_chunk, index, data)
        except OSError as exc:
            write_failed(agent, exc)
            return False
        if not _current(agent, index, generation):
            return False
        hold(agent, index, data, digest=digest, from_origin=from_origin, source=source)
        journal(agent, index, digest)
        return True
    while len(agent.pending_writes) >= limit:
        await asyncio.wait(set(agent.pending_writes.values()), return_when=asyncio.FIRST_COMPLETED)
    if not _current(agent, index, generation) or index in agent.pending_writes:
        return False
    agent.memory.put(index, data, pin=True)
    hold(agent, index, data, digest=digest, from_origin=from_origin, source=source)
    agent.pending_writes[index] = asyncio.create_task(_write_behind(agent, index, data, digest, generation))
    return True


def accept_landed(
    agent: Agent,
    index: int,
    landing: store.Landing,
    *,
    digest: str,
    from_origin: bool,
    generation: int,
    source: str | None = None,
) -> bool:
    """Hold a verified chunk received in place (its bytes are in staging: announced at once,
    journaled at the next commit after they are synced). Ends the claim either way; False if
    already held or the revision changed since the work began."""
    if landing.aborted or not _current(agent, index, generation):
        landing.release()
        return False
    landing.release(landed=True)
    agent.landed_chunks += 1
    hold(agent, index, None, digest=digest, from_origin=from_origin, source=source)
    journal(agent, index, digest)
    return True


def _current(agent: Agent, index: int, generation: int) -> bool:
    return generation == agent.generation and agent.layout is not None and index not in agent.held


def hold(
    agent: Agent,
    index: int,
    data: cache.Data | None,
    *,
    digest: str,
    from_origin: bool,
    source: str | None = None,
) -> None:
    """Mark a verified chunk held and announce it (``data`` goes to the memory tier if given);
    other downloads of it stop."""
    if data is not None and index not in agent.memory.pinned:
        agent.memory.put(index, data)
    agent.once_held.add(index)
    agent.perform(agent.core.held_chunk(index, digest, from_origin=from_origin, source=source))
    agent.news.set()
    agent.changed.set()
    agent.copy_news.set()


def journal(agent: Agent, index: int, digest: str) -> None:
    """Queue the journal line of held chunk ``index`` (its bytes are in staging now)."""
    agent.uncommitted.append((index, digest))
    agent.journal_news.set()


async def _write_behind(agent: Agent, index: int, data: cache.Data, digest: str, generation: int) -> None:
    try:
        await asyncio.to_thread(agent.store.write_chunk, index, data)
    except OSError as exc:
        if generation == agent.generation:
            log.warning("Writing chunk %d to staging failed (%s); dropping it", index, exc)
            drop(agent, index)
            write_failed(agent, exc)
        return
    finally:
        agent.memory.unpin(index)
        agent.pending_writes.pop(index, None)
    if generation == agent.generation and agent.held.get(index) == digest:  # still ours
        journal(agent, index, digest)
        agent.changed.set()


def write_failed(agent: Agent, exc: OSError) -> None:
    """A write to staging failed: pause fetching with DiskFull or WriteFailed."""
    agent.write_failures += 1
    agent.core.pause(True)
    if isinstance(exc, store.DiskFull) or exc.errno in (errno.ENOSPC, errno.EDQUOT):
        agent.problems.set(problems.DISK_FULL, f"staging is full, fetching paused: {exc.strerror or exc}")
    else:
        wait = agent.write_backoff.failed("write", now=time.monotonic())
        agent.problems.set(problems.WRITE_FAILED, f"writing to staging failed ({exc}); retrying in {wait:.0f} s")
    agent.changed.set()


def _has_room(agent: Agent, nbytes: int) -> bool:
    if agent.writes_paused:
        return False
    reason = agent.store.room_for(nbytes)
    if reason is None:
        return True
    write_failed(agent, store.DiskFull(errno.ENOSPC, reason))
    return False


async def disk_loop(agent: Agent) -> None:
    """Resume fetching once staging has room for a chunk again (or a failed write may be retried)."""
    while True:
        await asyncio.sleep(DISK_CHECK_S)
        if not agent.writes_paused or agent.layout is None:
            continue
        if agent.problems.active(problems.WRITE_FAILED):
            if not agent.write_backoff.ready("write", now=time.monotonic()):
                continue
            agent.problems.clear(problems.WRITE_FAILED)
        if agent.store.room_for(agent.layout.chunk_size) is not None:
            continue
        agent.problems.clear(problems.DISK_FULL)
        agent.core.pause(False)
        log.info("Staging has room again; fetching resumes")
        agent.changed.set()


def unhold(agent: Agent, index: int) -> None:
    """Forget a held chunk here (missing again); the tracker is not told (see :func:`drop`)."""
    if agent.core.unheld(index):
        agent.memory.discard(index)
        agent.changed.set()
        agent.copy_news.set()


def drop(agent: Agent, index: int) -> None:
    """Stop holding ``index`` and tell the tracker; withdraw a published model it belonged to."""
    if index not in agent.held:
        return
    agent.core.dropped_chunk(index)
    agent.memory.discard(index)
    agent.changed.set()
    agent.uncommitted = [(i, h) for i, h in agent.uncommitted if i != index]
    agent.check.dropped += 1
    agent.news.set()
    agent.store_drops.append(index)
    agent.journal_news.set()
    agent.copy_news.set()
    if agent.verified_digest is not None:
        agent.verified_digest = None
        agent.must_republish = True
        publish.withdraw(agent.model_dir)


async def drain_writes(agent: Agent) -> None:
    """Wait until every write-behind has finished (done or failed)."""
    while agent.pending_writes:
        await asyncio.wait(set(agent.pending_writes.values()))


def take_uncommitted(agent: Agent) -> list[tuple[int, str]]:
    entries, agent.uncommitted = agent.uncommitted, []
    return entries


async def commit(agent: Agent) -> None:
    """Journal drops, then make finished writes durable and journal them."""
    drops, agent.store_drops = agent.store_drops, []
    if drops:
        await asyncio.to_thread(agent.store.drop, drops)
    entries = take_uncommitted(agent)
    if entries:
        await asyncio.to_thread(agent.store.commit, entries)


async def commit_loop(agent: Agent) -> None:
    """Commit what is queued (``journal``, drops), lines queued within ``COMMIT_BATCH_S`` together;
    asleep while nothing is (an idle agent's CPU is the sender's overhead)."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agent.journal_news.wait(), timeout=SAFETY_NET_S)
        await asyncio.sleep(COMMIT_BATCH_S)
        agent.journal_news.clear()
        if agent.revision is not None:
            await commit(agent)
