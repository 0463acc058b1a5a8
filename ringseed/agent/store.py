"""The SSD tier and the materialiser: verified chunks written into the model's files in place.

Owns the staging directory ``<cache-dir>/<namespace>/<name>/``:

- ``layout.json``: the layout the staged files follow (written atomically). A staging directory
  whose layout differs from the model's is wiped.
- ``files/<path>``: every file of the model, created sparse at its final size; a verified
  chunk is written at its offsets with ``pwrite`` (no copy of the model anywhere else).
- ``verified.journal``: one line ``<index> <sha256>`` per chunk whose bytes are on disk. A line
  is appended only after the chunk's file data was ``fdatasync``-ed, and the journal is
  ``fsync``-ed, so after a crash every journaled chunk is really there. A torn last line is
  ignored. On restart the journal is trusted (the tracker still checks its hashes).

Materialising builds ``<data-dir>/<namespace>/.<name>.tmp-<pid>/`` with hard links to the staged
files (copies across file systems), writes ``.ringseed-complete`` (JSON with
``manifest_digest``), fsyncs and renames it to ``<data-dir>/<namespace>/<name>/``: readers see
either no model or a whole one. All methods block; the agent calls them through
``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from ringseed.protocol import manifest

MARKER = ".ringseed-complete"
JOURNAL = "verified.journal"
LAYOUT = "layout.json"


def read_journal(path: Path) -> dict[int, str]:
    """Chunk index -> hash from a journal file (missing file: empty; torn lines skipped)."""
    out: dict[int, str] = {}
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.split("\n"):
        parts = line.split(" ")
        if len(parts) == 2 and parts[0].isdigit() and len(parts[1]) == 64:
            out[int(parts[0])] = parts[1]
    return out


def read_marker(model_dir: Path) -> str | None:
    """The manifest digest recorded in a materialised model's marker, if any."""
    try:
        return str(json.loads((model_dir / MARKER).read_text())["manifest_digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Store:
    """Staged model files plus the journal of verified chunks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files_dir = root / "files"
        self.layout: manifest.Layout | None = None
        self._fds: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()  # writes and commits run on worker threads
        self._commit_lock = threading.Lock()  # one commit at a time: its syncs finish before any journal line
        self._journal: int | None = None

    def saved_layout(self) -> manifest.Layout | None:
        """The layout of a previous run's staging, if it is readable."""
        try:
            return manifest.Layout.from_dict(json.loads((self.root / LAYOUT).read_text()))
        except (OSError, ValueError):
            return None

    def open(self, layout: manifest.Layout) -> dict[int, str]:
        """Prepare staging for ``layout``; returns the chunks verified by an earlier run."""
        self.close()
        if self.saved_layout() != layout:
            shutil.rmtree(self.root, ignore_errors=True)
        self.files_dir.mkdir(parents=True, exist_ok=True)
        for entry in layout.files:
            path = self.files_dir / entry.path
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size != entry.size:
                os.ftruncate(fd, entry.size)
            self._fds[entry.path] = fd
        tmp = self.root / (LAYOUT + ".tmp")
        tmp.write_text(json.dumps(layout.to_dict()))
        os.replace(tmp, self.root / LAYOUT)
        _fsync_dir(self.root)
        self.layout = layout
        verified = {i: h for i, h in read_journal(self.root / JOURNAL).items() if i < layout.chunk_count}
        self._journal = os.open(self.root / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return verified

    def _pieces(self, index: int) -> list[manifest.ChunkPiece]:
        if self.layout is None:
            raise RuntimeError("store is not open")
        return self.layout.pieces(index)

    def write_chunk(self, index: int, data: bytes | bytearray) -> None:
        """Write a verified chunk at its offsets (page cache; durable after :meth:`commit`)."""
        view = memoryview(data)
        for piece in self._pieces(index):
            part = view[piece.chunk_offset : piece.chunk_offset + piece.length]
            written = 0
            while written < piece.length:
                written += os.pwrite(self._fds[piece.path], part[written:], piece.file_offset + written)
            with self._lock:
                self._dirty.add(piece.path)

    def commit(self, entries: Iterable[tuple[int, str]]) -> None:
        """Make written chunks durable, then journal them (data first, then the record)."""
        lines = "".join(f"{i} {h}\n" for i, h in entries)
        with self._commit_lock:
            with self._lock:
                dirty, self._dirty = self._dirty, set()
            for path in sorted(dirty):
                os.fdatasync(self._fds[path])
            if lines and self._journal is not None:
                os.write(self._journal, lines.encode("ascii"))
                os.fsync(self._journal)

    def read_chunk(self, index: int) -> bytes:
        """The chunk's bytes from the staged files."""
        parts = [os.pread(self._fds[p.path], p.length, p.file_offset) for p in self._pieces(index)]
        return b"".join(parts)

    def file_slices(self, index: int) -> list[tuple[Path, int, int]]:
        """``(staged file, offset, length)`` for sendfile, in chunk order."""
        return [(self.files_dir / p.path, p.file_offset, p.length) for p in self._pieces(index)]

    def materialise(self, *, model_dir: Path, digest: str) -> None:
        """Publish the staged files at ``model_dir`` atomically with a marker holding ``digest``."""
        if read_marker(model_dir) == digest:
            return
        if self.layout is None:
            raise RuntimeError("store is not open")
        self.commit(())
        model_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = model_dir.parent / f".{model_dir.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        for entry in self.layout.files:
            target = tmp / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(self.files_dir / entry.path, target)
            except OSError:
                shutil.copyfile(self.files_dir / entry.path, target)
            os.chmod(target, entry.mode & 0o777 or 0o644)
        marker = {"manifest_digest": digest, "total_size": self.layout.total_size, "files": len(self.layout.files)}
        (tmp / MARKER).write_text(json.dumps(marker))
        _fsync_dir(tmp)
        self._swap_in(tmp, model_dir)

    @staticmethod
    def _swap_in(tmp: Path, model_dir: Path) -> None:
        old = model_dir.parent / f".{model_dir.name}.old-{os.getpid()}"
        if model_dir.exists():
            os.rename(model_dir, old)
        os.rename(tmp, model_dir)
        _fsync_dir(model_dir.parent)
        shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self._journal is not None:
            with contextlib.suppress(OSError):
                os.close(self._journal)
            self._journal = None
