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

import contextlib
import errno
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from ringseed.fs import client as client_module
from ringseed.fs import reading
from ringseed.protocol import cacheobjects, datasets, manifest, revision

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
        self._files: reading.ChunkFiles[tuple[str, int]] = reading.ChunkFiles()
        self._released: list[tuple[str, int]] = []
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

    @contextlib.contextmanager
    def chunk(self, rev_id: str, index: int) -> Iterator[int]:
        """A descriptor of chunk ``index`` of revision ``rev_id``'s local file, open for the ``with`` block."""
        key = (rev_id, index)
        with self._files.use(key, now=time.monotonic()) as fd:
            if fd is not None:
                yield fd
                return
        with self._lock:
            self._released += self._files.let_go(limit=self.hold - 1)
            released, self._released = self._released, []
        opened = self._open(rev_id, index, released)
        now = time.monotonic()
        with self._files.use(key, now=now, fd=opened, until=now + self.lease * LEASE_MARGIN) as fd:
            assert fd is not None
            yield fd

    def _open(self, rev_id: str, index: int, released: list[tuple[str, int]]) -> int:
        body = {"source": self.source, "revision": rev_id, "chunks": [index], "release": [list(k) for k in released]}
        answer = self.client.call("POST", "/v1/local/data/chunks", body)
        try:
            return os.open(str(answer["files"][0]["file"]), os.O_RDONLY)
        except FileNotFoundError:  # evicted right after the lease ran out: ask once more
            answer = self.client.call("POST", "/v1/local/data/chunks", dict(body, release=[]))
            return os.open(str(answer["files"][0]["file"]), os.O_RDONLY)

    def close(self) -> None:
        self._files.close()


class DataFile(reading.ChunkedReader):
    """One dataset file, opened at the view's current revision."""

    def __init__(
        self, view: DataView, rel: str, *, at: tuple[revision.Revision, str, manifest.FileEntry] | None = None
    ) -> None:
        """File ``rel`` of the view's current revision, or ``at`` a given one: ``(revision, its id, rel's entry)``."""
        super().__init__()
        if at is None:
            rev, rev_id = view.current()
            if rel not in view.entries:
                view.info(rel)  # raises FileNotFoundError naming it
                raise IsADirectoryError(errno.EISDIR, f"{rel!r} is a directory in dataset {view.source!r}")
            entry = view.entries[rel]
        else:
            rev, rev_id, entry = at
        self.view = view
        self.path = f"{cacheobjects.DATA_ROOT}/{view.source}/{rel}"
        self.rev_id = rev_id
        self.identity = f"revision {rev_id}"
        self.size = entry.size
        self.segments = datasets.segments(rev.layout, entry)  # by entry: no scan of the listing
        self.spans = cacheobjects.spans(s.length for s in self.segments)

    def _locate(self, index: int) -> tuple[int, int]:
        segment = self.segments[index]
        return segment.chunk, segment.offset

    def _use(self, index: int) -> contextlib.AbstractContextManager[int]:
        return self.view.chunk(self.rev_id, self.segments[index].chunk)  # ESTALE when the revision is gone
