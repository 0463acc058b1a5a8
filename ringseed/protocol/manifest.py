"""The manifest: how a model's files become one byte stream of fixed-size, hashed chunks.

Owns the layout (files in sorted relative-path order, concatenated into one stream, cut into
``chunk_size`` pieces; the last chunk is short), the per-chunk SHA-256 list, and the digest of
the manifest itself. Pure: no I/O, no clock.

Rules:
- Paths are relative, ``/``-separated, with no empty, ``.`` or ``..`` parts, no NUL, no
  backslash; a path may not be both a file and a directory (``a`` and ``a/b``); duplicates
  are rejected. Every rejection is a :class:`ManifestError` naming the path and the problem.
- Names starting with ``.ringseed-`` (:data:`RESERVED_PREFIX`) at the top of the model are
  reserved: the agent writes its completion marker (:data:`MARKER_NAME`) there, and a model
  file of that name would collide with it.
- Empty files are allowed (they take 0 bytes of the stream); an empty source (no files, or
  a total size of 0) is rejected.
- ``mode`` keeps permission bits only (``0 <= mode <= 0o7777``).
- ``chunk_size`` lies in ``[MIN_CHUNK_SIZE, MAX_CHUNK_SIZE]``.
- The digest is the SHA-256 of the canonical JSON (sorted keys, no spaces, UTF-8) of
  ``{"version", "chunk_size", "files": [{"path", "size", "mode"}], "chunk_hashes"}``.
  ``Manifest.from_dict`` checks it when the dict carries one.
- :class:`ChunkHasher` hashes a stream fed in order with bounded memory (one hash state).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MIN_CHUNK_SIZE = 1 << 20
MAX_CHUNK_SIZE = 1 << 30
DEFAULT_CHUNK_SIZE = 64 << 20
FORMAT_VERSION = 1
RESERVED_PREFIX = ".ringseed-"
MARKER_NAME = ".ringseed-complete"
_HEX = frozenset("0123456789abcdef")


class ManifestError(ValueError):
    """A manifest or layout that cannot be used; the message names the file/field and the problem."""


def validate_relpath(path: str) -> str:
    """Return ``path`` if it is a clean relative path, else raise :class:`ManifestError`."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"file path {path!r}: must be a non-empty string")
    if "\x00" in path:
        raise ManifestError(f"file path {path!r}: contains a NUL byte")
    if "\\" in path:
        raise ManifestError(f"file path {path!r}: contains a backslash (use '/')")
    if path.startswith("/"):
        raise ManifestError(f"file path {path!r}: is absolute (must be relative to the source root)")
    for part in path.split("/"):
        if part == "":
            raise ManifestError(f"file path {path!r}: has an empty part ('//' or trailing '/')")
        if part == "..":
            raise ManifestError(f"file path {path!r}: contains '..' (leaves the source root)")
        if part == ".":
            raise ManifestError(f"file path {path!r}: contains '.' (not a canonical path)")
    return path


def check_chunk_size(chunk_size: int) -> int:
    """Return ``chunk_size`` if it is an int in the allowed range, else raise :class:`ManifestError`."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ManifestError(f"chunk_size: must be an integer, got {type(chunk_size).__name__}")
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ManifestError(
            f"chunk_size: {chunk_size} is outside the allowed range [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}] (1Mi to 1Gi)"
        )
    return chunk_size


def chunk_sha256(data: bytes | memoryview) -> str:
    """Lowercase hex SHA-256 of one chunk."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One file of the source: its place in the stream and how to materialise it."""

    path: str
    size: int
    mode: int
    offset: int


@dataclass(frozen=True)
class ChunkPiece:
    """A slice of one file that makes up part of a chunk."""

    path: str
    file_offset: int
    length: int
    chunk_offset: int


