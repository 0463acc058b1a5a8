"""Datasets in the node cache (issue 13): files of a source as slices of chunks, and who fetches which chunk.

Owns the pure rules of read-through dataset caching; the agent (``ringseed/cache/data.py``) and
the cache master (``ringseed/master/cachemeta_api.py``) do the I/O.

Rules:
- A dataset is a source pinned at a revision (:class:`ringseed.protocol.revision.Revision`): its
  files in path order form one stream cut into chunks (:class:`ringseed.protocol.manifest.Layout`),
  so many small files share a chunk and a sequential pass over them reads whole chunks, one
  round trip per chunk instead of one per file. A file is a list of *segments*: slices of
  chunks (:func:`segments`). Chunk identities (their SHA-256) are learned by whoever first reads
  them from the source.
- Cluster-wide single flight (:class:`Flights`, on the master): for chunk ``i`` of revision ``r``
  a node asking is told the holders (fetch from a peer, verify against the learned hash), or
  that another node is reading it from the source now (wait and ask again), or that it may read
  it from the source itself (a claim). So a chunk is read from the source once while a copy
  lives inside the cluster. A claim stands while its node is online (a slow source read, say
  16 chunks at once through a 100 Mbit/s link, takes as long as it takes: a fixed expiry had
  other nodes read the same chunk again), and passes to the next asker when its node goes
  silent or registers anew (a restarted agent forgot it), gives it up (the source failed), or
  after ``claim_seconds`` (a cap against a read that never ends).
- The learned hashes of a revision count as referenced (their chunks are not orphans).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from ringseed.protocol import cacheobjects, manifest

MAX_REVISIONS_KEPT = 4  # per source, for readers that still hold an older revision open
POLL_SECONDS = 0.05  # a node waiting for another's source read asks again this soon


@dataclass(frozen=True)
class Segment:
    """A slice of one chunk that is part of a file: ``length`` bytes from ``offset`` in chunk ``chunk``."""

    chunk: int
    offset: int
    length: int


def segments(layout: manifest.Layout, path: str | manifest.FileEntry) -> list[Segment]:
    """The chunk slices making up file ``path`` of ``layout`` (or its entry), in file order (``KeyError`` if absent)."""
    entry = path if isinstance(path, manifest.FileEntry) else next((f for f in layout.files if f.path == path), None)
    if entry is None:
        raise KeyError(path)
    out: list[Segment] = []
    start, end = entry.offset, entry.offset + entry.size
    position = start
    while position < end:
        chunk = position // layout.chunk_size
        chunk_start, chunk_end = layout.chunk_span(chunk)
        take = min(end, chunk_end) - position
        out.append(Segment(chunk=chunk, offset=position - chunk_start, length=take))
        position += take
    return out


def files_under(layout: manifest.Layout, directory: str) -> tuple[list[str], list[str]]:
    """``(files, subdirectories)`` directly inside ``directory`` of the dataset (relative names)."""
    return cacheobjects.listing((f.path for f in layout.files), directory)


def is_dir(layout: manifest.Layout, path: str) -> bool:
    prefix = path + "/"
    return path == "" or any(f.path.startswith(prefix) for f in layout.files)


def chunks_of(layout: manifest.Layout, prefixes: Iterable[str]) -> list[int]:
    """Chunks holding any byte of the files under ``prefixes`` (all chunks when none are given)."""
    wanted = [p.strip("/") for p in prefixes if p.strip("/")]
    if not wanted:
        return list(range(layout.chunk_count))
    out: set[int] = set()
    for entry in layout.files:
        if entry.size and any(cacheobjects.is_under(entry.path, p) for p in wanted):
            out.update(
                range(entry.offset // layout.chunk_size, (entry.offset + entry.size - 1) // layout.chunk_size + 1)
            )
    return sorted(out)


class Answer(enum.Enum):
    PEERS = "peers"  # fetch from the holders, verify against the hash
    FETCH = "fetch"  # you read it from the source (a claim)
    WAIT = "wait"  # another node is reading it from the source


@dataclass
class _Revision:
    chunk_count: int
    hashes: dict[int, str] = field(default_factory=dict)
    claims: dict[int, tuple[str, float]] = field(default_factory=dict)  # chunk -> (node, until)


class Flights:
    """Learned hashes and source claims per (source, revision); soft state of the cache master."""

    def __init__(self, *, claim_seconds: float = 600.0) -> None:
        self.claim_seconds = claim_seconds
        self.revisions: dict[tuple[str, str], _Revision] = {}
        self.order: dict[str, list[str]] = {}  # source -> revisions, oldest first

    def known(self, source: str, revision: str, *, chunk_count: int) -> _Revision:
        key = (source, revision)
        found = self.revisions.get(key)
        if found is None:
            found = self.revisions[key] = _Revision(chunk_count=chunk_count)
            kept = self.order.setdefault(source, [])
            kept.append(revision)
            while len(kept) > MAX_REVISIONS_KEPT:
                self.revisions.pop((source, kept.pop(0)), None)
        return found

    def ask(
        self,
        *,
        source: str,
        revision: str,
        chunk: int,
        chunk_count: int,
        node: str,
        holders: set[str],
        online: Collection[str],
        now: float,
    ) -> tuple[Answer, str | None, float]:
        """What ``node`` should do for ``chunk``: ``(answer, hash or None, seconds to wait)``.

        ``holders`` are the online nodes holding the chunk's learned hash (the caller looks them up);
        ``online``: the nodes that are online now (a claim of any other node is void).
        """
        state = self.known(source, revision, chunk_count=chunk_count)
        if not 0 <= chunk < state.chunk_count:
            raise IndexError(f"chunk {chunk} out of range [0, {state.chunk_count})")
        sha = state.hashes.get(chunk)
        if sha is not None and holders - {node}:
            return Answer.PEERS, sha, 0.0
        claim = state.claims.get(chunk)
        if claim is not None and claim[0] != node and claim[1] > now and claim[0] in online:
            return Answer.WAIT, sha, min(POLL_SECONDS, claim[1] - now)
        state.claims[chunk] = (node, now + self.claim_seconds)
        return Answer.FETCH, sha, 0.0

    def learned(self, *, source: str, revision: str, chunk: int, chunk_count: int, sha: str, node: str) -> bool:
        """``node`` read ``chunk`` from the source and hashed it; False when it contradicts the known hash."""
        state = self.known(source, revision, chunk_count=chunk_count)
        if not 0 <= chunk < state.chunk_count:
            raise IndexError(f"chunk {chunk} out of range [0, {state.chunk_count})")
        known = state.hashes.setdefault(chunk, sha)
        claim = state.claims.get(chunk)
        if claim is not None and claim[0] == node:
            del state.claims[chunk]
        return known == sha

    def release(self, *, source: str, revision: str, chunk: int, node: str) -> None:
        """``node`` gave its claim up (the source failed): the next asker may try."""
        state = self.revisions.get((source, revision))
        if state is not None and state.claims.get(chunk, ("", 0.0))[0] == node:
            del state.claims[chunk]

    def drop_claims(self, node: str) -> None:
        """``node`` (re)registered: whatever it claimed before, it is not reading now."""
        for state in self.revisions.values():
            for chunk in [c for c, (owner, _) in state.claims.items() if owner == node]:
                del state.claims[chunk]

    def hashes(self, source: str, revision: str) -> dict[int, str]:
        state = self.revisions.get((source, revision))
        return dict(state.hashes) if state is not None else {}

    def referenced(self) -> set[str]:
        return {sha for state in self.revisions.values() for sha in state.hashes.values()}


class ReadAhead:
    """Sequential detection per stream: after ``trigger`` consecutive chunks, fetch the next ``depth``."""

    def __init__(self, *, depth: int = 4, trigger: int = 2) -> None:
        self.depth = depth
        self.trigger = trigger
        self.last: dict[str, int] = {}
        self.run: dict[str, int] = {}
        self.issued: dict[str, int] = {}

    def saw(self, stream: str, chunk: int, *, count: int) -> list[int]:
        """Chunk ``chunk`` of ``stream`` (``count`` chunks) was read; returns the chunks to prefetch."""
        previous = self.last.get(stream)
        self.run[stream] = self.run.get(stream, 0) + 1 if previous is not None and chunk == previous + 1 else 1
        self.last[stream] = chunk
        if self.run[stream] < self.trigger:
            self.issued.pop(stream, None)
            return []
        start = max(chunk + 1, self.issued.get(stream, -1) + 1)
        end = min(count, chunk + 1 + self.depth)
        if start >= end:
            return []
        self.issued[stream] = end - 1
        return list(range(start, end))
