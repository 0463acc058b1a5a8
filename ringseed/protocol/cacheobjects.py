"""Objects of the node cache (PCache): names, chunk lists, and the rules a path must follow.

Owns what an object *is* for the cache master, the node cache agents and the SDK: a file of the
group's tree, stored as an ordered list of content-addressed chunks (SHA-256 and length). Pure:
no I/O, no clock.

Rules:
- A path is relative to the group's tree, ``/``-separated, with no empty, ``.`` or ``..`` parts,
  no NUL and no backslash (:func:`ringseed.protocol.manifest.validate_relpath`), at most
  ``MAX_PATH`` bytes. A path that would leave the tree is refused with :class:`PathError`
  naming it; nothing is ever stored under a refused name.
- ``data/`` is the read-only dataset tree (issue 13); checkpoints live anywhere else. A
  *checkpoint* is a top-level entry of the tree: ``step-100/model.pt`` belongs to checkpoint
  ``step-100``, a top-level file is its own checkpoint. Retention counts checkpoints.
- An object's chunks cover its bytes in order; each chunk's length is stored with it (any
  positive length; writers cut at a fixed size), and an empty object has no chunks.
- Hashes are lowercase hex SHA-256 of the chunk's bytes; the same bytes are the same chunk
  everywhere (identical chunks of two checkpoints are stored once per node).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ringseed.protocol import manifest

DATA_ROOT = "data"
MAX_PATH = 4096
MAX_CHUNKS = 1 << 20
_HEX = frozenset("0123456789abcdef")


class PathError(ValueError):
    """A path the cache refuses; the message names the path and the problem."""


def check_path(path: object, *, what: str = "path") -> str:
    """``path`` normalised (leading ``/`` dropped) if it is a clean name in the group's tree."""
    if not isinstance(path, str):
        raise PathError(f"{what} {path!r}: must be a string")
    stripped = path.lstrip("/")
    if len(stripped.encode("utf-8", "surrogatepass")) > MAX_PATH:
        raise PathError(f"{what} {path[:80]!r}...: longer than {MAX_PATH} bytes")
    try:
        return manifest.validate_relpath(stripped)
    except manifest.ManifestError as exc:
        raise PathError(f"{what} {path!r} is refused: {str(exc).split(': ', 1)[-1]}") from None


def check_dir(path: object, *, what: str = "directory") -> str:
    """A directory name: ``""`` (the root) or a clean path; a trailing ``/`` is allowed."""
    if isinstance(path, str) and path.strip("/") == "":
        return ""
    if isinstance(path, str):
        path = path.rstrip("/")
    return check_path(path, what=what)


def is_data(path: str) -> bool:
    """Whether ``path`` lies in the read-only dataset tree."""
    return path == DATA_ROOT or path.startswith(DATA_ROOT + "/")


def check_writable(path: object) -> str:
    """A path a writer may create, rename or delete: clean and outside ``data/``."""
    clean = check_path(path)
    if is_data(clean):
        raise PathError(f"path {clean!r}: {DATA_ROOT}/ holds datasets and is read-only")
    return clean


def checkpoint_of(path: str) -> str:
    """The checkpoint an object belongs to: its top-level name."""
    return path.split("/", 1)[0]


def is_under(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` itself or inside it (``""`` is the root)."""
    return directory == "" or path == directory or path.startswith(directory + "/")


def check_sha256(value: object, *, what: str = "sha256") -> str:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
        raise ValueError(f"{what}: {value!r} is not a lowercase hex SHA-256")
    return value


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of an object: its content hash and length."""

    sha256: str
    length: int

    def to_list(self) -> list[Any]:
        return [self.sha256, self.length]


def chunks_from(raw: object, *, what: str = "chunks") -> tuple[ChunkRef, ...]:
    """Chunk refs from ``[[sha256, length], ...]``; ValueError naming the bad entry."""
    if not isinstance(raw, list | tuple):
        raise ValueError(f"{what}: must be a list of [sha256, length]")
    if len(raw) > MAX_CHUNKS:
        raise ValueError(f"{what}: {len(raw)} chunks is more than {MAX_CHUNKS}")
    out: list[ChunkRef] = []
    for i, item in enumerate(raw):
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise ValueError(f"{what}[{i}]: must be [sha256, length]")
        sha, length = item
        check_sha256(sha, what=f"{what}[{i}][0]")
        if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
            raise ValueError(f"{what}[{i}][1]: length must be a positive integer, got {length!r}")
        out.append(ChunkRef(sha256=sha, length=length))
    return tuple(out)


@dataclass(frozen=True)
class ObjectMeta:
    """A committed object: immutable; a new write of the same path is a new version."""

    path: str
    version: int  # the log sequence number of the commit that made it
    size: int
    chunks: tuple[ChunkRef, ...]
    writer: str
    committed_at: float  # wall-clock seconds (for ages a user reads)
    persisted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "version": self.version,
            "size": self.size,
            "chunks": [c.to_list() for c in self.chunks],
            "writer": self.writer,
            "committed_at": self.committed_at,
            "persisted": self.persisted,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ObjectMeta:
        chunks = chunks_from(d["chunks"])
        meta = cls(
            path=check_path(d["path"]),
            version=int(d["version"]),
            size=int(d["size"]),
            chunks=chunks,
            writer=str(d["writer"]),
            committed_at=float(d["committed_at"]),
            persisted=bool(d.get("persisted", False)),
        )
        check_size(meta.size, meta.chunks, what=meta.path)
        return meta

    def chunk_spans(self) -> list[tuple[int, int]]:
        """``[start, end)`` of every chunk in the object's bytes."""
        return spans([c.length for c in self.chunks])


def check_size(size: object, chunks: Sequence[ChunkRef], *, what: str) -> int:
    """The object's size must be the sum of its chunk lengths."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"{what}: size must be a non-negative integer, got {size!r}")
    total = sum(c.length for c in chunks)
    if total != size:
        raise ValueError(f"{what}: size says {size} bytes but the chunks hold {total}")
    return size


def spans(lengths: Iterable[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of consecutive pieces of the given lengths."""
    out, start = [], 0
    for length in lengths:
        out.append((start, start + length))
        start += length
    return out


def chunk_range(spans: Sequence[tuple[int, int]], start: int, end: int) -> range:
    """Indices of the chunks that overlap ``[start, end)`` (spans as from :meth:`ObjectMeta.chunk_spans`)."""
    if end <= start or not spans:
        return range(0)
    lo = _find(spans, start)
    hi = _find(spans, end - 1)
    return range(lo, hi + 1)


def _find(spans: Sequence[tuple[int, int]], offset: int) -> int:
    lo, hi = 0, len(spans) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if spans[mid][1] <= offset:
            lo = mid + 1
        else:
            hi = mid
    return lo


def listing(paths: Iterable[str], directory: str) -> tuple[list[str], list[str]]:
    """``(files, subdirectories)`` directly inside ``directory`` among object ``paths`` (full names)."""
    files: list[str] = []
    dirs: set[str] = set()
    prefix = "" if directory == "" else directory + "/"
    for path in paths:
        if not path.startswith(prefix) or path == directory:
            continue
        rest = path[len(prefix) :]
        head, sep, _ = rest.partition("/")
        if sep:
            dirs.add(prefix + head)
        else:
            files.append(path)
    return sorted(files), sorted(dirs)
