"""A dataset mount (``ringseed mount --root data``) on libfuse 3's low-level API: no round trip per open.

Owns the read-only mount of the datasets (``data/`` or one dataset below it) served from
:class:`ringseed.fs.data.DataView` revisions, for training readers that open many small files:
once a file's name, attributes and bytes are in the kernel, opening and reading it again calls
no Python code here (``os.open``/``os.read`` cost no request at all; Python's ``open()`` costs one
``IOCTL``, answered in libfuse: see below).

Rules:
- Inodes are per content: a file's inode stands for one path *and* one content (its size and the
  source's tag in the revision, e.g. an ETag or mtime), so the kernel's size and cached pages of
  an inode are always of one content. A new revision that keeps a file's content keeps its inode
  (and the kernel's pages; later reads come from the new revision's chunks); one that changes it
  gives the path a new inode: the name is invalidated in the kernel (a notification), the next
  lookup gets the new inode, and a file already open keeps the old one and reads the old
  revision's bytes while the node still holds them (``ESTALE`` after: open it again). Never a mix.
- Names and attributes are kept by the kernel for ``timeout`` (long by default: changes are told
  to the kernel, not waited out). Revisions are followed as the SDK follows them (the agent's
  staleness period): every lookup looks at the current revision, and a watcher thread looks
  every ``POLL`` seconds, so a change reaches the kernel within about the staleness period even
  when nothing is looked up. Directory listings are cached by the kernel too and invalidated with
  every new revision of their dataset (and ``data/``'s listing when the sources change).
- Opens cost nothing where the kernel supports it: ``OPEN`` is answered ``ENOSYS`` once and the
  kernel opens files itself from then on, keeping their cached pages (``FOPEN_KEEP_CACHE``),
  and sends no ``RELEASE``; directories likewise (``OPENDIR``). Where it does not (kernels before
  4.19/5.1), every open is answered with ``keep_cache``: one round trip, still correct, since
  cached pages belong to an inode, i.e. one content.
- The mount is read-only (``ro``); ``FLUSH`` is answered ``ENOSYS`` by libfuse (the kernel stops
  sending it). Errors keep the errno the SDK raised (``ENOENT``, ``ESTALE``, ``EIO`` when the
  agent is unreachable, ``EACCES`` for a name that leaves the tree).
- Requests are served by libfuse's own threads (``fuse_session_loop_mt``), so what needs no
  callback never waits for Python: the ``IOCTL`` the kernel sends for every ``open()`` in Python
  (its ``isatty`` check; the kernel caches no answer to it) is answered ``ENOSYS`` in C. Callbacks
  keep their thread's Python state (:func:`ringseed.fs.libfuse3.keep_thread_state`). Where that
  loop is missing, ``threads`` Python threads read ``/dev/fuse`` (``fuse_session_receive_buf``/
  ``process_buf``). Notifications are sent by the watcher thread only (one sent from a request's
  thread can deadlock against the kernel's locks).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import signal
import stat
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ringseed.fs import data, libfuse3, spec
from ringseed.protocol import cacheobjects, manifest, revision

log = logging.getLogger(__name__)
LONG_TIMEOUT = 86400.0  # seconds the kernel keeps names and attributes (changes are invalidated explicitly)
POLL = 1.0  # seconds between the watcher's looks at the revisions (the view asks the agent once per its ttl)
THREADS = 16
LIST_SOURCES = 30.0  # seconds between the watcher's looks at data/'s datasets
ROOT_INO = 1
_BLKSIZE = 1 << 20


class _Snapshot:
    """One revision of one dataset as the mount serves it: files by path, and each directory's names."""

    def __init__(self, rev: revision.Revision, rev_id: str) -> None:
        self.rev, self.rev_id = rev, rev_id
        tags = rev.tags or ("",) * len(rev.layout.files)
        self.files: dict[str, tuple[manifest.FileEntry, tuple[int, str]]] = {}
        self.children: dict[str, dict[str, bool]] = {"": {}}  # directory -> name -> is a directory
        for entry, tag in zip(rev.layout.files, tags, strict=True):
            self.files[entry.path] = (entry, (entry.size, tag or f"revision {rev_id}"))
            parent = ""
            parts = entry.path.split("/")
            for part in parts[:-1]:
                self.children[parent][part] = True
                parent = f"{parent}/{part}" if parent else part
                self.children.setdefault(parent, {})
            self.children[parent][parts[-1]] = False


