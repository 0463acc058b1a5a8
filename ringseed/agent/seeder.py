"""Origin duty: the agent the tracker picked pulls chunks nobody holds and seeds them at once.

Rules:
- Only while the tracker grants origin duty (heartbeat ``origin_duty``); only the chunks the
  tracker assigned to us (``POST /v1/origin/claim``), so each chunk leaves the origin once while a
  copy lives inside. Up to ``origin_depth`` pulls run at once, all sharing the origin object's
  rate limit, so the pipe stays busy.
- A pulled chunk is hashed here (off the event loop). With a published manifest the hash must
  match it, else the chunk is dropped and the mismatch logged (the origin changed). Without one,
  the hash is ours to publish: it rides with the chunk's announcement.
- The pulled chunk goes to the memory tier and is announced at once, so peers relay it while we
  pull the next ones.
- Publishing the layout: list the origin (or fetch ``--manifest-uri``) and PUT it to the tracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ringseed.agent import origins, tracker_client
from ringseed.protocol import manifest

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)


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


async def origin_loop(agent: Agent) -> None:
    pulling: dict[int, asyncio.Task[None]] = {}
    while True:
        for index in [i for i, t in pulling.items() if t.done()]:
            task = pulling.pop(index)
            if not task.cancelled() and task.exception() is not None:
                log.warning("Pull of chunk %d from the origin failed: %r", index, task.exception())
        if not agent.origin_duty or agent.layout is None or not agent.missing:
            await asyncio.sleep(0.1)
            continue
        free = agent.config.origin_depth - len(pulling)
        if free > 0:
            for index in await _claim(agent, free, pulling):
                pulling[index] = asyncio.create_task(pull(agent, index))
        if pulling:
            await asyncio.wait(pulling.values(), timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
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


async def pull(agent: Agent, index: int) -> None:
    """Pull one chunk from the origin, hash it, seed it."""
    assert agent.layout is not None
    origin = get_origin(agent)
    data = await origins.read_chunk(origin, agent.layout, index)
    agent.origin_bytes = origin.bytes_read
    agent.fetched_bytes += len(data)
    digest = await asyncio.to_thread(manifest.chunk_sha256, data)
    known = agent.hashes.get(index)
    if known is not None and known != digest:
        log.error("Chunk %d from the origin does not match the published hash; dropped", index)
        return
    await agent.accept(index, data, digest=digest, from_origin=True)
