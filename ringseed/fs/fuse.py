"""The node cache as a POSIX tree: a FUSE mount of the same ``ringseed://`` tree (fusepy over libfuse 2).

Owns the mapping of FUSE callbacks onto :class:`ringseed.fs.spec.RingseedFileSystem`, so a training
pod's POSIX readers and writers (``torch.save(obj, "/ckpt/step-1/model.pt")``, ``cp``, ``ls``)
see the group's tree as files.

Rules:
- Files are written once, in order: ``open(O_CREAT|O_TRUNC)`` or ``creat`` starts a new version
  (visible only when it is closed); a write at any offset but the current end is ``EINVAL``;
  opening an existing file for writing without ``O_TRUNC`` is ``EPERM`` (no update in place).
- ``close(2)`` returns the acknowledgement: the write is committed in ``flush`` (the callback
  whose error reaches ``close``), so an application that checks ``close`` knows the file is held
  on ``replicas`` nodes. An error there is the agent's (``ENOSPC`` when the cache is full, ...).
- Reads are random access; ``data/`` is read-only (``EROFS`` for writes there).
- The kernel's page cache serves repeated reads (a dataset's second epoch reads no byte through
  this process): a file opened again with the same content (a checkpoint object's version, a
  dataset's revision) keeps the pages cached from before (``keep_cache``); other content drops
  them first. While handles of two contents of one path are open, the newer ones bypass the page
  cache (``direct_io``): the kernel caches pages by path, and they could be either. A handle whose
  content is not the one the kernel's size of the path came from (the size is kept for the
  attribute timeout) bypasses it too, so it reads its own bytes, all of them.
- The kernel keeps names and attributes for ``ATTR_TIMEOUT`` (1 s); under a dataset mount
  (``--root data``) for the datasets' staleness period (the agent's ``list_ttl``, as long as
  the SDK keeps a revision): a second epoch over many small files costs no LOOKUP or GETATTR.
  A name missing from the revision is never cached (``negative_timeout=0``). Content follows
  the revision current at each open (the rule above), never the kernel's older view.
- A dataset mount is mounted read-only (``ro``: the kernel refuses writes and keeps no access
  times to ask about), answers ``FLUSH`` with ``ENOSYS`` once (the kernel stops sending it: a
  close costs no round trip) and ``ioctl`` (``open()``'s isatty check) in libfuse, not Python.
  What stays per open is ``OPEN`` (where the revision is checked) and an asynchronous
  ``RELEASE``; through libfuse 2 no open can skip the server (no ``FOPEN_NOFLUSH`` or no-open
  support there).
- Directories are implicit in the cache; an empty one made through the mount (``mkdir``) is
  remembered by this mount until something is written below it.
- Errors keep the errno the SDK raised (``ENOENT``, ``EACCES`` for a path that leaves the tree,
  ``ENOSPC``, ``EIO`` when the agent is unreachable).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections import Counter, OrderedDict
from typing import Any

from fuse import FUSE, FuseOSError, Operations

from ringseed.fs import data, files, libfuse3, reading, spec
from ringseed.protocol import cacheobjects as objects

log = logging.getLogger(__name__)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR
CACHED_PATHS = 1 << 17
ATTR_TIMEOUT = 1.0  # seconds the kernel trusts a name's attributes (libfuse's default, said out loud)


def _errno(exc: BaseException) -> int:
    if isinstance(exc, OSError) and exc.errno:
        return int(exc.errno)
    return errno.EIO


class CacheOperations(Operations):  # type: ignore[misc]
    """FUSE callbacks over one RingseedFileSystem (thread-safe: fusepy runs them on many threads)."""

    def __init__(self, fs: spec.RingseedFileSystem, *, root: str = "") -> None:
        self.fs = fs
        self.root = root
        self.handles: dict[int, files.ReadFile | files.WriteFile | data.DataFile] = {}
        self.local_dirs: set[str] = set()
        self.cached: OrderedDict[str, str] = OrderedDict()  # path -> identity of the bytes the kernel may hold
        self.reading: dict[str, Counter[str]] = {}  # path -> identities of its open readers (and how many)
        self.told: OrderedDict[str, str] = OrderedDict()  # path -> identity the kernel's size of it came from
        self.read_only = objects.is_data(root)  # a dataset mount: no file is ever written through it
        self.uid, self.gid = os.getuid(), os.getgid()
        self.started = time.time()
        self._next = 1
        self._lock = threading.Lock()

    def __call__(self, op: str, *args: Any) -> Any:
        libfuse3.keep_thread_state()  # (fusepy's threads are libfuse's too)
        try:
            return super().__call__(op, *args)
        except FuseOSError:
            raise
        except OSError as exc:
            raise FuseOSError(_errno(exc)) from exc
        except ValueError as exc:
            raise FuseOSError(errno.EINVAL) from exc

    def _rel(self, path: str) -> str:
        rel = path.strip("/")
        return f"{self.root}/{rel}".strip("/") if self.root else rel

    def _add(self, handle: files.ReadFile | files.WriteFile | data.DataFile) -> int:
        with self._lock:
            fh = self._next
            self._next += 1
            self.handles[fh] = handle
            if isinstance(handle, reading.ChunkedReader):
                self.reading.setdefault(handle.path, Counter())[handle.identity] += 1
            return fh

    # -- metadata ------------------------------------------------------------------------------

    def _dir_stat(self) -> dict[str, Any]:
        return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_uid": self.uid, "st_gid": self.gid,
                "st_mtime": self.started, "st_ctime": self.started, "st_atime": self.started}  # fmt: skip

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        rel = self._rel(path)
        handle = self.handles.get(fh) if fh is not None else None
        if isinstance(handle, files.WriteFile):
            return self._file_stat(handle.tell(), time.time(), writable=True)
        if rel == self.root or rel in self.local_dirs:
            return self._dir_stat()
        info, identity = self._info(rel)
        if info["type"] == "directory":
            self.local_dirs.discard(rel)
            return self._dir_stat()
        with self._lock:
            self.told[rel] = identity
            self.told.move_to_end(rel)
            while len(self.told) > CACHED_PATHS:  # forgotten: its next open bypasses the page cache
                self.told.popitem(last=False)
        return self._file_stat(info["size"], info.get("mtime", self.started), writable=not objects.is_data(rel))

    def _info(self, rel: str) -> tuple[dict[str, Any], str]:
        """``(info, identity of the bytes it describes)``: a dataset file's revision, an object's version."""
        found = self.fs._data(rel)
        if found is None:
            info = self.fs.info(rel)
            return info, f"version {info.get('version', '')}"
        view, inner = found
        while True:  # the size and the revision id read together (the view may move on in between)
            _, rev_id = view.current()
            info = view.info(inner)
            if view.id == rev_id:
                return info, f"revision {rev_id}"

    def _file_stat(self, size: int, mtime: float, *, writable: bool) -> dict[str, Any]:
        mode = stat.S_IFREG | (0o644 if writable else 0o444)
        return {"st_mode": mode, "st_nlink": 1, "st_size": size, "st_uid": self.uid, "st_gid": self.gid,
                "st_mtime": mtime, "st_ctime": mtime, "st_atime": mtime, "st_blksize": 1 << 20}  # fmt: skip

    def readdir(self, path: str, fh: int) -> list[str]:
        rel = self._rel(path)
        names = {os.path.basename(e) for e in self.fs.ls(rel, detail=False)} if rel not in self.local_dirs else set()
        prefix = rel + "/" if rel else ""
        names |= {d[len(prefix) :].split("/", 1)[0] for d in self.local_dirs if d.startswith(prefix) and d != rel}
        return [".", "..", *sorted(names)]

    def statfs(self, path: str) -> dict[str, Any]:
        return {"f_bsize": 1 << 20, "f_frsize": 1 << 20, "f_blocks": 1 << 20, "f_bfree": 1 << 19,
                "f_bavail": 1 << 19, "f_namemax": 255}  # fmt: skip

    def mkdir(self, path: str, mode: int) -> None:
        rel = objects.check_writable(self._rel(path))
        if self.fs.exists(rel):
            raise FuseOSError(errno.EEXIST)
        self.local_dirs.add(rel)

    def rmdir(self, path: str) -> None:
        rel = self._rel(path)
        if rel in self.local_dirs:
            self.local_dirs.discard(rel)
            return
        if self.fs.ls(rel, detail=False):
            raise FuseOSError(errno.ENOTEMPTY)

    def unlink(self, path: str) -> None:
        self.fs.rm_file(self._rel(path))

    def rename(self, old: str, new: str) -> None:
        src, dst = self._rel(old), self._rel(new)
        self.fs.mv(src, dst)
        with self._lock:  # the kernel moves the name with its attributes
            self.told.pop(dst, None)
            if src in self.told:
                self.told[dst] = self.told.pop(src)

    def chmod(self, path: str, mode: int) -> None:
        return None  # modes are not kept (objects are files of the group's tree)

    def chown(self, path: str, uid: int, gid: int) -> None:
        return None

    def utimens(self, path: str, times: Any = None) -> None:
        return None

    # -- files ---------------------------------------------------------------------------------

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        rel = self._rel(path)
        if objects.is_data(rel):
            raise FuseOSError(errno.EROFS)
        handle = self.fs._open(rel, "wb")
        self._forget_dirs_above(rel)
        return self._add(handle)

    def _forget_dirs_above(self, rel: str) -> None:
        self.local_dirs -= {d for d in self.local_dirs if objects.is_under(rel, d)}

    def open(self, path: str, flags: int) -> int:
        rel = self._rel(path)
        if flags & _WRITE_FLAGS:
            if objects.is_data(rel):
                raise FuseOSError(errno.EROFS)
            if not flags & os.O_TRUNC:
                raise FuseOSError(errno.EPERM)  # objects are written once: no update in place
            return self.create(path, 0o644)
        return self._add(self.fs._open(rel, "rb"))

    def page_cache(self, fh: int) -> tuple[bool, bool]:
        """``(keep_cache, direct_io)`` for the file just opened as ``fh`` (the rule in the module docstring)."""
        handle = self.handles.get(fh)
        if not isinstance(handle, reading.ChunkedReader):
            return False, False
        with self._lock:
            mixed = set(self.reading.get(handle.path, ())) - {handle.identity}
            if mixed or self.told.get(handle.path) != handle.identity:
                # the kernel's pages of this path may be either version, or the size it holds (kept
                # for the attribute timeout) another version's: read this handle past both
                self.cached.pop(handle.path, None)
                return False, True
            keep = self.cached.get(handle.path) == handle.identity
            self.cached[handle.path] = handle.identity
            self.cached.move_to_end(handle.path)
            while len(self.cached) > CACHED_PATHS:  # forgotten: its next open drops the pages (a re-read)
                self.cached.popitem(last=False)
            return keep, False

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        handle = self.handles[fh]
        if isinstance(handle, files.WriteFile):
            raise FuseOSError(errno.EBADF)
        return handle.read_at(offset, size)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        handle = self.handles[fh]
        if not isinstance(handle, files.WriteFile):
            raise FuseOSError(errno.EBADF)
        if offset != handle.tell():
            raise FuseOSError(errno.EINVAL)  # written once, in order
        return handle.write(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        handle = self.handles.get(fh) if fh is not None else None
        if isinstance(handle, files.WriteFile) and length == handle.tell():
            return
        if handle is None and length == 0 and not self.fs.exists(self._rel(path)):
            return
        raise FuseOSError(errno.EPERM)

    def flush(self, path: str, fh: int) -> None:
        if self.read_only:
            raise FuseOSError(errno.ENOSYS)  # the kernel stops sending FLUSH: a close costs no round trip
        handle = self.handles.get(fh)
        if isinstance(handle, files.WriteFile) and not handle.closed:
            handle.close()  # the acknowledgement: close(2) returns after it (or with its error)
            self._written(handle)

    def release(self, path: str, fh: int) -> None:
        with self._lock:  # page_cache looks at the open readers under this lock
            handle = self.handles.pop(fh, None)
            if isinstance(handle, reading.ChunkedReader):
                open_now = self.reading[handle.path]
                open_now[handle.identity] -= 1
                if open_now[handle.identity] <= 0:
                    del open_now[handle.identity]
                if not open_now:
                    del self.reading[handle.path]
        if handle is not None and not handle.closed:
            handle.close()
            if isinstance(handle, files.WriteFile):
                self._written(handle)

    def _written(self, handle: files.WriteFile) -> None:
        """The kernel's size of a file written through the mount is the new version's (it saw the writes)."""
        if handle.result is not None and "version" in handle.result:
            with self._lock:
                self.told[handle.path] = f"version {handle.result['version']}"

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        return None  # durability comes with close (flush)

    ioctl = None  # libfuse answers ENOSYS itself (no call into Python): ``open()``'s isatty check costs less


class _Fuse(FUSE):  # type: ignore[misc]
    """fusepy's bridge, with ``open`` telling the kernel whether its cached pages of the file are still good."""

    def open(self, path: bytes, fip: Any) -> int:
        info = fip.contents
        info.fh = self.operations("open", path.decode(self.encoding), info.flags)
        keep, direct = self.operations.page_cache(info.fh)
        info.keep_cache, info.direct_io = int(keep), int(direct)
        return 0


