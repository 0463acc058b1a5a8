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
- How chunks get into the staged files (``writes``; "auto" picks the first that applies):
  "direct": a verified chunk's buffer is written with ``O_DIRECT`` (page-aligned middle; a head or
  tail off the 4 KiB boundary, or a buffer ``O_DIRECT`` refuses, goes through the page cache), on
  a file system that is not memory and takes ``O_DIRECT``. No page cache pages are allocated,
  filled and written back for it: on a machine where fresh memory is dear to touch (a virtual
  machine whose free pages went back to the host) that was most of a receiver's CPU per byte,
  BENCHMARKS section 4. The bytes are read back from the device when served from staging.
  "in-place": receiving in place (below; not on tmpfs in "auto"). "buffered": ``pwrite``.
- Receiving in place (:meth:`Store.claim`, :class:`Landing`): a chunk from a peer may be received
  straight into its region of the staged file (a mapping of it), hashed as it arrives, instead of
  into a buffer that is written afterwards (not on tmpfs: there a mapped page is zeroed first and
  a written one is not, so a buffer and a write cost less; BENCHMARKS section 4). Those bytes are
  unverified until the caller compares the hash, so a region is claimed only for a chunk that no
  journal line names (``unclaimable``: the caller passes every chunk it holds or ever held under
  this revision; the store adds what its journal named at open) and that no other claim or write
  is using; :meth:`Store.write_chunk` of a claimed chunk waits until the claim ends, so verified
  bytes always land last. The region is allocated first (``fallocate``), so writes through the
  map never meet a full disk (a mapped write there would be SIGBUS). A claim keeps the staged
  files open and sized (it is a user of the gate); opening another revision or closing aborts
  the claims first (:meth:`Landing.abort`: a receive is broken off) and waits for them to end. A
  chunk counts as verified only through its journal line, written by :meth:`commit` after the
  bytes were synced: a crash mid-receive leaves no line, so the chunk is missing after a
  restart. Unverified bytes in a region are never served (only held chunks are) nor published
  (a publish needs every chunk held, and a staged file linked into a published model is copied
  before a claim writes to it, as for any write).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
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
# File systems where receiving in place costs more than a buffer and a write (BENCHMARKS section 4):
# a page of a mapping is zeroed and faulted in one 4 KiB page at a time, a written one is not zeroed.
# They are memory: no direct writes either (there is no device to write to without the page cache).
NO_IN_PLACE = frozenset({"tmpfs", "ramfs"})
DIRECT_ALIGN = 4096  # O_DIRECT: file offsets, lengths and buffer addresses on this boundary
WRITES = ("auto", "direct", "in-place", "buffered")  # how verified chunks get into staging (``Store``)


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


def fs_type(path: Path) -> str:
    """The type of the file system ``path`` is on (``/proc/self/mountinfo``; "" when unknown)."""
    target = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields, sep, rest = line.partition(" - ")
        parts = fields.split(" ")
        if not sep or len(parts) < 5:
            continue
        mount = parts[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, rest.split(" ", 1)[0]
    return kind


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

    def try_enter(self) -> bool:
        """Become a user not tied to a thread (a claim), unless an owner holds or awaits the gate."""
        with self._cond:
            if self._owned:
                return False
            self._users += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._users -= 1
            if not self._users:
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self, before_wait: Callable[[], None] | None = None) -> Iterator[None]:
        with self._cond:
            while self._owned:
                self._cond.wait()
            self._owned = True
        try:
            if before_wait is not None:
                before_wait()  # no new users from here on; tell the long ones to end
            with self._cond:
                while self._users:
                    self._cond.wait()
        except BaseException:
            with self._cond:
                self._owned = False
                self._cond.notify_all()
            raise
        try:
            yield
        finally:
            with self._cond:
                self._owned = False
                self._cond.notify_all()


