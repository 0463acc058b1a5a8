"""Datasets in the SDK: ``ringseed://data/<name>/...`` read from the node cache with few round trips.

Owns the training process's view of a dataset (:class:`DataView`) and its files (:class:`DataFile`).

Rules:
- A view holds the dataset's revision (files, sizes, and how they pack into chunks) as the node's
  agent gave it, for the agent's staleness period; listings, sizes and ``open`` are answered from
  it without asking the agent. A file opened keeps the revision it was opened at: its bytes all
  come from that revision, never a mix (a source that changed meanwhile makes a read fail with
  ``ESTALE``; open the file again).
- Chunk files the agent names are opened once and kept (as many as the agent's ``hold`` allows,
  least recently used let go first) while their read lease lasts, so reading the many small
  files that share a chunk costs no round trip to the agent; an expired lease is renewed by
  asking again, and the chunks let go are released with the next request (their room is the
  cache's again).
- Reads past the end of a file return no bytes; a missing file is ``FileNotFoundError``; a path
  with ``..`` is ``PermissionError`` (refused before anything is asked).
"""

from __future__ import annotations

import errno
import io
import os
import threading
import time
from collections import OrderedDict
from typing import Any

from ringseed.fs import client as client_module
from ringseed.protocol import cacheobjects, datasets, revision

LEASE_MARGIN = 0.8  # use a chunk file for this share of its lease, then ask again


class DataView:
    """One dataset's current revision in this process (thread-safe)."""

    def __init__(self, client: client_module.LocalClient, source: str) -> None:
        self.client = client
        self.source = source
        self.revision: revision.Revision | None = None
        self.id = ""
        self.entries: dict[str, Any] = {}
        self.expires = 0.0
        self.lease = 30.0
        self.hold = 1
        self._fds: OrderedDict[tuple[str, int], tuple[int, float]] = OrderedDict()
        self._released: list[list[Any]] = []
        self._lock = threading.Lock()

    def current(self) -> tuple[revision.Revision, str]:
        with self._lock:
            if self.revision is None or time.monotonic() >= self.expires:
                answer = self.client.call("GET", "/v1/local/data/revision", source=self.source)
                if answer["id"] != self.id:
                    self.revision = revision.Revision.from_dict(answer["revision"])
                    self.id = str(answer["id"])
                    self.entries = {f.path: f for f in self.revision.layout.files}
                self.expires = time.monotonic() + float(answer.get("ttl", 300.0))
                self.lease = float(answer.get("lease", 30.0))
                self.hold = max(1, int(answer.get("hold", 1)))
            assert self.revision is not None
            return self.revision, self.id

    def info(self, rel: str) -> dict[str, Any]:
        rev, _ = self.current()
        name = f"{cacheobjects.DATA_ROOT}/{self.source}" + (f"/{rel}" if rel else "")
        entry = self.entries.get(rel)
        if entry is not None:
            return {"name": name, "size": entry.size, "type": "file", "mode": entry.mode}
        if datasets.is_dir(rev.layout, rel):
            return {"name": name, "size": 0, "type": "directory"}
        raise FileNotFoundError(errno.ENOENT, f"no file {name!r} in dataset {self.source!r}")

    def ls(self, rel: str) -> list[dict[str, Any]]:
        if self.info(rel)["type"] == "file":
            return [self.info(rel)]
        rev, _ = self.current()
        files, dirs = datasets.files_under(rev.layout, rel)
        base = f"{cacheobjects.DATA_ROOT}/{self.source}/"
        out = [{"name": base + f, "size": self.entries[f].size, "type": "file"} for f in files]
        out += [{"name": base + d, "size": 0, "type": "directory"} for d in dirs]
        return out

    def chunk_fd(self, rev_id: str, index: int) -> int:
        """A descriptor of chunk ``index`` of revision ``rev_id``'s local file (valid while leased)."""
        key = (rev_id, index)
        now = time.monotonic()
        with self._lock:
            held = self._fds.get(key)
            if held is not None and held[1] > now:
                self._fds.move_to_end(key)
                return held[0]
        with self._lock:
            old = self._fds.pop(key, None)
            if old is not None:
                os.close(old[0])
            while len(self._fds) >= self.hold:
                (gone_rev, gone_chunk), (gone_fd, _) = self._fds.popitem(last=False)
                os.close(gone_fd)
                self._released.append([gone_rev, gone_chunk])
            released, self._released = self._released, []
        fd = self._open(rev_id, index, released)
        with self._lock:
            self._fds[key] = (fd, now + self.lease * LEASE_MARGIN)
        return fd

    def _open(self, rev_id: str, index: int, released: list[list[Any]]) -> int:
        body = {"source": self.source, "revision": rev_id, "chunks": [index], "release": released}
        answer = self.client.call("POST", "/v1/local/data/chunks", body)
        try:
            return os.open(str(answer["files"][0]["file"]), os.O_RDONLY)
        except FileNotFoundError:  # evicted right after the lease ran out: ask once more
            answer = self.client.call("POST", "/v1/local/data/chunks", dict(body, release=[]))
            return os.open(str(answer["files"][0]["file"]), os.O_RDONLY)

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._fds.values():
                os.close(fd)
            self._fds.clear()