def kernel_timeout(fs: spec.RingseedFileSystem, root: str) -> float:
    """Seconds the kernel keeps names and attributes: a dataset's staleness period under ``data/``."""
    if not objects.is_data(root):
        return ATTR_TIMEOUT
    try:
        return max(ATTR_TIMEOUT, float(fs.client.call("GET", "/v1/local/info")["list_ttl"]))
    except (OSError, KeyError, ValueError, TypeError) as exc:
        log.warning("Dataset mount: the agent's staleness period is unknown (%s); names kept %.0f s", exc, ATTR_TIMEOUT)
        return ATTR_TIMEOUT


def mount(
    fs: spec.RingseedFileSystem,
    mountpoint: str,
    *,
    root: str = "",
    foreground: bool = True,
    attr_timeout: float | None = None,
) -> None:
    """Mount ``fs`` (its directory ``root``) at ``mountpoint`` until unmounted (blocks in the foreground)."""
    timeout = kernel_timeout(fs, root) if attr_timeout is None else attr_timeout
    _Fuse(CacheOperations(fs, root=root), mountpoint, foreground=foreground, nothreads=False, big_writes=True,
          max_read=1 << 20, max_write=1 << 20, default_permissions=True, allow_other=os.getuid() == 0,
          atomic_o_trunc=True, attr_timeout=timeout, entry_timeout=timeout, negative_timeout=0,
          **({"ro": True} if objects.is_data(root) else {}))  # fmt: skip