def _check_entry(path: str, size: int, mode: int) -> None:
    validate_relpath(path)
    if path.split("/", 1)[0].startswith(RESERVED_PREFIX):
        raise ManifestError(
            f"file path {path!r}: top-level names starting with {RESERVED_PREFIX!r} are reserved "
            f"for ringseed (its marker {MARKER_NAME!r} sits next to the model files); rename it"
        )
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ManifestError(f"file {path!r}: size must be a non-negative integer, got {size!r}")
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise ManifestError(f"file {path!r}: mode must be permission bits in [0, 0o7777], got {mode!r}")


def _check_names(paths: list[str]) -> None:
    """Sorted paths: reject duplicates and a path that is also a directory of another."""
    names = set()
    for i, path in enumerate(paths):
        if i and paths[i - 1] == path:
            raise ManifestError(f"file path {path!r}: appears twice (duplicate name)")
        names.add(path)
    for path in paths:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in names:
                raise ManifestError(f"file path {path!r}: its parent {parent!r} is also a file")


@dataclass(frozen=True)
class Layout:
    """Files in sorted path order forming one stream, and the chunk size that cuts it."""

    files: tuple[FileEntry, ...]
    chunk_size: int
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(f.offset for f in self.files))

    @classmethod
    def build(cls, entries: Iterable[tuple[str, int, int]], *, chunk_size: int) -> Layout:
        """Validate ``(path, size, mode)`` entries, sort them by path and compute offsets."""
        check_chunk_size(chunk_size)
        items = list(entries)
        for path, size, mode in items:
            _check_entry(path, size, mode)
        items.sort(key=lambda item: item[0])
        _check_names([item[0] for item in items])
        files: list[FileEntry] = []
        offset = 0
        for path, size, mode in items:
            files.append(FileEntry(path=path, size=size, mode=mode, offset=offset))
            offset += size
        if not files:
            raise ManifestError("source is empty: it has no files")
        if offset == 0:
            raise ManifestError(f"source is empty: its {len(files)} file(s) hold 0 bytes")
        return cls(files=tuple(files), chunk_size=chunk_size)

    @property
    def total_size(self) -> int:
        last = self.files[-1]
        return last.offset + last.size

    @property
    def chunk_count(self) -> int:
        return -(-self.total_size // self.chunk_size)

    def chunk_span(self, index: int) -> tuple[int, int]:
        """``[start, end)`` of chunk ``index`` in the stream."""
        if not 0 <= index < self.chunk_count:
            raise IndexError(f"chunk index {index} out of range [0, {self.chunk_count})")
        start = index * self.chunk_size
        return start, min(start + self.chunk_size, self.total_size)

    def chunk_length(self, index: int) -> int:
        start, end = self.chunk_span(index)
        return end - start

    def pieces(self, index: int) -> list[ChunkPiece]:
        """The file slices, in stream order, that make up chunk ``index`` (empty files skipped)."""
        start, end = self.chunk_span(index)
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        out: list[ChunkPiece] = []
        while i < len(self.files) and self.files[i].offset < end:
            entry = self.files[i]
            lo = max(start, entry.offset)
            hi = min(end, entry.offset + entry.size)
            if hi > lo:
                out.append(
                    ChunkPiece(path=entry.path, file_offset=lo - entry.offset, length=hi - lo, chunk_offset=lo - start)
                )
            i += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "chunk_size": self.chunk_size,
            "files": [{"path": f.path, "size": f.size, "mode": f.mode} for f in self.files],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Layout:
        """Rebuild and validate a layout from :meth:`to_dict` output."""
        if not isinstance(d, Mapping):
            raise ManifestError(f"layout: must be a JSON object, got {type(d).__name__}")
        version = d.get("version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise ManifestError(f"version: unsupported manifest version {version!r} (expected {FORMAT_VERSION})")
        if "chunk_size" not in d:
            raise ManifestError("chunk_size: field is required")
        files = d.get("files")
        if not isinstance(files, list):
            raise ManifestError("files: must be a list of {path, size, mode} objects")
        entries = [_entry_from_dict(i, item) for i, item in enumerate(files)]
        return cls.build(entries, chunk_size=d["chunk_size"])


def _entry_from_dict(i: int, item: Any) -> tuple[str, int, int]:
    if not isinstance(item, Mapping):
        raise ManifestError(f"files[{i}]: must be an object with path, size and mode")
    for key in ("path", "size"):
        if key not in item:
            raise ManifestError(f"files[{i}]: field {key!r} is required")
    return item["path"], item["size"], item.get("mode", 0o644)


def _canonical(d: Mapping[str, Any]) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _check_hashes(hashes: Any, *, count: int) -> tuple[str, ...]:
    if not isinstance(hashes, list | tuple):
        raise ManifestError("chunk_hashes: must be a list of hex SHA-256 strings")
    if len(hashes) != count:
        raise ManifestError(f"chunk_hashes: has {len(hashes)} entries, the layout has {count} chunks")
    for i, h in enumerate(hashes):
        if not isinstance(h, str) or len(h) != 64 or not set(h) <= _HEX:
            raise ManifestError(f"chunk_hashes[{i}]: {h!r} is not a lowercase hex SHA-256")
    return tuple(hashes)


@dataclass(frozen=True)
class Manifest:
    """A layout plus the SHA-256 of every chunk; its digest names the whole model."""

    layout: Layout
    chunk_hashes: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_hashes(self.chunk_hashes, count=self.layout.chunk_count)

    @property
    def digest(self) -> str:
        body = dict(self.layout.to_dict(), chunk_hashes=list(self.chunk_hashes))
        return hashlib.sha256(_canonical(body)).hexdigest()

    def chunk_ok(self, index: int, data: bytes | memoryview) -> bool:
        """Whether ``data`` is exactly chunk ``index`` (length and hash)."""
        return len(data) == self.layout.chunk_length(index) and chunk_sha256(data) == self.chunk_hashes[index]

    def to_dict(self) -> dict[str, Any]:
        d = self.layout.to_dict()
        d["total_size"] = self.layout.total_size
        d["chunk_count"] = self.layout.chunk_count
        d["chunk_hashes"] = list(self.chunk_hashes)
        d["digest"] = self.digest
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        """Rebuild and validate a manifest; checks ``digest``, ``total_size``, ``chunk_count`` if given."""
        layout = Layout.from_dict(d)
        for key, actual in (("total_size", layout.total_size), ("chunk_count", layout.chunk_count)):
            if key in d and d[key] != actual:
                raise ManifestError(f"{key}: says {d[key]!r} but the files give {actual}")
        if "chunk_hashes" not in d:
            raise ManifestError("chunk_hashes: field is required")
        built = cls(layout=layout, chunk_hashes=_check_hashes(d["chunk_hashes"], count=layout.chunk_count))
        if "digest" in d and d["digest"] != built.digest:
            raise ManifestError(f"digest: manifest says {d['digest']!r} but its content hashes to {built.digest!r}")
        return built


class ChunkHasher:
    """Hash a stream fed in order into per-chunk SHA-256s, holding one hash state at a time."""

    def __init__(self, chunk_size: int) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ManifestError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
        self.chunk_size = chunk_size
        self._hashes: list[str] = []
        self._current = hashlib.sha256()
        self._filled = 0
        self._finished = False

    def update(self, data: bytes | memoryview) -> None:
        if self._finished:
            raise RuntimeError("ChunkHasher.update after finish")
        view = memoryview(data).cast("B")
        while len(view):
            take = min(self.chunk_size - self._filled, len(view))
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.chunk_size:
                self._hashes.append(self._current.hexdigest())
                self._current = hashlib.sha256()
                self._filled = 0

    def finish(self) -> list[str]:
        """The hashes of all chunks, the short last one included."""
        if not self._finished:
            self._finished = True
            if self._filled:
                self._hashes.append(self._current.hexdigest())
        return list(self._hashes)
