"""Source revisions: which state of the source a distribution delivers, and what survives a change.

Owns the pinned revision (a layout plus each file's object identity when it was listed, or a
published manifest's digest), its id, and the pure reuse plan used when a node's cached copy
belongs to another revision. Pure: no I/O, no clock.

Rules:
- A revision is taken once, by the agent on origin duty: from a published manifest (the id is
  the manifest digest; the chunk hashes pin every byte) or from a listing of the source (each
  file's size and ``tag``: an ETag/Last-Modified for HTTP and S3, ``mtime_ns`` for files;
  ``""`` when the source gives none). A listing revision's id is the SHA-256 of the canonical
  JSON of its layout and tags, so any change of a file's size, mode or identity is a new id.
- Every origin read of a listing revision is checked against the file's pinned size and tag
  (``ringseed.agent.origins``): a change is a new revision, never a mix of two.
- Reuse: bytes a node verified under one revision stay where they are (staging keeps files by
  path); a chunk of the new revision whose pieces all lie in such verified bytes is a
  *candidate* (:func:`reuse_candidates`): hashing it locally and finding the new revision's hash
  makes it held without a transfer. On a listing revision, a candidate whose files kept their
  size and tag is *provable* (:func:`provable`): the agent on origin duty may hash it locally
  and publish that hash instead of pulling the chunk from the origin again, so a new revision
  costs the origin only what changed.
- Source checks (:class:`SourceChecks`): the agent on origin duty compares the source with the
  revision the swarm distributes every ``interval`` seconds, also long after every node is
  verified (nobody reads the source then), so a source changed in place never stays behind a
  verified status for longer than about one interval. A check that could not read the source is
  tried again after a back-off that starts at about the interval and doubles up to ``cap``.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import random
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any

from ringseed.protocol import backoff, manifest

MAX_TAG = 512
Ranges = dict[str, list[tuple[int, int]]]


def check_id(value: Any, *, field: str = "revision") -> str:
    """``value`` if it is a revision id (lowercase hex SHA-256), else :class:`manifest.ManifestError`."""
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= set("0123456789abcdef"):
        raise manifest.ManifestError(f"{field}: {value!r} is not a revision id (lowercase hex SHA-256)")
    return value


@dataclass(frozen=True)
class Revision:
    """A pinned state of the source: its layout, each file's identity, or a manifest's digest."""

    layout: manifest.Layout
    tags: tuple[str, ...] = ()
    manifest_digest: str | None = None

    def __post_init__(self) -> None:
        if self.manifest_digest is not None:
            check_id(self.manifest_digest, field="manifest_digest")
            if self.tags:
                raise manifest.ManifestError("tags: a manifest revision is pinned by its digest, not by tags")
            return
        tags = self.tags or ("",) * len(self.layout.files)
        if len(tags) != len(self.layout.files):
            raise manifest.ManifestError(f"tags: {len(tags)} tags for {len(self.layout.files)} files")
        for entry, tag in zip(self.layout.files, tags, strict=True):
            if not isinstance(tag, str) or len(tag) > MAX_TAG or not tag.isprintable():
                raise manifest.ManifestError(f"tags: file {entry.path!r} has an unusable tag {tag!r}")
        object.__setattr__(self, "tags", tuple(tags))

    @classmethod
    def of_listing(cls, objects: Iterable[tuple[str, int, int, str]], *, chunk_size: int) -> Revision:
        """A listing revision from ``(path, size, mode, tag)`` per file."""
        items = list(objects)
        layout = manifest.Layout.build([(p, s, m) for p, s, m, _ in items], chunk_size=chunk_size)
        by_path = {p: t for p, _, _, t in items}
        return cls(layout=layout, tags=tuple(by_path[f.path] for f in layout.files))

    @classmethod
    def of_manifest(cls, published: manifest.Manifest) -> Revision:
        return cls(layout=published.layout, manifest_digest=published.digest)

    @functools.cached_property
    def id(self) -> str:  # (computed once: the tracker asks on every heartbeat)
        if self.manifest_digest is not None:
            return self.manifest_digest
        body = {"layout": self.layout.to_dict(), "tags": list(self.tags)}
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def pins(self) -> dict[str, tuple[int, str]]:
        """``path -> (size, tag)`` that every origin read of this revision must still find."""
        if self.manifest_digest is not None:
            return {}
        return {f.path: (f.size, t) for f, t in zip(self.layout.files, self.tags, strict=True)}

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "layout", "tags", "manifest_digest"}`` (``tags`` empty for a manifest revision)."""
        return {
            "id": self.id,
            "layout": self.layout.to_dict(),
            "tags": list(self.tags) if self.manifest_digest is None else [],
            "manifest_digest": self.manifest_digest,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Revision:
        """Rebuild and validate; an ``id`` that does not match the content is refused."""
        if not isinstance(d, Mapping):
            raise manifest.ManifestError(f"revision: must be a JSON object, got {type(d).__name__}")
        raw = d.get("layout")
        if not isinstance(raw, Mapping):
            raise manifest.ManifestError("revision: layout must be a JSON object")
        layout = manifest.Layout.from_dict(raw)
        tags = d.get("tags") or []
        if not isinstance(tags, list):
            raise manifest.ManifestError("tags: must be a list of strings")
        digest = d.get("manifest_digest")
        built = cls(layout=layout, tags=tuple(tags), manifest_digest=digest)
        if "id" in d and d["id"] != built.id:
            raise manifest.ManifestError(f"revision: id {d['id']!r} does not match its content ({built.id})")
        return built


def verified_ranges(layout: manifest.Layout, held: Iterable[int]) -> Ranges:
    """Per file path, the sorted, merged byte ranges ``[start, end)`` covered by ``held`` chunks."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for index in held:
        if 0 <= index < layout.chunk_count:
            for piece in layout.pieces(index):
                spans.setdefault(piece.path, []).append((piece.file_offset, piece.file_offset + piece.length))
    merged: Ranges = {}
    for path, items in spans.items():
        items.sort()
        out: list[tuple[int, int]] = []
        for start, end in items:
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[path] = out
    return merged


def kept_ranges(old: manifest.Layout, new: manifest.Layout, held: Iterable[int]) -> Ranges:
    """The bytes ``held`` chunks of ``old`` verified, in the files ``new`` still has, cut to their new sizes."""
    sizes = {f.path: f.size for f in new.files}
    out: Ranges = {}
    for path, ranges in verified_ranges(old, held).items():
        if path in sizes:
            kept = [(a, min(b, sizes[path])) for a, b in ranges if a < sizes[path]]
            if kept:
                out[path] = kept
    return out


def _covered(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    i = bisect.bisect_right(ranges, (start, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= start and end <= ranges[i][1]


def reuse_candidates(new: manifest.Layout, ranges: Ranges) -> set[int]:
    """Chunks of ``new`` whose every piece lies inside verified bytes kept at the same path."""
    out = set()
    for index in range(new.chunk_count):
        pieces = new.pieces(index)
        if all(p.path in ranges and _covered(ranges[p.path], p.file_offset, p.file_offset + p.length) for p in pieces):
            out.add(index)
    return out


def unchanged_files(old: Revision, new: Revision) -> set[str]:
    """Paths whose size and (non-empty) tag are the same in both listing revisions."""
    if old.manifest_digest is not None or new.manifest_digest is not None:
        return set()
    before = old.pins()
    return {path for path, (size, tag) in new.pins().items() if tag and before.get(path) == (size, tag)}


def provable(new: manifest.Layout, index: int, *, candidates: Set[int], unchanged: set[str]) -> bool:
    """Whether chunk ``index`` of ``new`` may be hashed from kept bytes instead of read from the origin."""
    return index in candidates and all(p.path in unchanged for p in new.pieces(index))


def prior_chunks(old: manifest.Layout, new: manifest.Layout, index: int) -> set[int] | None:
    """Chunks of ``old`` that hold the bytes of chunk ``index`` of ``new`` (same paths and file
    offsets), or None if a piece lies in a file ``old`` does not have or beyond its end."""
    files = {f.path: f for f in old.files}
    out: set[int] = set()
    for piece in new.pieces(index):
        entry = files.get(piece.path)
        if entry is None or piece.file_offset + piece.length > entry.size:
            return None
        start = entry.offset + piece.file_offset
        end = start + piece.length
        out.update(range(start // old.chunk_size, (end - 1) // old.chunk_size + 1))
    return out


class SourceChecks:
    """When the agent on origin duty next compares the source with the distributed revision.

    ``due(now)`` is first true ``interval`` seconds after the first call; ``read(now)`` (the
    source was read: a check or a take) schedules the next check one interval later;
    ``failed(now)`` schedules a retry after the back-off (``interval`` doubling up to ``cap``,
    jittered) and returns the wait."""

    def __init__(self, *, interval: float, cap: float, rng: random.Random | None = None) -> None:
        if interval <= 0 or cap < interval:
            raise ValueError(f"source checks need 0 < interval <= cap, got {interval} and {cap}")
        self.interval = interval
        self.cap = cap
        self.rng = rng or random.Random()
        self.failures = 0
        self._next: float | None = None

    def due(self, now: float) -> bool:
        if self._next is None:
            self._next = now + self.interval
        return now >= self._next

    def read(self, now: float) -> None:
        self.failures = 0
        self._next = now + self.interval

    def failed(self, now: float) -> float:
        self.failures += 1
        wait = backoff.delay(self.failures, base=self.interval, cap=self.cap, rng=self.rng)
        self._next = now + wait
        return wait
