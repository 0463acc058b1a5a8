"""The SSD tier: verified chunks written into the model's files in place, per source revision.

Owns the staging directory ``<cache-dir>/<namespace>/<name>/``:

- ``revision.json``: the revision (``ringseed.protocol.revision``: layout and per-file tags)
  the staged files follow, written atomically. (``layout.json`` of older agents is read as a
  revision without tags.)
- ``files/<path>``: every file of the model, created sparse at its final size; a verified
  chunk is written at its offsets with ``pwrite`` (no copy of the model anywhere else).
- ``verified.journal``: one line ``<index> <sha256>`` per chunk whose bytes are on disk, and
  ``<index> -`` for a chunk dropped since (rot found, write failed). A line is appended only
  after the chunk's file data was ``fdatasync``-ed, and the journal is ``fsync``-ed, so after a
  crash every journaled chunk is really there. A torn last line is ignored.
- ``prior.json``: after a move to another revision, the previous revision and the chunks it
  held (the agent on origin duty may prove unchanged chunks from them instead of pulling them).
- ``lock``: ``flock``-ed while an agent runs, so two agents never share a staging directory.

Rules:
- Moving to another revision keeps every staged file whose path the new revision still has
  (cut or grown to its new size) and deletes the others; the journal starts empty and
  :class:`Opened` names the byte ranges that held verified bytes, so the agent can reuse
  chunks by hash (``revision.reuse_candidates``) instead of fetching them. Reopening the same
  revision (an agent restart) names those ranges again from ``prior.json``: bytes kept from the
  previous revision that were not yet checked by hash stay candidates, never dropped silently.
- Never write through a hard link: a staged file also linked into a published model
  (``st_nlink > 1``) is first copied to a private file that replaces it in staging (the
  published model keeps its inode and its bytes) before any write or resize.
- Budget: with ``budget`` (``--ssd-bytes``), a write that would take the staged files' real
  allocation (``st_blocks``) above it raises :class:`DiskFull`, as does a file system with less
  free space than the write, or ENOSPC from the write itself. Nothing is journaled for it.
- All methods block; the agent calls them through ``asyncio.to_thread``, from several threads at
  once: reads, writes and commits share the open files, while opening another revision and
  closing wait for them to finish and hold them off meanwhile (:class:`_Gate`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringseed.protocol import manifest, revision

JOURNAL = "verified.journal"
REVISION = "revision.json"
LEGACY_LAYOUT = "layout.json"
PRIOR = "prior.json"
LOCK = "lock"
FILES = "files"
DETACH_TMP = "detach.tmp"
FREE_MARGIN = 1 << 20  # free bytes the file system must keep beyond a write


class DiskFull(OSError):
    """Staging cannot take the bytes: ENOSPC, or the ``--ssd-bytes`` budget."""


class Busy(RuntimeError):
    """Another agent holds this staging directory."""


def journal_entries(path: Path) -> list[tuple[int, str | None]]:
    """A journal file's lines in order: (index, hash), or (index, None) for a drop (missing file:
    none; torn or malformed lines skipped)."""
    out: list[tuple[int, str | None]] = []
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.split("\n"):
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if parts[1] == "-":
            out.append((int(parts[0]), None))
        elif len(parts[1]) == 64:
            out.append((int(parts[0]), parts[1]))
    return out


def read_journal(path: Path) -> dict[int, str]:
    """Chunk index -> hash from a journal file: the chunks verified and not dropped since."""
    out: dict[int, str] = {}
    for index, digest in journal_entries(path):
        if digest is None:
            out.pop(index, None)
        else:
            out[index] = digest
    return out


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (temp file, fsync, rename, fsync of the directory)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class _Gate:
    """Many users at once (reads, writes, commits) or one owner (open, close), never both.

    A thread already using the gate may use it again (a publish commits), even while an owner waits.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._owned = False
        self._mine = threading.local()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        depth = getattr(self._mine, "depth", 0)
        if not depth:
            with self._cond:
                while self._owned:
                    self._cond.wait()
                self._users += 1
        self._mine.depth = depth + 1
        try:
            yield
        finally:
            self._mine.depth = depth
            if not depth:
                with self._cond:
                    self._users -= 1
                    if not self._users:
                        self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._owned:
                self._cond.wait()
            self._owned = True
            while self._users:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._owned = False
                self._cond.notify_all()


@dataclass(frozen=True)
class Prior:
    """The revision staged before the current one and the chunks it held (hash per index)."""

    revision: revision.Revision
    held: dict[int, str]

    def to_dict(self) -> dict[str, Any]:
        return {"revision": self.revision.to_dict(), "held": {str(i): h for i, h in self.held.items()}}

    @classmethod
    def from_dict(cls, d: Any) -> Prior:
        held = {int(i): str(h) for i, h in d["held"].items()}
        return cls(revision=revision.Revision.from_dict(d["revision"]), held=held)


@dataclass(frozen=True)
class Opened:
    """What :meth:`Store.open` found: chunks verified under this revision, bytes kept from another."""

    verified: dict[int, str]
    kept: revision.Ranges = field(default_factory=dict)
    prior: Prior | None = None


