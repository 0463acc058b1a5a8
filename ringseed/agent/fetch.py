"""Peer downloads' I/O: asks the tracker, gets chunk bodies from peers, waits for hashes.

The decisions (which chunk, which holder, retries, avoid lists, end game, streams, what to
report) are :class:`ringseed.protocol.agentcore.AgentCore`'s; this module carries out its
:class:`~ringseed.protocol.agentsteps.FindHolders`, :class:`~ringseed.protocol.agentsteps.FindSource`,
:class:`~ringseed.protocol.agentsteps.Fetch`, :class:`~ringseed.protocol.agentsteps.AwaitHash` and
:class:`~ringseed.protocol.agentsteps.Report` steps and turns what came back into the core's
events (:mod:`ringseed.agent.driver` runs the jobs). The numbers and why (``agentcore.Settings``):

- End-game duplicates are capped at one request per chunk (off): on the testbed a second request
  for the last chunk took an upload slot another node needed and split the holder's uplink, so
  the tail got longer (N=16: 30.3 s -> 28.1 s without).
- A chunk nobody could give is tried again after ``retry_after`` (jittered), short so that a copy
  or a slot that just appeared is used at once; a busy holder (429) is asked for nothing for about
  as long (its slots free at the pace of whole chunks, and every refusal costs it a request's
  worth of CPU).
- Requests name the revision (``?revision=``): a peer on another revision answers 409 and is not
  blamed; a chunk received after this node moved to another revision is discarded.
- Bytes are hashed as they arrive (:mod:`ringseed.agent.peerclient`), so verifying costs no
  second pass over the chunk. They land in a pooled chunk buffer (``agent.chunk_buffer``: memory
  touched before, reused) that is held in the memory tier and written behind, with ``O_DIRECT`` on
  a disk (``store.WRITES``: no page cache to fill), or, with ``--staging-writes in-place``, in the
  chunk's region of the staged file (a claim, :meth:`ringseed.agent.store.Store.claim`: no write
  afterwards, no buffer) when staging lets it be claimed. Never claimed: a chunk held or once held under this revision
  (a journal line may name it until its drop is committed), a candidate (its kept bytes are
  still to be checked by hash), one being written, one spread over several files.
- Cut-through: a stream from the origin puller (``?stream=1``, :mod:`ringseed.agent.stream`) has
  no total time limit (the origin sets the pace; 30 s without a byte ends it). Its hash is known
  only once the puller has the whole chunk: the agent waits for it (a watch of the chunk) until
  the core's deadline.
- Waiting is a long-poll, never a poll: a node that has nothing it can fetch or stream parks a
  watch of any chunk it lacks (``POST /v1/watch``, :func:`ringseed.agent.driver.core_loop`), and
  one waiting for a streamed chunk's hash watches that chunk; the tracker answers when a copy
  appears or a pull starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ringseed.agent import peerclient, store, tracker_client
from ringseed.protocol import agentsteps, choice

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Body:
    """A chunk's bytes as received: a pooled buffer's view, or a claimed region of staging."""

    data: memoryview | store.Landing


def holders_of(peers: list[dict[str, Any]]) -> list[choice.Holder]:
    return [choice.Holder(name=str(p["name"]), url=str(p["url"]), load=int(p.get("load", 0))) for p in peers]


async def find_holders(agent: Agent, step: agentsteps.FindHolders) -> list[agentsteps.Action]:
    try:
        peers: list[choice.Holder] | None = holders_of(await agent.tracker.peers(step.index))
    except tracker_client.TrackerClientError:
        peers = None
    return agent.core.holders(step.job, peers, now=time.monotonic())


async def find_source(agent: Agent, step: agentsteps.FindSource) -> list[agentsteps.Action]:
    try:
        peers, raw = await agent.tracker.sources(step.index)
    except tracker_client.TrackerClientError:
        return agent.core.sources(step.job, None, None, now=time.monotonic())
    source = choice.Holder(name=str(raw["name"]), url=str(raw["url"]), load=0) if raw is not None else None
    return agent.core.sources(step.job, holders_of(peers), source, now=time.monotonic())


async def fetch(agent: Agent, step: agentsteps.Fetch) -> tuple[Body | None, list[agentsteps.Action]]:
    """``GET /v1/chunks/{index}`` from the step's holder into a pooled buffer, hashed as it lands."""
    layout, revision = agent.layout, agent.revision
    assert layout is not None
    length = layout.chunk_length(step.index)
    holder = step.holder
    deadline = None if step.stream else time.monotonic() + READ_TIMEOUT_S + length / (4 << 20)
    query = {"revision": revision.id} if revision is not None else {}
    if step.stream:
        query["stream"] = "1"
    started = time.monotonic()
    landing = await _claim(agent, step.index)
    if landing is not None and not landing.begin():
        landing = None  # the store took it back (a revision change, closing) and released it
    buffer: memoryview | None = None
    try:
        if landing is not None:
            try:
                reply = await agent.peer_client.fetch_mapped(
                    holder.url,
                    peerclient.chunk_path(step.index, query),
                    fd=landing.fd,
                    offset=landing.offset,
                    length=length,
                    read_timeout=READ_TIMEOUT_S,
                    deadline=deadline,
                    on_abort=landing.on_abort,
                )
            finally:
                landing.end()
        else:
            buffer = agent.chunk_buffer(length)
            reply = await agent.peer_client.get(
                holder.url, step.index, query=query, into=buffer, read_timeout=READ_TIMEOUT_S, deadline=deadline
            )
    except BaseException:
        if landing is not None:
            landing.release()
        raise
    whole = reply.status == 200 and reply.complete and reply.received == length
    received: memoryview | store.Landing | None = buffer
    if landing is not None:
        received = landing if whole else None
        if not whole:
            landing.release()  # what came is not the chunk: the region goes back unjournaled
    agent.fetched_bytes += reply.received
    body: Body | None = None
    result: agentsteps.FetchResult
    if reply.status == 0:
        log.info("Peer %s unreachable for chunk %d: %s", holder.name, step.index, reply.error)
        result = agentsteps.Unreachable(str(reply.error))
    elif reply.status != 200:
        result = agentsteps.Refused(reply.status)
    elif reply.too_long:
        body = Body(received) if received is not None else None
        result = agentsteps.Got(length=reply.received, digest=None)
    elif whole and received is not None:
        body, result = Body(received), agentsteps.Got(length=length, digest=reply.digest)
        log.info("Chunk %d from %s in %.2f s", step.index, holder.name, time.monotonic() - started)
    else:
        log.info("Peer %s broke off chunk %d after %d bytes: %s", holder.name, step.index, reply.received, reply.error)
        result = agentsteps.Broken(reply.received)
    actions = agent.core.fetched(step.job, result, now=time.monotonic())
    if any(isinstance(a, agentsteps.Report) for a in actions):
        log.warning("Peer %s served chunk %d with a wrong hash; reporting and avoiding it", holder.name, step.index)
    return body, actions


