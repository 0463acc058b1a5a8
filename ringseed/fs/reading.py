"""Reading cached bytes in the SDK: chunk files kept open safely between threads, and reads that copy once.

Owns what the two readers of the ``ringseed://`` tree (:class:`ringseed.fs.files.ReadFile`, a
checkpoint object, and :class:`ringseed.fs.data.DataFile`, a dataset file) share: the position,
``seek``/``tell``, ``read``/``readinto``/``pread``, and the set of chunk files they hold open.

Rules:
- A file is a run of pieces, each a byte range of one chunk file of the node's cache; a subclass
  says where piece ``i`` lives (:meth:`ChunkedReader._locate`) and lends its descriptor
  (:meth:`ChunkedReader._use`). Bytes are copied once, from the chunk file (the page cache of
  the agent's tmpfs or SSD) into what the caller gets: ``readinto`` and ``pread`` with
  ``preadv`` into the caller's buffer; ``read`` with ``pread`` when the range is in one piece,
  else by mapping each piece and joining the mappings into the result (no intermediate bytes).
- :class:`ChunkFiles`: descriptors in use are never closed under their user. Letting a file go
  (least recently used beyond a limit, an expired lease, a reader's window moving on) takes it out
  of the set at once, but its descriptor is closed when its last user is done, so a thread
  never reads a closed descriptor, or worse a reused number that now names another file.
- ``read(n)`` returns ``n`` bytes unless the end comes first (never a short read mid-file); reads
  past the end return no bytes; a chunk file shorter than the cache said is ``EIO``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

from ringseed.protocol import cacheobjects

K = TypeVar("K", bound=Hashable)
_PAGE = mmap.ALLOCATIONGRANULARITY
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # page tables filled in one call


class _Held:
    __slots__ = ("fd", "gone", "until", "users")

    def __init__(self, fd: int, until: float) -> None:
        self.fd, self.until, self.users, self.gone = fd, until, 0, False


class ChunkFiles(Generic[K]):
    """Open chunk files by key, shared by threads; a descriptor is closed only once nobody uses it."""

    def __init__(self) -> None:
        self._held: OrderedDict[K, _Held] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: K) -> bool:
        return key in self._held

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._held)

    @contextlib.contextmanager
    def use(self, key: K, *, now: float, fd: int | None = None, until: float = float("inf")) -> Iterator[int | None]:
        """The descriptor held for ``key`` (valid at ``now``), or None; with ``fd``, adopt it first.

        An adopted ``fd`` replaces an expired holding and is closed at once when a valid one
        is already there (another thread got there first).
        """
        with self._lock:
            held = self._held.get(key)
            if held is not None and held.until <= now:
                self._let_go(key)
                held = None
            if fd is not None:
                if held is None:
                    held = self._held[key] = _Held(fd, until)
                else:
                    os.close(fd)
            if held is None:
                yield_fd: int | None = None
            else:
                held.users += 1
                self._held.move_to_end(key)
                yield_fd = held.fd
        try:
            yield yield_fd
        finally:
            if held is not None:
                with self._lock:
                    held.users -= 1
                    if held.gone and held.users == 0:
                        os.close(held.fd)

    def let_go(self, keep: Callable[[K], bool] | None = None, *, limit: int | None = None) -> list[K]:
        """Let go of the files ``keep`` rejects, then of the least recently used beyond ``limit``; their keys."""
        with self._lock:
            gone = [k for k in self._held if keep is not None and not keep(k)]
            for key in gone:
                self._let_go(key)
            while limit is not None and len(self._held) > limit:
                key = next(iter(self._held))
                self._let_go(key)
                gone.append(key)
            return gone

    def _let_go(self, key: K) -> None:
        held = self._held.pop(key)
        held.gone = True
        if held.users == 0:
            os.close(held.fd)

    def close(self) -> None:
        self.let_go(lambda _: False)


class ChunkedReader(io.RawIOBase):
    """A read-only, seekable file made of pieces of chunk files (see the module rules)."""

    path: str
    size: int
    spans: list[tuple[int, int]]  # piece i covers [start, end) of this file
    identity: str  # what the bytes are: two readers of one path with one identity read the same bytes

    def __init__(self) -> None:
        super().__init__()
        self.mode = "rb"
        self._pos = 0

    # -- what a subclass says ---------------------------------------------------------------------

    def _locate(self, index: int) -> tuple[int, int]:
        """``(chunk, offset of piece index in that chunk's file)``."""
        raise NotImplementedError

    def _use(self, index: int) -> contextlib.AbstractContextManager[int]:
        """The descriptor of piece ``index``'s chunk file, held open for the ``with`` block."""
        raise NotImplementedError

    # -- io.RawIOBase -----------------------------------------------------------------------------

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, f"{self.path}: seek to a negative position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        got = self.pread(self._pos, memoryview(buffer).cast("B"))
        self._pos += got
        return got

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self.size - self._pos)
        want = left if size is None or size < 0 else min(size, left)
        out = self.read_at(self._pos, want)
        self._pos += len(out)
        return out

    def readall(self) -> bytes:
        return self.read(-1)

    # -- positional reads -------------------------------------------------------------------------

    def _pieces(self, offset: int, count: int) -> Iterator[tuple[int, int, int]]:
        """``(piece, offset in its chunk file, length)`` covering ``count`` bytes from ``offset``."""
        end = min(offset + count, self.size)
        if offset >= end:
            return
        for index in cacheobjects.chunk_range(self.spans, offset, end):
            start, stop = self.spans[index]
            at = max(offset, start)
            _, base = self._locate(index)
            yield index, base + at - start, min(end, stop) - at

    def pread(self, offset: int, view: memoryview) -> int:
        """Fill ``view`` from ``offset`` without moving the position; returns the bytes read."""
        total = 0
        for index, at, length in self._pieces(offset, len(view)):
            with self._use(index) as fd:
                got = os.preadv(fd, [view[total : total + length]], at)
            if got != length:
                raise OSError(errno.EIO, f"{self.path}: chunk {self._locate(index)[0]} file ended early")
            total += length
        return total

    def read_at(self, offset: int, count: int) -> bytes:
        """``count`` bytes from ``offset`` (fewer only at the end), copied once from the chunk files."""
        pieces = list(self._pieces(offset, count))
        if len(pieces) == 1:
            index, at, length = pieces[0]
            with self._use(index) as fd:
                out = os.pread(fd, length, at)
            if len(out) != length:
                raise OSError(errno.EIO, f"{self.path}: chunk {self._locate(index)[0]} file ended early")
            return out
        with contextlib.ExitStack() as stack:
            views = []
            for index, at, length in pieces:
                with self._use(index) as fd:
                    views.append(stack.enter_context(_mapped(fd, at, length, self.path, self._locate(index)[0])))
            return b"".join(views)


@contextlib.contextmanager
def _mapped(fd: int, offset: int, length: int, path: str, chunk: int) -> Iterator[memoryview]:
    """``length`` bytes of ``fd`` from ``offset``, mapped read-only (kept valid after ``fd`` is closed)."""
    if os.fstat(fd).st_size < offset + length:
        raise OSError(errno.EIO, f"{path}: chunk {chunk} file ended early")
    lead = offset % _PAGE
    mapping = mmap.mmap(fd, lead + length, flags=_MAP_FLAGS, prot=mmap.PROT_READ, offset=offset - lead)
    view = memoryview(mapping)[lead:]
    try:
        yield view
    finally:
        view.release()
        mapping.close()