@dataclass(eq=False)
class _Node:
    ino: int
    parent: int
    name: str
    dataset: str | None  # None: data/ itself (its names are the datasets)
    rel: str  # the path inside the dataset
    key: tuple[Any, ...]
    attr: Any  # libfuse3.Stat
    snapshot: _Snapshot | None = None  # a file's: the revision its bytes come from
    reader: data.DataFile | None = None
    lookups: int = 0
    children: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)  # a directory's names, by revision id

    @property
    def is_dir(self) -> bool:
        return self.snapshot is None


class DataMount:
    """The low-level FUSE server of one mount (``start``/``close``, or ``serve`` in the foreground)."""

    def __init__(
        self, fs: spec.RingseedFileSystem, root: str, *, timeout: float = LONG_TIMEOUT, threads: int = THREADS
    ) -> None:
        root = root.strip("/")
        if not cacheobjects.is_data(root):
            raise ValueError(f"the low-level mount serves datasets only (--root data[/<name>...]), not {root!r}")
        if root != cacheobjects.DATA_ROOT:
            fs._data(root)  # refuses a path that leaves the tree, naming it
        self.fs = fs
        self.lib = libfuse3.load()
        self.timeout, self.threads = timeout, threads
        self.uid, self.gid = os.getuid(), os.getgid()
        self.started = time.time()
        self.calls: Counter[str] = Counter()  # requests served, by kind (what a warm epoch should not need)
        self.capable = 0
        self._lock = threading.RLock()
        self._views: dict[str, data.DataView] = {}
        self._snapshots: dict[str, _Snapshot] = {}
        self._sources: list[str] | None = None
        self._sources_at = 0.0
        self._nodes: dict[int, _Node] = {}
        self._by_key: dict[tuple[Any, ...], int] = {}
        self._next_ino = ROOT_INO + 1
        self._told: list[tuple[str, int, str]] = []  # invalidations for the watcher to send
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._workers: list[threading.Thread] = []
        self._session: int | None = None
        self._unmounted = False
        dataset: str | None = None
        base = ""
        if root != cacheobjects.DATA_ROOT:
            _, dataset, *rest = root.split("/", 2)
            base = rest[0] if rest else ""
            self._check_dir(dataset, base)
        self._nodes[ROOT_INO] = _Node(ROOT_INO, ROOT_INO, "", dataset, base, ("root",), self._attr(ROOT_INO, None))
        self._ops = self._callbacks()

    # -- revisions --------------------------------------------------------------------------------

    def _view(self, dataset: str) -> data.DataView:
        with self._lock:
            view = self._views.get(dataset)
            if view is None:
                found = self.fs._data(f"{cacheobjects.DATA_ROOT}/{dataset}")
                assert found is not None
                view = self._views[dataset] = found[0]
            return view

    def _snapshot(self, dataset: str) -> _Snapshot:
        """The dataset's current revision (asking the agent once per its staleness period), changes told."""
        view = self._view(dataset)
        with self._lock:  # revisions taken in the order the view moved on (never back to an older one)
            rev, rev_id = view.current()
            known = self._snapshots.get(dataset)
            if known is not None and known.rev_id == rev_id:
                return known
            fresh = self._snapshots[dataset] = _Snapshot(rev, rev_id)
            if known is not None:
                self._advance(dataset, fresh)
            return fresh

    def _advance(self, dataset: str, fresh: _Snapshot) -> None:
        """A new revision of ``dataset``: keep the inodes whose content it keeps, tell the kernel of the others."""
        for node in list(self._nodes.values()):
            if node.dataset != dataset:
                continue
            if node.is_dir:
                if node.rel in fresh.children or node.ino == ROOT_INO:
                    self._told.append(("inode", node.ino, ""))  # its listing may have changed
                    continue
            else:
                found = fresh.files.get(node.rel)
                if found is not None and found[1] == node.key[3]:
                    node.snapshot, node.reader = fresh, None  # the same bytes: read from the new revision's chunks
                    continue
            if self._by_key.get(node.key) == node.ino:
                del self._by_key[node.key]  # the next lookup of the name makes a new inode
                self._told.append(("entry", node.parent, node.name))
        self._wake.set()

    def _sources_now(self, *, refresh: bool = False) -> list[str]:
        with self._lock:
            if self._sources is not None and not refresh:
                return self._sources
        sources = sorted(self.fs._sources())
        with self._lock:
            if self._sources is not None and sources != self._sources:
                for node in self._nodes.values():
                    if node.parent == ROOT_INO and node.dataset not in sources and node.ino != ROOT_INO:
                        self._by_key.pop(node.key, None)
                        self._told.append(("entry", ROOT_INO, node.name))
                self._told.append(("inode", ROOT_INO, ""))
                self._wake.set()
            self._sources, self._sources_at = sources, time.monotonic()
            return sources

    def _check_dir(self, dataset: str, rel: str) -> None:
        if rel not in self._snapshot(dataset).children:
            raise FileNotFoundError(errno.ENOENT, f"no directory {rel!r} in dataset {dataset!r}")

    # -- inodes -----------------------------------------------------------------------------------

    def _attr(self, ino: int, size: int | None) -> Any:
        attr = libfuse3.Stat()
        attr.st_ino = ino
        if size is None:
            attr.st_mode, attr.st_nlink = stat.S_IFDIR | 0o755, 2
        else:
            attr.st_mode, attr.st_nlink, attr.st_size = stat.S_IFREG | 0o444, 1, size
            attr.st_blocks = (size + 511) // 512
        attr.st_uid, attr.st_gid, attr.st_blksize = self.uid, self.gid, _BLKSIZE
        seconds = int(self.started)
        for name in ("st_atim", "st_mtim", "st_ctim"):
            getattr(attr, name).tv_sec = seconds
        return attr

    def _child(self, parent: _Node, name: str) -> _Node:
        """The node ``name`` in directory ``parent`` names now (made if new); ``FileNotFoundError`` if none."""
        if not name or name in (".", "..") or "/" in name:
            raise FileNotFoundError(errno.ENOENT, name)
        if parent.dataset is None:  # data/: the datasets
            if name not in self._sources_now() and name not in self._sources_now(refresh=True):
                raise FileNotFoundError(errno.ENOENT, f"no dataset {name!r}")
            dataset, rel, snapshot, size = name, "", None, None
            self._snapshot(name)
            key: tuple[Any, ...] = ("dir", name, "")
        else:
            dataset = parent.dataset
            rel = f"{parent.rel}/{name}" if parent.rel else name
            snap = self._snapshot(dataset)
            found = snap.files.get(rel)
            if found is not None:
                snapshot, size = snap, found[0].size
                key = ("file", dataset, rel, found[1])
            elif rel in snap.children:
                snapshot, size, key = None, None, ("dir", dataset, rel)
            else:
                raise FileNotFoundError(errno.ENOENT, f"no file {rel!r} in dataset {dataset!r}")
        with self._lock:
            ino = self._by_key.get(key)
            node = self._nodes.get(ino) if ino is not None else None
            if node is None:
                ino, self._next_ino = self._next_ino, self._next_ino + 1
                node = self._nodes[ino] = _Node(
                    ino, parent.ino, name, dataset, rel, key, self._attr(ino, size), snapshot
                )
                self._by_key[key] = ino
            return node

    def _node(self, ino: int) -> _Node:
        node = self._nodes.get(ino)
        if node is None:
            raise OSError(errno.ESTALE, f"inode {ino} is not known")
        return node

    def _names(self, node: _Node) -> list[tuple[str, bool]]:
        if node.dataset is None:
            return [(s, True) for s in self._sources_now()]
        snap = self._snapshot(node.dataset)
        names = node.children.get(snap.rev_id)
        if names is None:
            if node.rel not in snap.children:
                raise FileNotFoundError(errno.ENOENT, f"no directory {node.rel!r} in dataset {node.dataset!r}")
            names = sorted(snap.children[node.rel].items())
            node.children = {snap.rev_id: names}
        return names

    def _read(self, node: _Node, offset: int, size: int) -> bytes:
        reader = node.reader
        if reader is None:
            snap = node.snapshot
            if snap is None:
                raise IsADirectoryError(errno.EISDIR, node.rel)
            assert node.dataset is not None
            entry = snap.files[node.rel][0]
            reader = node.reader = data.DataFile(self._view(node.dataset), node.rel, at=(snap.rev, snap.rev_id, entry))
        return reader.read_at(offset, size)

    # -- requests ---------------------------------------------------------------------------------

    def _callbacks(self) -> libfuse3.LowlevelOps:
        lib = self.lib
        ops = libfuse3.LowlevelOps()
        entry_timeout = self.timeout

        def guarded(kind: str, body: Any) -> Any:
            def run(req: int, *args: Any) -> None:
                libfuse3.keep_thread_state()
                self.calls[kind] += 1
                try:
                    body(req, *args)
                except OSError as exc:
                    lib.fuse_reply_err(req, exc.errno or errno.EIO)
                except Exception:
                    log.exception("Dataset mount: %s failed", kind)
                    lib.fuse_reply_err(req, errno.EIO)

            return run

        def init(userdata: int, conn: Any) -> None:
            libfuse3.keep_thread_state()
            self.capable = conn.contents.capable

        def lookup(req: int, parent: int, name: bytes) -> None:
            node = self._child(self._node(parent), os.fsdecode(name))
            entry = libfuse3.EntryParam(ino=node.ino, attr=node.attr, attr_timeout=entry_timeout,
                                        entry_timeout=entry_timeout)  # fmt: skip
            with self._lock:
                if lib.fuse_reply_entry(req, ctypes.byref(entry)) == 0:
                    node.lookups += 1  # the kernel holds the inode until it forgets it
                    self._nodes.setdefault(node.ino, node)  # (forgotten meanwhile: known again)

        def forget(req: int, ino: int, count: int) -> None:
            libfuse3.keep_thread_state()
            with self._lock:
                node = self._nodes.get(ino)
                if node is not None and ino != ROOT_INO:
                    node.lookups -= count
                    if node.lookups <= 0:
                        del self._nodes[ino]
                        if self._by_key.get(node.key) == ino:
                            del self._by_key[node.key]
            lib.fuse_reply_none(req)

        def getattr_(req: int, ino: int, fi: Any) -> None:
            lib.fuse_reply_attr(req, ctypes.byref(self._node(ino).attr), entry_timeout)

        def open_(req: int, ino: int, fi: Any) -> None:
            if fi.contents.flags & (os.O_WRONLY | os.O_RDWR):
                raise OSError(errno.EROFS, "a dataset is read-only")
            if self.capable & libfuse3.CAP_NO_OPEN_SUPPORT:
                lib.fuse_reply_err(req, errno.ENOSYS)  # the kernel opens files itself from now on
            else:
                lib.fuse_reply_open(req, ctypes.byref(libfuse3.keep_cache()))

        def opendir(req: int, ino: int, fi: Any) -> None:
            if self.capable & libfuse3.CAP_NO_OPENDIR_SUPPORT:
                lib.fuse_reply_err(req, errno.ENOSYS)
            else:
                lib.fuse_reply_open(req, ctypes.byref(libfuse3.keep_cache(directory=True)))

        def read(req: int, ino: int, size: int, offset: int, fi: Any) -> None:
            out = self._read(self._node(ino), offset, size)
            lib.fuse_reply_buf(req, out, len(out))

        def readdir(req: int, ino: int, size: int, offset: int, fi: Any) -> None:
            node = self._node(ino)
            names = [(".", True), ("..", True), *self._names(node)]
            buf = ctypes.create_string_buffer(size)
            used = 0
            attr = libfuse3.Stat()
            for index in range(offset, len(names)):
                name, is_dir = names[index]
                attr.st_ino = 1 << 62 | index  # readdir's inode numbers are not the lookups' (no lookup is made here)
                attr.st_mode = stat.S_IFDIR if is_dir else stat.S_IFREG
                need = lib.fuse_add_direntry(req, ctypes.byref(buf, used), size - used, os.fsencode(name),
                                             ctypes.byref(attr), index + 1)  # fmt: skip
                if used + need > size:
                    break
                used += need
            lib.fuse_reply_buf(req, buf, used)

        made = {
            "init": libfuse3.INIT(init),
            "lookup": libfuse3.LOOKUP(guarded("lookup", lookup)),
            "forget": libfuse3.FORGET(forget),
            "getattr": libfuse3.GETATTR(guarded("getattr", getattr_)),
            "open": libfuse3.OPEN(guarded("open", open_)),
            "read": libfuse3.READ(guarded("read", read)),
            "opendir": libfuse3.OPEN(guarded("opendir", opendir)),
            "readdir": libfuse3.READDIR(guarded("readdir", readdir)),
        }
        self._made = made  # the callbacks live as long as the mount
        for name, fn in made.items():
            setattr(ops, name, ctypes.cast(fn, ctypes.c_void_p))
        return ops

    # -- the session ------------------------------------------------------------------------------

    def start(self, mountpoint: str) -> None:
        """Mount at ``mountpoint`` and serve in background threads (``close`` unmounts)."""
        options = "ro,default_permissions,fsname=ringseed,subtype=ringseed" + (",allow_other" if self.uid == 0 else "")
        argv = [b"ringseed", b"-o", options.encode()]
        self._argv = (ctypes.c_char_p * len(argv))(*argv)
        args = libfuse3.Args(len(argv), self._argv, 0)
        session = self.lib.fuse_session_new(ctypes.byref(args), ctypes.byref(self._ops), ctypes.sizeof(self._ops), None)
        if not session:
            raise OSError(errno.EINVAL, f"libfuse refused the session (options {options!r})")
        if self.lib.fuse_session_mount(session, os.fsencode(mountpoint)) != 0:
            self.lib.fuse_session_destroy(session)
            raise OSError(errno.EIO, f"could not mount at {mountpoint!r} (is /dev/fuse there, and are we allowed?)")
        self._session = session
        if getattr(self.lib, "fuse_session_loop_mt_31", None) is not None:
            # libfuse's threads: a request no callback is set for (the IOCTL of every Python open()'s
            # isatty, answered ENOSYS) never waits for Python
            self._workers = [threading.Thread(target=self._serve_in_libfuse, name="fuse-loop", daemon=True)]
        else:
            self._workers = [threading.Thread(target=self._serve_requests, name=f"fuse-{i}", daemon=True)
                             for i in range(self.threads)]  # fmt: skip
        self._workers.append(threading.Thread(target=self._watch, name="fuse-watch", daemon=True))
        for thread in self._workers:
            thread.start()

    def _serve_in_libfuse(self) -> None:
        try:
            self.lib.fuse_session_loop_mt_31(self._session, 0)
        finally:
            self._stopping.set()
            self._wake.set()

    def _serve_requests(self) -> None:
        buf = libfuse3.Buf()
        try:
            while not self._stopping.is_set():
                got = self.lib.fuse_session_receive_buf(self._session, ctypes.byref(buf))
                if got == -errno.EINTR:
                    continue
                if got <= 0:
                    break
                self.lib.fuse_session_process_buf(self._session, ctypes.byref(buf))
        finally:
            self._stopping.set()
            self._wake.set()
            ctypes.CDLL(None).free(ctypes.c_void_p(buf.mem))

    def _watch(self) -> None:
        """Follow the revisions (and data/'s sources) and send the kernel what changed."""
        while not self._stopping.is_set():
            self._wake.wait(POLL)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                with self._lock:
                    datasets = list(self._snapshots)
                    sources_due = self._sources is not None and time.monotonic() - self._sources_at >= LIST_SOURCES
                for dataset in datasets:
                    self._snapshot(dataset)
                if sources_due:
                    self._sources_now(refresh=True)
            except OSError as exc:
                log.warning("Dataset mount: could not look at the revisions: %s", exc)
            with self._lock:
                told, self._told = self._told, []
            for kind, ino, name in told:
                if self._stopping.is_set():
                    return
                if kind == "entry":
                    raw = os.fsencode(name)
                    self.lib.fuse_lowlevel_notify_inval_entry(self._session, ino, raw, len(raw))
                else:
                    self.lib.fuse_lowlevel_notify_inval_inode(self._session, ino, 0, 0)
                self.calls[f"told {kind}"] += 1

    def wait(self) -> None:
        """Until unmounted (``umount``) or :meth:`close`."""
        self._stopping.wait()

    def close(self) -> None:
        """Unmount (lazily: a busy mount goes when its last user does) and stop serving."""
        self._stopping.set()
        self._wake.set()
        if self._session is None:
            return
        if not self._unmounted:
            self._unmounted = True
            self.lib.fuse_session_unmount(self._session)  # the kernel ends the connection: workers see ENODEV
        for thread in self._workers:
            thread.join(5)
        if not any(t.is_alive() for t in self._workers):
            self.lib.fuse_session_destroy(self._session)
            self._session = None

    def serve(self, mountpoint: str) -> None:
        """Mount and serve in the foreground until unmounted, SIGTERM or SIGINT."""
        self.start(mountpoint)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self._stopping.set())
        try:
            while not self._stopping.wait(1.0):
                pass
        finally:
            self.close()


def mount(fs: spec.RingseedFileSystem, mountpoint: str, *, root: str, attr_timeout: float | None = None) -> None:
    """``ringseed mount --root data...`` in the foreground (:class:`libfuse3.Unavailable` if it cannot be here)."""
    DataMount(fs, root, timeout=LONG_TIMEOUT if attr_timeout is None else attr_timeout).serve(mountpoint)
