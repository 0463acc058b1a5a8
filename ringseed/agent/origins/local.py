"""The ``file://`` origin: a directory tree or a single file on a local path or PVC.

Rules:
- ``file:///abs/dir`` (or a bare path) lists every regular file under the directory, with
  ``/``-separated relative names; ``file:///abs/file`` is a one-file source named by its basename.
- Symlinks: a one-file source may itself be a link (the user named it). In a directory, a link
  whose target resolves inside the root is followed, and the target's content is recorded under
  the link's name (both names appear when both are in the tree). A link that leaves the root, a
  dangling link, a link to a directory and anything that is not a regular file (fifo, socket,
  device) is rejected with :class:`OriginError` naming the path. Directory links are rejected
  because following them can loop or duplicate whole trees; a link loop is rejected naming it.
- Hugging Face hub cache: a source that is a snapshot folder
  (``<cache>/models--org--name/snapshots/<revision>``, next to ``blobs/``), whose files are
  symlinks to ``../../blobs/<hash>``, may follow links anywhere inside that model's cache
  folder (``models--org--name``, also ``datasets--``/``spaces--``); links leaving it are still
  rejected. Files keep their names in the snapshot (``config.json``, not the blob hash).
- Modes keep the permission bits (``st_mode & 0o777``) of the file (the link's target).
- A file's tag (its identity for a revision) is ``<mtime_ns>`` of the target, with its size in
  the listing: an in-place write changes the mtime, and so does a write + rename (the new file's
  own mtime). The tag is the same on every node that sees the same files: an NFS or CephFS share,
  a bucket's FUSE mount (whose inode numbers are made up per mount), copies made with their times
  (``cp -p``, ``rsync -a``); so the node that takes over origin duty, or confirms the revision
  after a master restart, finds the revision another node listed. (Copies made without their
  times differ: a new duty holder then sees a new revision and reads its copy again.)
- A read of a pinned path checks size and tag with ``fstat`` on the open file before and after
  the bytes are read, and the inode against the one this origin object first saw for the path
  under the current pins (at its listing or first read): bytes from a file changed or replaced
  meanwhile, even by a rename that kept the mtime, raise :class:`base.SourceChanged` instead of
  being returned. The inode stays local to the node; it never enters the revision.
- Reads run in a worker thread (``os.pread``) and pass through the origin's rate limit.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ringseed.agent.origins import base
from ringseed.protocol import manifest

_READ_STEP = 4 << 20


def tag_of(st: os.stat_result) -> str:
    """A file's identity for a revision: ``<mtime_ns>`` (the same on every node seeing the same file)."""
    return str(st.st_mtime_ns)


def path_of(uri: str) -> Path:
    """The local path of ``file:///x`` or a bare path."""
    if uri.startswith("file:"):
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise base.OriginError(f"{uri}: file:// must name a local path (file:///path), not host {parts.netloc!r}")
        return Path(unquote(parts.path))
    return Path(uri)


HUB_KINDS = ("models--", "datasets--", "spaces--")


def hub_repo_folder(root: Path) -> Path | None:
    """The repository folder of a Hugging Face hub cache snapshot ``root``, or None if it is not one."""
    snapshots = root.parent
    repo = snapshots.parent
    if snapshots.name == "snapshots" and repo.name.startswith(HUB_KINDS) and (repo / "blobs").is_dir():
        return repo
    return None


