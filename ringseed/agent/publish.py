"""The materialiser: staged files published as the model, atomically, and checked again later.

Owns ``<data-dir>/<namespace>/<name>/`` (the model training pods read), its marker and the
record of what was published (``<staging>/published.json``).

Rules:
- Publishing builds ``<data-dir>/<namespace>/.<name>.tmp-<pid>/`` with hard links to the staged
  files (copies across file systems), writes the marker ``.ringseed-complete`` (JSON with
  ``manifest_digest`` and ``revision``) as a new file (``O_EXCL``, then renamed into place: it
  never opens an existing file, so it can never write through a link into staged data), fsyncs
  and renames the directory to ``<data-dir>/<namespace>/<name>/``: readers see either the old
  model or the whole new one. The marker's name is reserved (``manifest.RESERVED_NAMES``): no
  model file can have it.
- After publishing, each file's fingerprint (size, mtime_ns, inode) is recorded in
  ``published.json`` next to the staging (outside the model tree). :func:`changed_files` compares
  the published files with it: a file written to, replaced or truncated since is named, so the
  agent re-checks its chunks on start.
- :func:`withdraw` removes the marker of a model found corrupt (it is published again once
  repaired); :func:`remove_leftovers` deletes the ``.<name>.tmp-*`` / ``.<name>.old-*``
  directories a killed publish left (the caller holds the staging lock, so no other agent of
  this model is publishing).
- All functions block; the agent calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ringseed.agent import store
from ringseed.protocol import manifest

MARKER = manifest.MARKER_NAME
PUBLISHED = "published.json"


def read_marker(model_dir: Path) -> str | None:
    """The manifest digest recorded in a materialised model's marker, if any."""
    try:
        return str(json.loads((model_dir / MARKER).read_text())["manifest_digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fingerprint(path: Path) -> list[int]:
    st = os.stat(path, follow_symlinks=False)
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def materialise(staging: store.Store, *, model_dir: Path, digest: str, revision_id: str, force: bool = False) -> bool:
    """Publish the staged files at ``model_dir`` atomically with a marker naming ``digest``.

    The staged files are held meanwhile (``Store.in_use``); False, and nothing published, if they
    are no longer of ``revision_id`` (the node moved to another revision). Skipped when the marker
    already names ``digest`` and nothing changed, unless ``force``.
    """
    with staging.in_use():
        if staging.revision is None or staging.revision.id != revision_id:
            return False
        _materialise(staging, model_dir=model_dir, digest=digest, force=force)
        return True


def _materialise(staging: store.Store, *, model_dir: Path, digest: str, force: bool) -> None:
    layout, revision = staging.layout, staging.revision
    assert layout is not None and revision is not None
    if not force and read_marker(model_dir) == digest and not changed_files(staging, model_dir):
        return
    staging.commit(())
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = model_dir.parent / f".{model_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for entry in layout.files:
        target = tmp / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(staging.files_dir / entry.path, target)
        except OSError:
            shutil.copyfile(staging.files_dir / entry.path, target)
        os.chmod(target, entry.mode & 0o777 or 0o644)
    staging.shared()
    marker = {
        "manifest_digest": digest,
        "revision": revision.id,
        "total_size": layout.total_size,
        "files": len(layout.files),
    }
    _write_new(tmp / MARKER, json.dumps(marker))
    store.fsync_dir(tmp)
    _swap_in(tmp, model_dir)
    record = {"manifest_digest": digest, "files": {e.path: _fingerprint(model_dir / e.path) for e in layout.files}}
    store.write_atomic(staging.root / PUBLISHED, json.dumps(record))


def _write_new(path: Path, text: str) -> None:
    """Write ``path`` as a brand-new file: a temp name created O_EXCL, then renamed over ``path``."""
    tmp = path.with_name(f"{path.name}.new-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def _swap_in(tmp: Path, model_dir: Path) -> None:
    old = model_dir.parent / f".{model_dir.name}.old-{os.getpid()}"
    if model_dir.exists():
        os.rename(model_dir, old)
    os.rename(tmp, model_dir)
    store.fsync_dir(model_dir.parent)
    shutil.rmtree(old, ignore_errors=True)


def published_record(staging: store.Store) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        record = json.loads((staging.root / PUBLISHED).read_text())
        if isinstance(record, dict) and isinstance(record.get("files"), dict):
            return record
    return None


def changed_files(staging: store.Store, model_dir: Path) -> list[str]:
    """Published files whose size, mtime or inode differ from the record (all, without a record)."""
    layout = staging.layout
    if layout is None:
        return []
    record = published_record(staging)
    files: dict[str, Any] = record["files"] if record is not None else {}
    changed = []
    for entry in layout.files:
        try:
            now = _fingerprint(model_dir / entry.path)
        except OSError:
            now = None
        if now is None or files.get(entry.path) != now:
            changed.append(entry.path)
    return changed


def withdraw(model_dir: Path) -> None:
    """Remove the marker: the published copy is known to be corrupt until it is published again."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(model_dir / MARKER)
        store.fsync_dir(model_dir)


def remove_leftovers(model_dir: Path) -> list[Path]:
    """Delete ``.<name>.tmp-*`` and ``.<name>.old-*`` next to ``model_dir`` (killed publishes)."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for child in model_dir.parent.iterdir():
            if child.name.startswith((f".{model_dir.name}.tmp-", f".{model_dir.name}.old-")):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed
