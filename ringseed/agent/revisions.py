"""Which source revision this node holds; taking it from the source; moving to a new one cheaply.

Rules (``ringseed.protocol.revision`` has the model):
- The agent on origin duty takes the revision from the source (a listing with each file's
  size and tag, or the published manifest) and publishes it (``PUT /v1/manifest`` naming the
  revision it replaces) whenever the tracker's revision is unknown or unconfirmed (a fresh or
  restarted master), it has just gained the duty, a read found the source changed (the core's ``source_stale``),
  or the source contradicts the published manifest (``SourceChanged``: a new manifest may come).
  Takes are spaced by a growing back-off while the source keeps changing, and failures (origin
  errors, a source that makes no model) are named problems retried with back-off.
- Between those moments, the agent on duty checks the source every ``--source-check-interval``
  (:func:`check_source`, ``revision.SourceChecks``): the same listing (or manifest) a take reads,
  and a take when it names another revision. So a source changed in place after every node is
  verified (nobody reads it then) moves the swarm within about one interval. A check that fails
  is retried with back-off and only logged: the copies stay what the revision says, never
  a mix of two.
- Every agent follows the tracker's revision: when a heartbeat or registration names another
  one, it fetches it (``GET /v1/manifest``) and :func:`adopt`-s it. Staging keeps the files the
  new revision still has; chunks whose bytes stay in place are *candidates*, checked by hash
  as their hashes become known (:func:`reuse_loop`) and held without a transfer if they match.
- On a listing revision, the agent on duty proves a candidate in a file whose size and tag did
  not change (:func:`prove`): it re-checks the previous revision's chunks under it against their
  recorded hashes, then publishes the hash of the kept bytes instead of pulling the chunk from
  the origin. Only what changed leaves the origin again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ringseed.agent import chunks, origins, problems, seeder, store, tracker_client
from ringseed.protocol import backoff, manifest, revision

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)
SOURCE_CHECK_CAP = 3600.0  # longest wait between source checks while they fail


async def adopt(agent: Agent, target: revision.Revision, *, hashes: Sequence[Any] | None) -> None:
    """Make ``target`` the revision this node holds; staging keeps what it can (see module rules)."""
    agent.generation += 1
    await chunks.drain_writes(agent)
    if agent.revision is not None:
        await chunks.commit(agent)
    opened: store.Opened = await asyncio.to_thread(agent.store.open, target)
    known = {i: h for i, h in enumerate(hashes or []) if isinstance(h, str)}
    agent.revision = target
    held = {i: h for i, h in opened.verified.items() if known.get(i, h) == h}
    agent.core.adopt(
        layout=target.layout,
        revision=target.id,
        held=held,
        hashes=known,
        candidates=revision.reuse_candidates(target.layout, opened.kept),
    )
    agent.prior = opened.prior
    agent.prior_checked = set()
    agent.resumed_chunks = len(agent.held)
    agent.once_held = set(agent.held)
    agent.memory.clear()
    agent.uncommitted.clear()
    agent.store_drops.clear()
    agent.verified_digest = None
    agent.sync_state["since"] = None  # a snapshot of the new revision next
    seeder.pin_origin(agent)
    agent.problems.clear(problems.SOURCE_CHANGED)
    agent.problems.clear(problems.DIGEST_MISMATCH)
    agent.changed.set()
    agent.news.set()
    agent.hashes_news.set()
    agent.copy_news.set()
    log.info(
        "Holding revision %s: %d chunks, %d verified here, %d to check by hash",
        target.id[:16],
        target.layout.chunk_count,
        len(agent.held),
        len(agent.candidates),
    )


def _must_take(agent: Agent) -> bool:
    stale = agent.core.source_stale or agent.problems.active(problems.SOURCE_CHANGED)
    return agent.origin_duty and (agent.tracker_revision is None or not agent.tracker_confirmed or stale)


def _settled(agent: Agent) -> bool:
    """On duty, holding the tracker's confirmed revision: what a source check compares against."""
    rev = agent.revision
    return agent.origin_duty and agent.tracker_confirmed and rev is not None and rev.id == agent.tracker_revision


async def revision_loop(agent: Agent) -> None:
    takes: backoff.Backoff[str] = backoff.Backoff(base=0.5, cap=30.0)
    interval = agent.config.source_check_interval
    checks = revision.SourceChecks(interval=interval, cap=max(interval, SOURCE_CHECK_CAP))
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agent.revision_news.wait(), timeout=max(0.1, agent.heartbeat_interval / 2))
        agent.revision_news.clear()
        try:
            if _must_take(agent) and takes.ready("take", now=time.monotonic()):
                await _take(agent, takes)
            elif _settled(agent) and checks.due(time.monotonic()):
                await check_source(agent, checks)
            target = agent.tracker_revision
            if target is not None and (agent.revision is None or agent.revision.id != target):
                await follow(agent, target)
        except tracker_client.TrackerClientError as exc:
            log.info("Revision sync with the tracker failed: %s", exc)


async def _take(agent: Agent, takes: backoff.Backoff[str]) -> None:
    before = agent.tracker_revision
    taken = await take_revision(agent)
    if taken is None:
        takes.failed("take", now=time.monotonic())
    elif (taken != before and before is not None) or agent.problems.active(problems.SOURCE_CHANGED):
        takes.failed("take", now=time.monotonic())  # the source changed (or still contradicts it): space takes out
    else:
        takes.succeeded("take")


async def check_source(agent: Agent, checks: revision.SourceChecks) -> None:
    """Compare the source with the distributed revision; another one is taken (the core's ``source_stale``)."""
    started = time.monotonic()
    try:
        current, _ = await from_source(agent)
    except manifest.ManifestError:
        current = None  # a manifest that no longer makes this model: the take names the problem
    except origins.OriginError as exc:
        wait = checks.failed(started)
        log.info("Checking the source for changes failed (%s); next check in %.0f s", exc, wait)
        return
    checks.read(started)
    if current is None or current.id != agent.tracker_revision:
        log.info("The source no longer is revision %s; taking it again", str(agent.tracker_revision)[:16])
        agent.core.stale_source()
        agent.revision_news.set()


async def from_source(agent: Agent) -> tuple[revision.Revision, list[str] | None]:
    """The source's revision now: its published manifest, or a listing of it."""
    if agent.config.manifest_uri:
        published = await origins.fetch_manifest(
            agent.config.manifest_uri, expected_digest=agent.config.expected_digest
        )
        return revision.Revision.of_manifest(published), list(published.chunk_hashes)
    listing = await seeder.get_origin(agent).listing()
    return revision.Revision.of_listing(listing, chunk_size=agent.config.chunk_size), None


async def take_revision(agent: Agent) -> str | None:
    """Take the revision from the source and publish it to the tracker; its id, or None on failure."""
    try:
        taken, hashes = await from_source(agent)
    except manifest.ManifestError as exc:
        reason = problems.DIGEST_MISMATCH if agent.config.expected_digest and "expected" in str(exc) else None
        agent.problems.set(reason or problems.BAD_SOURCE, f"the source cannot be distributed: {exc}")
        return None
    except origins.OriginError as exc:
        agent.problems.set(problems.ORIGIN_ERROR, f"reading the source's listing failed: {exc}")
        return None
    agent.problems.clear(problems.BAD_SOURCE)
    try:
        await agent.tracker.put_manifest(
            layout=taken.layout.to_dict(),
            chunk_hashes=hashes,
            revision=taken.to_dict(),
            replaces=agent.tracker_revision,
        )
    except tracker_client.Refused as exc:
        if exc.status == 403:
            agent.core.tracker_state(revision=agent.tracker_revision, confirmed=agent.tracker_confirmed, duty=False)
            return None
        if exc.status != 409:
            raise
        log.info("Tracker refused revision %s: %s", taken.id[:16], exc)
        published = await agent.tracker.get_manifest()
        current = published.get("revision")
        agent.core.tracker_moved(current.get("id") if isinstance(current, dict) else None)
        return None
    if taken.id != agent.tracker_revision:
        log.info("Took revision %s from the source (%d files)", taken.id[:16], len(taken.layout.files))
    agent.problems.clear(problems.ORIGIN_ERROR)
    agent.core.source_taken(revision=taken.id)
    agent.revision_news.set()
    return taken.id


async def follow(agent: Agent, target: str) -> None:
    """Move to the tracker's revision ``target``."""
    published = await agent.tracker.get_manifest()
    raw = published.get("revision")
    if raw is None:
        return
    new = revision.Revision.from_dict(raw)
    if new.id != target:  # moved on again meanwhile; follow the newest
        agent.core.tracker_moved(new.id)
    await adopt(agent, new, hashes=published.get("chunk_hashes"))


# -- reuse -------------------------------------------------------------------------------------


def local_hash(staging: store.Store, index: int) -> str | None:
    """SHA-256 of chunk ``index`` as staged now (None if the files are short)."""
    layout = staging.layout
    if layout is None:
        return None
    data = staging.read_chunk(index)
    return manifest.chunk_sha256(data) if len(data) == layout.chunk_length(index) else None


async def reuse_loop(agent: Agent) -> None:
    """Check candidates whose hash is known against the bytes kept in staging, one at a time."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agent.hashes_news.wait(), timeout=1.0)
        agent.hashes_news.clear()
        for index in sorted(i for i in agent.candidates if i in agent.hashes):
            if not await check_candidate(agent, index):
                break


async def check_candidate(agent: Agent, index: int) -> bool:
    """Hold candidate ``index`` if its kept bytes hash to the known hash; False if the revision moved."""
    generation = agent.generation
    if index not in agent.candidates or index in agent.held:
        return True
    digest = await asyncio.to_thread(local_hash, agent.store, index)
    if generation != agent.generation:
        return False
    agent.core.candidate_done(index)
    if digest is not None and digest == agent.hashes.get(index) and index not in agent.held:
        agent.reused_chunks += 1
        chunks.hold(agent, index, None, digest=digest, from_origin=False)
        chunks.journal(agent, index, digest)
    return True


async def prove(agent: Agent, index: int) -> str | None:
    """On duty, a listing revision: the hash of chunk ``index`` from bytes kept in unchanged files.

    Each previous-revision chunk those bytes belong to is first re-hashed against its recorded
    hash (once), so a copy that rotted at rest never becomes the reference. None when the chunk
    is not provable (a changed file, bytes not verified before, a check failed): pull it.
    """
    prior, current = agent.prior, agent.revision
    if prior is None or current is None or current.manifest_digest is not None or index not in agent.candidates:
        return None
    unchanged = revision.unchanged_files(prior.revision, current)
    if not revision.provable(current.layout, index, candidates=agent.candidates, unchanged=unchanged):
        return None
    old = prior.revision.layout
    covering = revision.prior_chunks(old, current.layout, index)
    if covering is None:
        return None
    for j in sorted(covering - agent.prior_checked):
        if j not in prior.held or any(p.path not in unchanged for p in old.pieces(j)):
            return None
        data = await asyncio.to_thread(agent.store.read_prior_chunk, old, j)
        if len(data) != old.chunk_length(j) or manifest.chunk_sha256(data) != prior.held[j]:
            log.warning("Chunk %d of the previous revision no longer matches its hash; not reusing it", j)
            return None
        agent.prior_checked.add(j)
    return await asyncio.to_thread(local_hash, agent.store, index)
