"""Save and go on: the small async API of the node cache for training loops.

Owns the save-and-continue pattern. :func:`save` takes a snapshot of ``obj`` (every tensor copied
into host staging buffers, everything else deep-copied) and returns: the training loop's stall is
that copy and nothing else. Behind it, one background thread serialises the snapshot with
``torch.save`` straight into the node cache's buffers, and the cache replicates it to
``replicas - 1`` other nodes and records it; :meth:`SaveHandle.wait` returns that acknowledgement
(or raises what went wrong).

Rules:
- Staging buffers are kept and reused by the next save of tensors of the same shapes and dtypes
  (a training loop saves the same state dict again and again), so from the second save on the
  stall is a copy into warm memory; a buffer is reused only once the save that used it is done.
  ``stage=False`` skips the snapshot: the call then returns after serialising (the caller's
  tensors may change right after, and the stall includes ``torch.save``).
- The caller's tensors are free as soon as :func:`save` returns.
- Saves are serialised and committed in the order of their calls; a save that fails leaves
  nothing visible at its path, raises from :meth:`SaveHandle.wait`, and is logged at ERROR (a
  loop that never waits still hears of it).
- Everything goes through the ``ringseed://`` filesystem, so what a save writes is read back by
  ``torch.load(open_read(path))``, DCP's reader, fsspec or the FUSE mount alike.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import threading
from typing import Any

from ringseed.fs import files, spec

_writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringseed-save")
log = logging.getLogger(__name__)


class SaveHandle:
    """A save whose snapshot is taken; :meth:`wait` for its acknowledgement."""

    def __init__(self, path: str, future: concurrent.futures.Future[dict[str, Any]]) -> None:
        self.path = path
        self.future = future
        future.add_done_callback(self._report)

    def _report(self, future: concurrent.futures.Future[dict[str, Any]]) -> None:
        error = None if future.cancelled() else future.exception()
        if error is not None:
            log.error("Checkpoint save of %s failed; nothing was written there: %s", self.path, error)

    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """``{path, version, size, copies}`` once the save is acknowledged; raises its error otherwise."""
        return self.future.result(timeout=timeout)


class _Staging:
    """Host buffers for snapshots, by (shape, dtype); a buffer is lent to one save at a time."""

    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[Any]] = {}
        self.lock = threading.Lock()

    def snapshot(self, obj: Any, lent: list[tuple[tuple[Any, ...], Any]]) -> Any:
        import torch

        if isinstance(obj, torch.Tensor):
            return self._copy(obj, lent)
        if isinstance(obj, dict):
            return type(obj)((k, self.snapshot(v, lent)) for k, v in obj.items())
        if isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):
            return type(obj)(self.snapshot(v, lent) for v in obj)
        return copy.deepcopy(obj)

    def _copy(self, tensor: Any, lent: list[tuple[tuple[Any, ...], Any]]) -> Any:
        source = tensor.detach()
        key = (tuple(source.shape), source.dtype, source.is_contiguous())
        with self.lock:
            pool = self.free.get(key)
            buffer = pool.pop() if pool else None
        if buffer is None:
            buffer = source.to("cpu", copy=True)
        else:
            buffer.copy_(source)
        lent.append((key, buffer))
        return buffer

    def give_back(self, lent: list[tuple[tuple[Any, ...], Any]]) -> None:
        with self.lock:
            for key, buffer in lent:
                self.free.setdefault(key, []).append(buffer)


_staging = _Staging()


def release_staging() -> None:
    """Free the staging buffers kept for the next save (they hold one copy of the last state dict)."""
    with _staging.lock:
        _staging.free.clear()


def _filesystem(fs: spec.RingseedFileSystem | None) -> spec.RingseedFileSystem:
    return fs if fs is not None else spec.RingseedFileSystem()


def save(obj: Any, path: str, *, fs: spec.RingseedFileSystem | None = None, stage: bool = True) -> SaveHandle:
    """Snapshot ``obj`` and ``torch.save`` it into the cache at ``path`` behind the caller."""
    filesystem = _filesystem(fs)
    if not stage:
        target = filesystem._open(path, "wb")
        assert isinstance(target, files.WriteFile)
        try:
            _torch_save(obj, target)
            target.hand_over_tail()
        except BaseException:
            target.discard()
            raise
        return SaveHandle(path, _writer.submit(_close, target))
    lent: list[tuple[tuple[Any, ...], Any]] = []
    snapshot = _staging.snapshot(obj, lent)
    return SaveHandle(path, _writer.submit(_write_snapshot, snapshot, path, filesystem, lent))


def _torch_save(obj: Any, target: files.WriteFile) -> None:
    import torch

    torch.save(obj, target)  # type: ignore[arg-type]  # a binary file object, as torch accepts


def _write_snapshot(snapshot: Any, path: str, filesystem: spec.RingseedFileSystem, lent: list[Any]) -> dict[str, Any]:
    try:
        target = filesystem._open(path, "wb")
        assert isinstance(target, files.WriteFile)
        try:
            _torch_save(snapshot, target)
        except BaseException:
            target.discard()
            raise
        return _close(target)
    finally:
        _staging.give_back(lent)


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
    return SaveHandle(path, _writer.submit(_close, target))


def _close(target: files.WriteFile) -> dict[str, Any]:
    target.close()
    assert target.result is not None
    return target.result


def open_read(path: str, *, fs: spec.RingseedFileSystem | None = None) -> files.ReadFile:
    """The object at ``path`` for reading (``torch.load(open_read(path))``)."""
    target = _filesystem(fs)._open(path, "rb")
    assert isinstance(target, files.ReadFile)
    return target