class FileOrigin:
    """Reads files below a local root (a directory) or one file."""

    def __init__(self, uri: str, *, limiter: base.RateLimiter) -> None:
        self.uri = uri
        self.bytes_read = 0
        self._limiter = limiter
        self._given = path_of(uri)
        self._single = self._given.is_file()
        try:
            self._root = (self._given.parent if self._single else self._given).resolve()
        except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
            raise base.OriginError(f"{uri}: cannot be resolved ({exc})") from exc
        hub = None if self._single else hub_repo_folder(self._root)
        self._allowed = hub if hub is not None else self._root  # where links may point
        self._pins: dict[str, base.Pin] = {}
        self._listed: dict[str, tuple[base.Pin, int]] = {}  # path -> ((size, tag), inode) at the last listing
        self._inodes: dict[str, int] = {}  # path -> inode the pinned reads must keep finding

    async def list_files(self) -> list[tuple[str, int, int]]:
        return [(p, s, m) for p, s, m, _ in await self.listing()]

    async def listing(self) -> base.Listing:
        return await asyncio.to_thread(self._list_sync)

    def pin(self, pins: Mapping[str, base.Pin]) -> None:
        self._pins = dict(pins)
        self._inodes = {p: ino for p, (pin, ino) in self._listed.items() if pins.get(p) == pin}

    def _list_sync(self) -> base.Listing:
        if not self._given.exists() and not self._given.is_symlink():
            raise base.OriginError(f"{self.uri}: no such file or directory")
        if self._single:
            target = self._check(self._given, self._given.name)
            st = target.stat()
            self._listed = {self._given.name: ((st.st_size, tag_of(st)), st.st_ino)}
            return [(self._given.name, st.st_size, stat.S_IMODE(st.st_mode) & 0o777, tag_of(st))]
        if not self._given.is_dir():
            raise base.OriginError(f"{self.uri}: is neither a regular file nor a directory")
        out: base.Listing = []
        listed: dict[str, tuple[base.Pin, int]] = {}
        for dirpath, dirnames, filenames in os.walk(self._given, followlinks=False):
            for name in sorted(dirnames):
                if os.path.islink(os.path.join(dirpath, name)):
                    rel = os.path.relpath(os.path.join(dirpath, name), self._given).replace(os.sep, "/")
                    raise base.OriginError(f"{self.uri}: {rel!r} is a symlink to a directory (not followed)")
            for name in filenames:
                full = Path(dirpath, name)
                rel = full.relative_to(self._given).as_posix()
                st = self._check(full, rel).stat()
                out.append((rel, st.st_size, stat.S_IMODE(st.st_mode) & 0o777, tag_of(st)))
                listed[rel] = ((st.st_size, tag_of(st)), st.st_ino)
        self._listed = listed
        return out

    def _check(self, full: Path, rel: str) -> Path:
        """The resolved regular file behind ``full``, or OriginError naming ``rel``."""
        try:
            target = full.resolve()
        except (RuntimeError, OSError) as exc:  # ELOOP (RuntimeError before Python 3.13)
            raise base.OriginError(f"{self.uri}: {rel!r} is a symlink loop ({exc})") from exc
        if not self._single and not target.is_relative_to(self._allowed):
            where = "the model's hub cache folder" if self._allowed != self._root else "the source root"
            raise base.OriginError(f"{self.uri}: {rel!r} is a symlink leaving {where} (to {str(target)!r})")
        if not target.exists():
            raise base.OriginError(f"{self.uri}: {rel!r} is a dangling symlink")
        if not target.is_file():
            raise base.OriginError(f"{self.uri}: {rel!r} is not a regular file")
        return target

    def _resolve(self, path: str) -> Path:
        manifest.validate_relpath(path)
        if self._single:
            if path != self._given.name:
                raise base.OriginError(f"{self.uri}: no file {path!r} in this one-file source")
            return self._check(self._given, path)
        return self._check(self._given / path, path)

    async def read(self, path: str, offset: int, length: int) -> bytes:
        buf = bytearray(length)
        await self.read_into(path, offset, memoryview(buf))
        return bytes(buf)

    async def read_into(
        self, path: str, offset: int, view: memoryview, progress: Callable[[int], None] | None = None
    ) -> None:
        try:
            target = self._resolve(path)
        except manifest.ManifestError as exc:
            raise base.OriginError(f"{self.uri}: {exc}") from exc
        done = 0
        fd = await asyncio.to_thread(os.open, target, os.O_RDONLY)
        try:
            self._check_pin(path, fd)
            while done < len(view):
                step = view[done : done + _READ_STEP]
                got = await asyncio.to_thread(os.preadv, fd, [step], offset + done)
                if not got:
                    raise base.OriginError(
                        f"{self.uri}: {path!r} ended at {offset + done} bytes, needed {offset + len(view)}"
                    )
                self.bytes_read += got
                done += got
                if progress is not None:
                    progress(done)
                await self._limiter.acquire(got)
            self._check_pin(path, fd)
        finally:
            os.close(fd)

    def _check_pin(self, path: str, fd: int) -> None:
        """SourceChanged unless the open file still has the pinned size and tag, and the inode first seen."""
        pinned = self._pins.get(path)
        if pinned is None:
            return
        st = os.fstat(fd)
        size, tag = pinned
        if st.st_size != size or (tag and tag_of(st) != tag):
            raise base.SourceChanged(
                f"{self.uri}: {path!r} changed since it was listed (size {size} -> {st.st_size}, "
                f"identity {tag or '?'} -> {tag_of(st)})",
                path=path,
            )
        inode = self._inodes.setdefault(path, st.st_ino)
        if st.st_ino != inode:
            raise base.SourceChanged(
                f"{self.uri}: {path!r} was replaced since it was listed (inode {inode} -> {st.st_ino}, same mtime)",
                path=path,
            )

    async def close(self) -> None:
        return None
