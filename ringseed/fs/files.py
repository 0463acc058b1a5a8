"""File objects of the ``ringseed://`` filesystem: sequential writes into agent buffers, random reads from chunk files.

Owns what ``fs.open(path, "wb")`` and ``fs.open(path, "rb")`` return.

:class:`WriteFile` (write-once, sequential; what ``torch.save`` and DCP's writer need):
- Bytes go straight into tmpfs buffers the node's agent allocated (``os.pwrite``, one copy,
  no socket in between); small writes are staged first so a byte-at-a-time writer does not
  make one system call per byte. A full buffer is handed over as the next chunk and the next
  buffer comes back in the same call; the agent hashes and replicates it while the writer goes on.
- ``close()`` (or :meth:`WriteFile.commit` in a transaction) returns once the file is held on
  this node and on ``replicas - 1`` others and recorded by the master: that is the
  acknowledgement. ``tell()`` works, seeking does not (objects are written once, in order).
- Leaving a ``with`` block by an exception, or :meth:`WriteFile.discard`, aborts: nothing is
  recorded and the path keeps its previous content (or stays absent).

:class:`ReadFile` (random access, seekable: ``torch.load``, DCP's reader, FUSE):
- The agent makes the needed chunks local and verified and names their files; the reader
  opens them and ``preadv``s straight into the caller's buffer. A file stays readable once
  opened, even if the agent later evicts it.
- Sequential reading triggers read-ahead: the next ``readahead`` chunks are requested in the
  background while the current one is read, so a restore from peers keeps the link busy.
- ``read(n)`` returns ``n`` bytes unless the end comes first (never a short read mid-file).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import io
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ringseed.fs import client as client_module
from ringseed.fs import reading
from ringseed.protocol import cacheobjects as objects

STAGE_BYTES = 256 << 10
READAHEAD_CHUNKS = 4
_prefetcher = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="ringseed-readahead")


class WriteFile(io.RawIOBase):
    """A new object being written; becomes visible at :meth:`close` (or the transaction's end)."""

    def __init__(self, client: client_module.LocalClient, path: str, *, autocommit: bool = True) -> None:
        super().__init__()
        self.client = client
        self.path = path
        self.mode = "wb"
        self.autocommit = autocommit
        opened = client.call("POST", "/v1/local/writes", {"path": path})
        self.write_id: str = opened["write_id"]
        self.chunk_size: int = opened["chunk_size"]
        self._buffer: dict[str, Any] | None = None
        self._fd = -1
        self._filled = 0
        self._index = 0
        self._size = 0
        self._stage = bytearray()
        self._finished = False
        self._dir_fd = -1
        self._buffer_path: str = opened["buffers"]
        self.result: dict[str, Any] | None = None

    # -- io.RawIOBase ------------------------------------------------------------------------------

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self._size + offset, io.SEEK_END: self._size + offset}[whence]
        if target != self._size:
            raise io.UnsupportedOperation(f"{self.path}: cache objects are written once, in order (no seek)")
        return self._size

    def write(self, data: Any) -> int:
        if self.closed or self._finished:
            raise ValueError(f"{self.path}: write to a closed file")
        view = memoryview(data).cast("B")
        count = len(view)
        if count < STAGE_BYTES and len(self._stage) + count <= STAGE_BYTES:
            self._stage += view
            self._size += count
            return count
        self._flush_stage()
        self._put(view)
        self._size += count
        return count

    def _flush_stage(self) -> None:
        if self._stage:
            stage, self._stage = self._stage, bytearray()
            self._put(memoryview(stage))

    def _put(self, view: memoryview) -> None:
        while len(view):
            if self._buffer is None:
                self._take_buffer(self.client.call("POST", f"/v1/local/writes/{self.write_id}/buffer"))
            take = min(len(view), int(self._buffer["size"]) - self._filled)  # type: ignore[index]
            done = 0
            while done < take:
                done += os.pwrite(self._fd, view[done:take], self._filled + done)
            self._filled += take
            view = view[take:]
            if self._filled == self._buffer["size"]:  # type: ignore[index]
                self._hand_over(want_next=len(view) > 0)

    def _take_buffer(self, buffer: dict[str, Any]) -> None:
        self._buffer = buffer
        self._fd = os.open(buffer["path"], os.O_WRONLY)
        self._filled = 0

    def _hand_over(self, *, want_next: bool) -> None:
        """Give the current buffer to the agent as the next chunk (and take the next buffer)."""
        assert self._buffer is not None
        os.close(self._fd)
        self._fd = -1
        body = {"index": self._index, "buffer": self._buffer["name"], "length": self._filled, "next": want_next}
        self._buffer = None
        self._index += 1
        answer = self.client.call("POST", f"/v1/local/writes/{self.write_id}/chunk", body)
        if want_next:
            self._take_buffer(answer["next"])

    def flush(self) -> None:
        """Nothing to do: bytes reach the cache as chunks; the file is durable once closed."""

    def fileno(self) -> int:
        """A descriptor of the agent's tmpfs buffer directory, so that ``os.fsync(f.fileno())`` is free.

        DCP's writer fsyncs each file before closing it and falls back to ``os.sync()`` (every
        dirty page of the machine) when ``fileno()`` is unsupported. Durability here comes with
        :meth:`close` (held on ``replicas`` nodes), so the fsync has nothing to add. Only
        ``fsync``/``fstat`` make sense on this descriptor; write through the file object.
        """
        if self._dir_fd < 0:
            self._dir_fd = os.open(os.path.dirname(self._buffer_path), os.O_RDONLY | os.O_DIRECTORY)
        return self._dir_fd

    def hand_over_tail(self) -> None:
        """Hand the last, partial chunk over now (the async save returns after this)."""
        self._flush_stage()
        if self._buffer is not None and self._filled:
            self._hand_over(want_next=False)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self._finished:
                self._finish(commit=self.autocommit)
        finally:
            super().close()

    def _release_fds(self) -> None:
        for fd in (self._fd, self._dir_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._dir_fd = -1

    def _finish(self, *, commit: bool) -> None:
        try:
            self.hand_over_tail()
            self._release_fds()
            self.result = self.client.call(
                "POST", f"/v1/local/writes/{self.write_id}/finish", {"size": self._size, "commit": commit}
            )
        except BaseException:
            self.discard()
            raise
        self._finished = True

    def commit(self) -> None:
        """fsspec transactions: finish now; :meth:`RingseedTransaction.complete` records the files together."""
        if not self._finished:
            self._finish(commit=False)
        super().close()

    def discard(self) -> None:
        """Abort: nothing of this write becomes visible."""
        self._release_fds()
        self._finished = True
        try:
            self.client.call("DELETE", f"/v1/local/writes/{self.write_id}")
        finally:
            super().close()

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None and not self._finished:
            self.discard()
        else:
            self.close()


class ReadFile(reading.ChunkedReader):
    """A committed object opened for reading (one version: a rewrite does not change what this reads)."""

    def __init__(
        self, client: client_module.LocalClient, path: str, *, readahead: int = READAHEAD_CHUNKS, verify: bool = False
    ) -> None:
        super().__init__()
        self.client = client
        self.path = path
        meta = client.call("POST", "/v1/local/open", {"path": path})
        self.version: int = meta["version"]
        self.identity = f"version {self.version}"
        self.size: int = meta["size"]
        self.chunks: list[tuple[str, int]] = [(c[0], int(c[1])) for c in meta["chunks"]]
        self.spans = objects.spans([n for _, n in self.chunks])
        self.readahead = readahead
        self.verify = verify
        self._files: reading.ChunkFiles[int] = reading.ChunkFiles()
        self._pending: dict[int, concurrent.futures.Future[dict[int, str]]] = {}
        self._last = -2
        self._lock = threading.Lock()

    def _locate(self, index: int) -> tuple[int, int]:
        return index, 0

    @contextlib.contextmanager
    def _use(self, index: int) -> Iterator[int]:
        with self._lock:
            sequential = index == self._last + 1
            self._last = index
        if sequential or index == 0:
            self._prefetch(index)
        self._files.let_go(lambda i: index - 1 <= i <= index + self.readahead + 1)
        with self._files.use(index, now=0.0) as fd:
            if fd is not None:
                yield fd
                return
        with self._lock:
            pending = self._pending.get(index)
        self._adopt(pending.result() if pending is not None else self._request([index]))
        with self._files.use(index, now=0.0) as fd:
            if fd is None:  # let go by another thread's window meanwhile: open it for this read
                fd = _open_chunk(self._refetch(index), retry=functools.partial(self._refetch, index))
                try:
                    yield fd
                finally:
                    os.close(fd)
                return
            yield fd

    def _request(self, indices: list[int]) -> dict[int, str]:
        answer = self.client.call(
            "POST", "/v1/local/read", {"path": self.path, "version": self.version, "indices": indices}
        )
        return {int(item["index"]): str(item["file"]) for item in answer["files"]}

    def _adopt(self, files: dict[int, str]) -> None:
        for index, path in files.items():
            with self._lock:
                self._pending.pop(index, None)
            if index in self._files:
                continue
            fd = _open_chunk(path, retry=functools.partial(self._refetch, index))
            if self.verify:
                _check(fd, self.chunks[index][0], self.path, index)
            with self._files.use(index, now=0.0, fd=fd):
                pass

    def _refetch(self, index: int) -> str:
        return self._request([index])[index]

    def _prefetch(self, index: int) -> None:
        with self._lock:
            wanted = [
                i
                for i in range(index + 1, min(index + 1 + self.readahead, len(self.chunks)))
                if i not in self._files and i not in self._pending
            ]
            if not wanted:
                return
            future = _prefetcher.submit(self._request, wanted)
            for i in wanted:
                self._pending[i] = future

    def close(self) -> None:
        if self.closed:
            return
        self._files.close()
        super().close()


def _open_chunk(path: str, *, retry: Callable[[], str]) -> int:
    """Open a chunk file the agent named; if it was evicted meanwhile, ask for it again (once)."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return os.open(retry(), os.O_RDONLY)


def _check(fd: int, sha: str, path: str, index: int) -> None:
    import hashlib

    digest = hashlib.sha256()
    offset = 0
    while block := os.pread(fd, 4 << 20, offset):
        digest.update(block)
        offset += len(block)
    if digest.hexdigest() != sha:
        os.close(fd)
        raise OSError(errno.EIO, f"{path}: chunk {index} does not match its SHA-256 (corrupt cache file)")