class DataFile(io.RawIOBase):
    """One dataset file, opened at the view's current revision."""

    def __init__(self, view: DataView, rel: str) -> None:
        super().__init__()
        rev, rev_id = view.current()
        if rel not in view.entries:
            view.info(rel)  # raises FileNotFoundError naming it
            raise IsADirectoryError(errno.EISDIR, f"{rel!r} is a directory in dataset {view.source!r}")
        self.view = view
        self.path = f"{cacheobjects.DATA_ROOT}/{view.source}/{rel}"
        self.mode = "rb"
        self.rev_id = rev_id
        self.size = view.entries[rel].size
        self.segments = datasets.segments(rev.layout, view.entries[rel])  # by entry: no scan of the listing
        self.spans = cacheobjects.spans(s.length for s in self.segments)
        self._pos = 0

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

    def pread(self, offset: int, view: memoryview) -> int:
        total = 0
        while total < len(view) and offset + total < self.size:
            at = offset + total
            index = next(iter(cacheobjects.chunk_range(self.spans, at, at + 1)))
            start, end = self.spans[index]
            segment = self.segments[index]
            fd = self._fd(segment.chunk)
            want = min(len(view) - total, end - at)
            got = os.preadv(fd, [view[total : total + want]], segment.offset + (at - start))
            if got <= 0:
                raise OSError(errno.EIO, f"{self.path}: chunk {segment.chunk} file ended early")
            total += got
        return total

    def _fd(self, chunk: int) -> int:
        return self.view.chunk_fd(self.rev_id, chunk)  # ESTALE when the revision is gone

    def readinto(self, buffer: Any) -> int:
        got = self.pread(self._pos, memoryview(buffer).cast("B"))
        self._pos += got
        return got

    def read(self, size: int | None = -1) -> bytes:
        """``size`` bytes (all that is left by default); each piece is copied once, from the chunk file."""
        left = max(0, self.size - self._pos)
        want = left if size is None or size < 0 else min(size, left)
        pieces = []
        while want > 0:
            at = self._pos
            index = next(iter(cacheobjects.chunk_range(self.spans, at, at + 1)))
            start, end = self.spans[index]
            segment = self.segments[index]
            piece = os.pread(self._fd(segment.chunk), min(want, end - at), segment.offset + (at - start))
            if not piece:
                raise OSError(errno.EIO, f"{self.path}: chunk {segment.chunk} file ended early")
            pieces.append(piece)
            self._pos += len(piece)
            want -= len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def readall(self) -> bytes:
        return self.read(-1)
