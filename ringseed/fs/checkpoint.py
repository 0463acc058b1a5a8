"""Save and go on: the small async API of the node cache for training loops.

Owns the save-and-continue pattern: :func:`save` serialises ``obj`` with ``torch.save`` straight
into the node cache's buffers and returns as soon as the bytes are there (the training loop's
stall is that copy); replication to ``replicas - 1`` other nodes and the master's record happen
behind, and :meth:`SaveHandle.wait` returns the acknowledgement (or raises what went wrong).

Rules:
- The caller must not change the tensors of ``obj`` until :func:`save` returns (it has copied
  them by then); after that they are free.
- Saves run in order of their calls; a save that fails leaves nothing visible at its path.
- Everything goes through the ``ringseed://`` filesystem, so what a save writes is read back by
  ``torch.load(open_read(path))``, DCP's reader, fsspec or the FUSE mount alike.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from ringseed.fs import files, spec

_acks = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringseed-ack")


class SaveHandle:
    """A save whose bytes are in the cache; :meth:`wait` for its acknowledgement."""

    def __init__(self, path: str, future: concurrent.futures.Future[dict[str, Any]]) -> None:
        self.path = path
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """``{path, version, size, copies}`` once the save is acknowledged; raises its error otherwise."""
        return self.future.result(timeout=timeout)


def _filesystem(fs: spec.RingseedFileSystem | None) -> spec.RingseedFileSystem:
    return fs if fs is not None else spec.RingseedFileSystem()


def save(obj: Any, path: str, *, fs: spec.RingseedFileSystem | None = None) -> SaveHandle:
    """``torch.save(obj)`` into the cache at ``path``; returns once the bytes are copied in."""
    import torch

    target = _filesystem(fs)._open(path, "wb")
    assert isinstance(target, files.WriteFile)
    try:
        torch.save(obj, target)  # type: ignore[arg-type]  # a binary file object, as torch accepts
        target.hand_over_tail()
    except BaseException:
        target.discard()
        raise
    return SaveHandle(path, _acks.submit(_close, target))


def save_bytes(data: bytes | memoryview, path: str, *, fs: spec.RingseedFileSystem | None = None) -> SaveHandle:
    """Write ``data`` into the cache at ``path``; returns once the bytes are copied in."""
    target = _filesystem(fs)._open(path, "wb")
    assert isinstance(target, files.WriteFile)
    try:
        target.write(data)
        target.hand_over_tail()
    except BaseException:
        target.discard()
        raise
    return SaveHandle(path, _acks.submit(_close, target))


def _close(target: files.WriteFile) -> dict[str, Any]:
    target.close()
    assert target.result is not None
    return target.result


def open_read(path: str, *, fs: spec.RingseedFileSystem | None = None) -> files.ReadFile:
    """The object at ``path`` for reading (``torch.load(open_read(path))``)."""
    target = _filesystem(fs)._open(path, "rb")
    assert isinstance(target, files.ReadFile)
    return target