async def _claim(agent: Agent, index: int) -> store.Landing | None:
    """The chunk's region of staging, claimed and allocated, when it may be received in place."""
    if index in agent.held or index in agent.candidates or index in agent.pending_writes:
        return None
    landing = agent.store.claim(index, unclaimable=agent.once_held)
    if landing is None:
        return None
    # On the download threads, not the default executor: a claim is a user of the staging gate, and
    # a revision change waits for it to end while the default executor's threads may all be waiting
    # on the gate (writes, reads, commits); a download thread never waits on it.
    preparing = asyncio.ensure_future(agent.peer_client.run(landing.prepare))
    try:
        ready = await asyncio.shield(preparing)
    except asyncio.CancelledError:
        preparing.add_done_callback(lambda _: landing.release())  # the thread still uses the file
        raise
    except BaseException:
        landing.release()
        raise
    if not ready:
        landing.release()
        return None
    return landing


async def await_hash(agent: Agent, step: agentsteps.AwaitHash) -> list[agentsteps.Action]:
    """Wait for the tracker's hash of the step's chunk: known once the puller announced it; a watch
    of the chunk (a long-poll) brings it at once, until the core's deadline."""
    generation = agent.generation
    while step.index not in agent.hashes and generation == agent.generation:
        left = step.until - time.monotonic()
        if left <= 0:
            break
        await agent.watch([step.index], wait=min(left, agent.heartbeat_interval))
    if step.index not in agent.hashes and generation == agent.generation:
        log.warning("No hash for streamed chunk %d in time; dropping it", step.index)
    return agent.core.hash_waited(step.job, now=time.monotonic())


async def report(agent: Agent, step: agentsteps.Report) -> None:
    try:
        await agent.tracker.report(peer=step.peer, chunk=step.index)
    except tracker_client.TrackerClientError as exc:
        log.info("Reporting %s for chunk %d failed: %s", step.peer, step.index, exc)