class Store:
    """Staged model files plus the journal of verified chunks."""

    def __init__(self, root: Path, *, budget: int | None = None) -> None:
        self.root = root
        self.files_dir = root / FILES
        self.budget = budget
        self.revision: revision.Revision | None = None
        self._fds: dict[str, int] = {}
        self._retired: list[int] = []  # fds replaced by a detach; closed at close() (a reader may hold one)
        self._private: set[str] = set()  # staged files known not to be linked elsewhere
        self._allocated: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()  # writes and commits run on worker threads
        self._commit_lock = threading.Lock()  # one commit at a time: its syncs finish before any journal line
        self._detach_lock = threading.Lock()
        self._journal: int | None = None
        self._lock_fd: int | None = None
        self._gate = _Gate()

    @property
    def layout(self) -> manifest.Layout | None:
        return self.revision.layout if self.revision is not None else None

    def acquire(self) -> None:
        """Take the staging directory's lock; :class:`Busy` if another agent holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise Busy(f"{self.root} is in use by another agent (lock held)") from exc
        self._lock_fd = fd

    def saved_revision(self) -> revision.Revision | None:
        """The revision of a previous run's staging, if it is readable."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return revision.Revision.from_dict(json.loads((self.root / REVISION).read_text()))
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return revision.Revision(
                layout=manifest.Layout.from_dict(json.loads((self.root / LEGACY_LAYOUT).read_text()))
            )
        return None

    def saved_prior(self) -> Prior | None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            return Prior.from_dict(json.loads((self.root / PRIOR).read_text()))
        return None

    # -- opening and moving between revisions ----------------------------------------------

    def open(self, target: revision.Revision) -> Opened:
        """Prepare staging for ``target``; keeps what an earlier run of it (or another revision) left."""
        with self._gate.exclusive():
            return self._open(target)

    def _open(self, target: revision.Revision) -> Opened:
        self._close_files()
        saved = self.saved_revision()
        if saved is not None and saved.id == target.id:
            verified = {i: h for i, h in read_journal(self.root / JOURNAL).items() if i < target.layout.chunk_count}
            before = self.saved_prior()  # bytes an earlier revision verified stay candidates across restarts
            ranges = {} if before is None else revision.kept_ranges(before.revision.layout, target.layout, before.held)
            self._open_files(target)
            return Opened(verified=verified, kept=ranges, prior=before)
        kept: revision.Ranges = {}
        prior: Prior | None = None
        if saved is not None:
            held = read_journal(self.root / JOURNAL)
            prior = Prior(revision=saved, held={i: h for i, h in held.items() if i < saved.layout.chunk_count})
            kept = self._keep_files(saved.layout, target.layout, prior.held)
            write_atomic(self.root / PRIOR, json.dumps(prior.to_dict()))
        else:
            shutil.rmtree(self.files_dir, ignore_errors=True)
            (self.root / PRIOR).unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / JOURNAL)
        (self.root / LEGACY_LAYOUT).unlink(missing_ok=True)
        self._open_files(target)
        return Opened(verified={}, kept=kept, prior=prior)

    def _keep_files(self, old: manifest.Layout, new: manifest.Layout, held: dict[int, str]) -> revision.Ranges:
        """Delete staged files ``new`` does not have; return the verified ranges of the kept ones."""
        wanted = {f.path for f in new.files}
        for entry in old.files:
            if entry.path not in wanted:
                with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                    os.unlink(self.files_dir / entry.path)
        for dirpath, _, _ in sorted(os.walk(self.files_dir), reverse=True):  # empty directories left behind
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        return revision.kept_ranges(old, new, held)

    def _open_files(self, target: revision.Revision) -> None:
        self.files_dir.mkdir(parents=True, exist_ok=True)
        for entry in target.layout.files:
            path = self.files_dir / entry.path
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)  # was a directory in the previous revision
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            self._fds[entry.path] = fd
            st = os.fstat(fd)
            if st.st_nlink == 1:
                self._private.add(entry.path)
            if st.st_size != entry.size:
                fd = self._writable(entry.path)
                os.ftruncate(fd, entry.size)
            self._allocated[entry.path] = os.fstat(fd).st_blocks * 512
        write_atomic(self.root / REVISION, json.dumps(target.to_dict()))
        self.revision = target
        self._journal = os.open(self.root / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    # -- writing ---------------------------------------------------------------------------

    def _pieces(self, index: int) -> list[manifest.ChunkPiece]:
        if self.layout is None:
            raise RuntimeError("store is not open")
        return self.layout.pieces(index)

    def _writable(self, path: str) -> int:
        """The fd of staged ``path``, copied to a private file first if it is linked elsewhere."""
        if path in self._private:
            return self._fds[path]
        with self._detach_lock:
            fd = self._fds[path]
            if os.fstat(fd).st_nlink > 1:
                tmp = self.root / DETACH_TMP
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    _copy(fd, out)
                    os.rename(tmp, self.files_dir / path)
                except BaseException:
                    os.close(out)
                    raise
                self._retired.append(fd)
                self._fds[path] = fd = out
                with self._lock:
                    self._dirty.add(path)
            self._private.add(path)
            return fd

    def room_for(self, nbytes: int) -> str | None:
        """Why staging cannot take ``nbytes`` more now (budget or free space), or None."""
        if self.budget is not None and sum(self._allocated.values()) + nbytes > self.budget:
            used = sum(self._allocated.values())
            return f"staging holds {used} bytes; {nbytes} more would pass --ssd-bytes {self.budget}"
        try:
            st = os.statvfs(self.files_dir)
        except OSError:
            return None
        free = st.f_bavail * st.f_frsize
        if free < nbytes + FREE_MARGIN:
            return f"{self.files_dir} has {free} bytes free; a chunk needs {nbytes}"
        return None

    def write_chunk(self, index: int, data: bytes | bytearray | memoryview) -> None:
        """Write a verified chunk at its offsets (page cache; durable after :meth:`commit`).

        :class:`DiskFull` when the budget or the file system has no room for it.
        """
        with self._gate.shared():
            self._write_chunk(index, memoryview(data))

    def _write_chunk(self, index: int, view: memoryview) -> None:
        pieces = self._pieces(index)
        problem = self.room_for(len(view))
        if problem is not None:
            raise DiskFull(errno.ENOSPC, problem)
        for piece in pieces:
            part = view[piece.chunk_offset : piece.chunk_offset + piece.length]
            fd = self._writable(piece.path)
            written = 0
            try:
                while written < piece.length:
                    written += os.pwrite(fd, part[written:], piece.file_offset + written)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFull(exc.errno, f"{self.files_dir}: {os.strerror(exc.errno)}") from exc
                raise
            finally:
                self._allocated[piece.path] = os.fstat(fd).st_blocks * 512
            with self._lock:
                self._dirty.add(piece.path)

    def commit(self, entries: Iterable[tuple[int, str]]) -> None:
        """Make written chunks durable, then journal them (data first, then the record)."""
        self._journal_lines("".join(f"{i} {h}\n" for i, h in entries), sync_data=True)

    def drop(self, indices: Iterable[int]) -> None:
        """Journal that ``indices`` are no longer verified here (a restart must not trust them)."""
        self._journal_lines("".join(f"{i} -\n" for i in indices), sync_data=False)

    def _journal_lines(self, lines: str, *, sync_data: bool) -> None:
        with self._gate.shared(), self._commit_lock:
            if sync_data:
                with self._lock:
                    dirty, self._dirty = self._dirty, set()
                for path in sorted(dirty):
                    os.fdatasync(self._fds[path])
            if lines and self._journal is not None:
                os.write(self._journal, lines.encode("ascii"))
                os.fsync(self._journal)

    # -- reading ---------------------------------------------------------------------------

    def read_chunk(self, index: int) -> bytes:
        """The chunk's bytes from the staged files."""
        with self._gate.shared():
            parts = [os.pread(self._fds[p.path], p.length, p.file_offset) for p in self._pieces(index)]
        return b"".join(parts)

    def read_prior_chunk(self, prior: manifest.Layout, index: int) -> bytes:
        """Chunk ``index`` of a prior layout, read from the staged files kept by path (may be short)."""
        parts = []
        with self._gate.shared():
            for piece in prior.pieces(index):
                fd = self._fds.get(piece.path)
                parts.append(os.pread(fd, piece.length, piece.file_offset) if fd is not None else b"")
        return b"".join(parts)

    def file_slices(self, index: int) -> list[tuple[Path, int, int]]:
        """``(staged file, offset, length)`` for sendfile, in chunk order."""
        return [(self.files_dir / p.path, p.file_offset, p.length) for p in self._pieces(index)]

    def in_use(self) -> contextlib.AbstractContextManager[None]:
        """Hold the staged files as they are (no revision change, no close) for a while: a publish."""
        return self._gate.shared()

    def shared(self) -> None:
        """The staged files were just linked into a published model: copy before the next write."""
        with self._detach_lock:
            self._private.clear()

    # -- closing ---------------------------------------------------------------------------

    def close_files(self) -> None:
        with self._gate.exclusive():
            self._close_files()

    def _close_files(self) -> None:
        for fd in [*self._fds.values(), *self._retired]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._retired.clear()
        self._private.clear()
        self._allocated.clear()
        self._dirty.clear()
        if self._journal is not None:
            with contextlib.suppress(OSError):
                os.close(self._journal)
            self._journal = None

    def close(self) -> None:
        self.close_files()
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None


def _copy(src: int, dst: int) -> None:
    """Copy the whole of ``src`` into ``dst`` in the kernel (reflink where the file system can)."""
    size = os.fstat(src).st_size
    offset = 0
    while offset < size:
        try:
            copied = os.copy_file_range(src, dst, size - offset, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            copied = _copy_plain(src, dst, offset, min(size - offset, 8 << 20))
        if copied == 0:
            break
        offset += copied
    os.ftruncate(dst, size)


def _copy_plain(src: int, dst: int, offset: int, length: int) -> int:
    data = os.pread(src, length, offset)
    written = 0
    while written < len(data):
        written += os.pwrite(dst, data[written:], offset + written)
    return len(data)