class Landing:
    """A claim on chunk ``index``'s region of the staged file, to receive the chunk in place.

    :meth:`prepare` (a worker thread) allocates the region; ``fd`` and ``offset`` then name it
    (``length`` bytes), for :meth:`ringseed.agent.peerclient.PeerClient.fetch_mapped` between
    :meth:`begin` and :meth:`end`. Nothing in it counts as verified: :meth:`release` ends the
    claim once nothing writes into the region any more, with ``landed=True`` when the caller
    verified the bytes (synced at the next commit). :meth:`abort` (the store's) ends an idle
    claim at once and a busy one when its use ends; an aborted claim's chunk is not held.
    """

    def __init__(self, store: Store, index: int, piece: manifest.ChunkPiece) -> None:
        self.index = index
        self.length = piece.length
        self.offset = piece.file_offset
        self.fd = -1
        self._store = store
        self._piece = piece
        self._aborts: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._busy = False
        self.aborted = False
        self.released = False

    def prepare(self) -> bool:
        """Allocate the region (blocks); False when staging cannot take it now (no room, an error, aborted)."""
        if not self.begin():
            return False
        store, piece = self._store, self._piece
        try:
            if store.room_for(piece.length) is not None:
                return False
            fd = store._writable(piece.path)
            os.posix_fallocate(fd, piece.file_offset, piece.length)
            store._allocated[piece.path] = os.fstat(fd).st_blocks * 512
            self.fd = fd
            return True
        except OSError:
            return False
        finally:
            self.end()

    def begin(self) -> bool:
        """Start using the region (preparing it, receiving into it); False if the store took it back."""
        with self._lock:
            if self.aborted or self.released:
                return False
            self._busy = True
            return True

    def on_abort(self, callback: Callable[[], None]) -> None:
        """While in use: call ``callback`` (from any thread) if the store must take the region back
        (revision change, close); the use must then end at once."""
        with self._lock:
            if not self.aborted:
                self._aborts.append(callback)
                return
        callback()

    def end(self) -> None:
        """Nothing writes into the region any more; a claim aborted meanwhile ends now."""
        with self._lock:
            self._busy = False
            self._aborts.clear()
            aborted = self.aborted
        if aborted:
            self.release()

    def abort(self) -> None:
        """The store takes the region back: a use in progress is told to end (and the claim ends with
        it), an idle claim ends now. The chunk is then not held from this claim."""
        with self._lock:
            self.aborted = True
            callbacks, self._aborts = self._aborts, []
            busy = self._busy
        for callback in callbacks:
            callback()
        if not busy:
            self.release()

    def release(self, *, landed: bool = False) -> None:
        """End the claim; ``landed``: the bytes in the region were verified (the caller journals them)."""
        with self._lock:
            if self.released:
                return
            self.released = True
        self._store._unclaim(self, landed=landed)


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

    def __init__(self, root: Path, *, budget: int | None = None, writes: str = "auto") -> None:
        if writes not in WRITES:
            raise ValueError(f"staging writes must be one of {', '.join(WRITES)}, not {writes!r}")
        self.writes = writes
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
        self._journaled_at_open: set[int] = set()  # chunks the journal named when staging was opened
        self._claims: dict[int, Landing] = {}
        self._writing: dict[int, int] = {}  # chunk -> write_chunk calls running for it
        self._regions = threading.Condition()  # guards _claims and _writing
        self.in_place = False  # chunks may be received in place (set at open, see ``writes``)
        self.direct = False  # verified chunks are written with O_DIRECT (set at open, see ``writes``)
        self._direct_fds: dict[str, int] = {}  # staged path -> its O_DIRECT fd (same inode as ``_fds``)

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
        with self._gate.exclusive(before_wait=self._abort_claims):
            opened = self._open(target)
            self._journaled_at_open = set(read_journal(self.root / JOURNAL))
            return opened

    def _abort_claims(self) -> None:
        with self._regions:
            claims = list(self._claims.values())
        for landing in claims:
            landing.abort()

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
        memory = fs_type(self.files_dir) in NO_IN_PLACE
        self.direct = self.writes == "direct" or (self.writes == "auto" and not memory)
        self.in_place = self.writes == "in-place" or (self.writes == "auto" and not memory and not self.direct)
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
        if self.direct and not self._direct_ok(target.layout):
            self.direct = False
            self.in_place = self.writes == "auto" and not memory
        write_atomic(self.root / REVISION, json.dumps(target.to_dict()))
        self.revision = target
        self._journal = os.open(self.root / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _direct_ok(self, layout: manifest.Layout) -> bool:
        """Whether the staged files open with O_DIRECT (a file system may refuse it: EINVAL)."""
        for entry in layout.files:
            try:
                self._direct_fd(entry.path)
            except OSError:
                return False
            return True
        return True

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
                old_direct = self._direct_fds.pop(path, None)
                if old_direct is not None:
                    self._retired.append(old_direct)
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

        Waits while the chunk's region is claimed (:meth:`claim`). :class:`DiskFull` when the
        budget or the file system has no room for it.
        """
        with self._regions:
            while index in self._claims:
                self._regions.wait()
            self._writing[index] = self._writing.get(index, 0) + 1
        try:
            with self._gate.shared():
                self._write_chunk(index, memoryview(data))
        finally:
            with self._regions:
                self._writing[index] -= 1
                if not self._writing[index]:
                    del self._writing[index]

    def claim(self, index: int, *, unclaimable: Collection[int] = ()) -> Landing | None:
        """Claim chunk ``index``'s region to receive it in place (see the module rules); None when it
        cannot be: staging on tmpfs (``in_place``), a chunk in ``unclaimable`` or named by the journal
        at open, already claimed or being written, spread over several files, or the store is
        closing or moving. Does not block."""
        if not self.in_place or self.layout is None or index in unclaimable or index in self._journaled_at_open:
            return None
        pieces = self.layout.pieces(index)
        if len(pieces) != 1 or pieces[0].length == 0:
            return None
        with self._regions:
            if index in self._claims or index in self._writing:
                return None
            if not self._gate.try_enter():
                return None
            landing = Landing(self, index, pieces[0])
            self._claims[index] = landing
        return landing

    def _unclaim(self, landing: Landing, *, landed: bool) -> None:
        if landed:
            with self._lock:
                self._dirty.add(landing._piece.path)
        with self._regions:
            if self._claims.get(landing.index) is landing:
                del self._claims[landing.index]
            self._regions.notify_all()
        self._gate.leave()

    def _write_chunk(self, index: int, view: memoryview) -> None:
        pieces = self._pieces(index)
        problem = self.room_for(len(view))
        if problem is not None:
            raise DiskFull(errno.ENOSPC, problem)
        for piece in pieces:
            part = view[piece.chunk_offset : piece.chunk_offset + piece.length]
            fd = self._writable(piece.path)
            try:
                if self.direct:
                    self._write_direct(piece.path, fd, part, piece.file_offset)
                else:
                    _pwrite_all(fd, part, piece.file_offset)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFull(exc.errno, f"{self.files_dir}: {os.strerror(exc.errno)}") from exc
                raise
            finally:
                self._allocated[piece.path] = os.fstat(fd).st_blocks * 512
            with self._lock:
                self._dirty.add(piece.path)

    def _direct_fd(self, path: str) -> int:
        with self._detach_lock:
            fd = self._direct_fds.get(path)
            if fd is None:
                flags = os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECT", 0)
                fd = self._direct_fds[path] = os.open(self.files_dir / path, flags)
            return fd

    def _write_direct(self, path: str, fd: int, part: memoryview, offset: int) -> None:
        """Write ``part`` at ``offset``: the 4 KiB-aligned middle with O_DIRECT, the rest (and a
        middle O_DIRECT refuses: a buffer off the boundary) through the page cache on ``fd``."""
        head = min(len(part), -offset % DIRECT_ALIGN)
        body = (len(part) - head) // DIRECT_ALIGN * DIRECT_ALIGN
        done = 0
        if body:
            direct = self._direct_fd(path)
            try:
                while done < body:
                    wrote = os.pwrite(direct, part[head + done : head + body], offset + head + done)
                    done += max(0, wrote)
                    if wrote <= 0 or wrote % DIRECT_ALIGN:
                        break  # a short write off the boundary: the page cache takes the rest
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: not aligned after all (the buffer's address)
                    raise
        _pwrite_all(fd, part[:head], offset)
        _pwrite_all(fd, part[head + done :], offset + head + done)

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
        with self._gate.exclusive(before_wait=self._abort_claims):
            self._close_files()

    def _close_files(self) -> None:
        for fd in [*self._fds.values(), *self._direct_fds.values(), *self._retired]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._direct_fds.clear()
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


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)


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
