"""The cache master's hard state: committed objects, kept as a replicated log of entries.

Owns what cannot be rebuilt from the agents: which objects exist, their chunk lists, versions
and persisted marks. The master's leader turns each accepted request into one *entry*, has the
follower apply it, then applies it itself and answers; the follower applies the same entries in
the same order and so holds the same state (``ringseed/master/cachemeta.py`` does the I/O).
Pure: no I/O, no clock (times arrive in the entries).

Rules:
- Entries are JSON objects with an ``op``; ``seq`` numbers them 1, 2, 3, ... without gaps.
  :meth:`Metadata.prepare_*` validate a request against the current state and return the entry
  (or raise :class:`MetaError`); :meth:`Metadata.apply` applies an entry and never fails for an
  entry that was prepared against the same state, so leader and follower cannot diverge.
- ``commit`` adds one or more objects at once (all or none are visible: an fsspec transaction
  or one file); each gets ``version = seq`` and replaces an older version of its path. A
  ``write_id`` seen before returns the earlier result (a retry after a leader switch commits
  nothing twice). The last ``WRITE_IDS_KEPT`` write ids are remembered.
- ``rename`` moves an object or a whole directory atomically; the target must not exist as a
  directory when the source is a file. ``delete`` removes objects (a directory recursively).
  Paths under ``data/`` are refused for all three.
- ``persisted`` marks one version persisted to the sink; a mark for an older version is kept
  for nothing (the newer one must be persisted on its own).
- A snapshot (:meth:`Metadata.snapshot`) is the whole state at a ``seq``; a follower that
  missed entries starts again from one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ringseed.protocol import cacheobjects as objects

WRITE_IDS_KEPT = 65536
MAX_OBJECTS_PER_COMMIT = 65536


class MetaError(Exception):
    """A refused request; ``code`` is a short machine name, the message a sentence."""

    code = "bad_request"


class NotFound(MetaError):
    code = "not_found"


class Conflict(MetaError):
    code = "conflict"


class Metadata:
    """Committed objects and the log position they reflect."""

    def __init__(self) -> None:
        self.seq = 0
        self.objects: dict[str, objects.ObjectMeta] = {}
        self.write_ids: OrderedDict[str, list[int]] = OrderedDict()

    # -- reading ---------------------------------------------------------------------------

    def get(self, path: str) -> objects.ObjectMeta:
        found = self.objects.get(path)
        if found is None:
            raise NotFound(f"no object {path!r}")
        return found

    def under(self, directory: str) -> list[objects.ObjectMeta]:
        """Objects at or below ``directory`` ("" is the whole tree), by path."""
        return [self.objects[p] for p in sorted(self.objects) if objects.is_under(p, directory)]

    def is_dir(self, path: str) -> bool:
        prefix = path + "/"
        return any(p.startswith(prefix) for p in self.objects)

    def checkpoints(self) -> dict[str, list[objects.ObjectMeta]]:
        """Objects outside ``data/`` grouped by checkpoint (top-level name)."""
        out: dict[str, list[objects.ObjectMeta]] = {}
        for path, meta in self.objects.items():
            if not objects.is_data(path):
                out.setdefault(objects.checkpoint_of(path), []).append(meta)
        return out

    def referenced(self) -> set[str]:
        """Every chunk hash some object refers to."""
        return {c.sha256 for meta in self.objects.values() for c in meta.chunks}

    # -- preparing entries (leader) ----------------------------------------------------------

    def prepare_commit(
        self, *, write_id: str, writer: str, time: float, files: Iterable[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """A ``commit`` entry for ``files`` (``{path, size, chunks}``); MetaError on a bad one."""
        if not isinstance(write_id, str) or not 0 < len(write_id) <= 128:
            raise MetaError("write_id must be a string of 1 to 128 characters")
        items = list(files)
        if not items or len(items) > MAX_OBJECTS_PER_COMMIT:
            raise MetaError(f"a commit holds 1 to {MAX_OBJECTS_PER_COMMIT} files, got {len(items)}")
        clean: list[dict[str, Any]] = []
        seen: set[str] = set()
        for item in items:
            try:
                path = objects.check_writable(item.get("path"))
                chunks = objects.chunks_from(item.get("chunks"), what=f"{path}: chunks")
                size = objects.check_size(item.get("size"), chunks, what=path)
            except ValueError as exc:
                raise MetaError(str(exc)) from None
            if path in seen:
                raise MetaError(f"path {path!r} appears twice in one commit")
            seen.add(path)
            clean.append({"path": path, "size": size, "chunks": [c.to_list() for c in chunks]})
        paths = sorted(seen)
        for path in paths:
            self._check_file_slot(path, seen)
        return {"op": "commit", "write_id": write_id, "writer": writer, "time": float(time), "files": clean}

    def _check_file_slot(self, path: str, batch: set[str]) -> None:
        if self.is_dir(path):
            raise Conflict(f"path {path!r} is a directory; a file cannot replace it")
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in self.objects or parent in batch:
                raise Conflict(f"path {path!r}: its parent {parent!r} is a file")

    def prepare_rename(self, *, src: str, dst: str) -> dict[str, Any]:
        try:
            src, dst = objects.check_writable(src), objects.check_writable(dst)
        except objects.PathError as exc:
            raise MetaError(str(exc)) from None
        if src == dst:
            raise MetaError(f"rename of {src!r} onto itself")
        if objects.is_under(dst, src):
            raise MetaError(f"cannot move {src!r} into itself ({dst!r})")
        if src in self.objects:
            if self.is_dir(dst):
                raise Conflict(f"rename target {dst!r} is a directory")
            self._check_file_slot(dst, set())
        elif self.is_dir(src):
            if dst in self.objects or self.is_dir(dst):
                raise Conflict(f"rename target {dst!r} exists")
        else:
            raise NotFound(f"no object or directory {src!r}")
        return {"op": "rename", "src": src, "dst": dst}

    def prepare_delete(self, *, path: str, recursive: bool) -> dict[str, Any]:
        try:
            clean = objects.check_writable(path)
        except objects.PathError as exc:
            raise MetaError(str(exc)) from None
        if clean not in self.objects:
            if not self.is_dir(clean):
                raise NotFound(f"no object or directory {clean!r}")
            if not recursive:
                raise MetaError(f"{clean!r} is a directory; delete it recursively")
        return {"op": "delete", "path": clean}

    def prepare_persisted(self, *, path: str, version: int) -> dict[str, Any] | None:
        """A ``persisted`` entry, or None when there is nothing to mark (gone, newer, done)."""
        meta = self.objects.get(path)
        if meta is None or meta.version != version or meta.persisted:
            return None
        return {"op": "persisted", "path": path, "version": version}

    # -- applying entries (leader and follower) ----------------------------------------------

    def apply(self, seq: int, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Apply entry ``seq`` (must be ``self.seq + 1``); returns the request's result."""
        if seq != self.seq + 1:
            raise ValueError(f"entry {seq} does not follow {self.seq}")
        self.seq = seq
        op = entry["op"]
        if op == "commit":
            return self._apply_commit(seq, entry)
        if op == "rename":
            return self._apply_rename(entry["src"], entry["dst"])
        if op == "delete":
            return self._apply_delete(entry["path"])
        if op == "persisted":
            meta = self.objects.get(entry["path"])
            if meta is not None and meta.version == entry["version"]:
                self.objects[meta.path] = replace(meta, persisted=True)
            return {"ok": True}
        raise ValueError(f"unknown entry op {op!r}")

    def _apply_commit(self, seq: int, entry: Mapping[str, Any]) -> dict[str, Any]:
        write_id = entry["write_id"]
        if write_id in self.write_ids:
            versions = self.write_ids[write_id]
            return {"versions": versions, "duplicate": True}
        versions = []
        for item in entry["files"]:
            chunks = tuple(objects.ChunkRef(sha256=c[0], length=int(c[1])) for c in item["chunks"])
            self.objects[item["path"]] = objects.ObjectMeta(
                path=item["path"],
                version=seq,
                size=int(item["size"]),
                chunks=chunks,
                writer=str(entry["writer"]),
                committed_at=float(entry["time"]),
            )
            versions.append(seq)
        self.write_ids[write_id] = versions
        while len(self.write_ids) > WRITE_IDS_KEPT:
            self.write_ids.popitem(last=False)
        return {"versions": versions, "duplicate": False}

    def _apply_rename(self, src: str, dst: str) -> dict[str, Any]:
        if src in self.objects:
            meta = self.objects.pop(src)
            self.objects[dst] = replace(meta, path=dst)
            return {"moved": 1}
        moved = 0
        for path in [p for p in self.objects if p.startswith(src + "/")]:
            meta = self.objects.pop(path)
            new = dst + path[len(src) :]
            self.objects[new] = replace(meta, path=new)
            moved += 1
        return {"moved": moved}

    def _apply_delete(self, path: str) -> dict[str, Any]:
        gone = [p for p in self.objects if objects.is_under(p, path)]
        for p in gone:
            del self.objects[p]
        return {"deleted": len(gone)}

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "objects": [m.to_dict() for m in self.objects.values()],
            "write_ids": [[k, v] for k, v in self.write_ids.items()],
        }

    @classmethod
    def from_snapshot(cls, snap: Mapping[str, Any]) -> Metadata:
        meta = cls()
        meta.seq = int(snap["seq"])
        for raw in snap["objects"]:
            obj = objects.ObjectMeta.from_dict(raw)
            meta.objects[obj.path] = obj
        for key, versions in snap["write_ids"]:
            meta.write_ids[str(key)] = [int(v) for v in versions]
        return meta


def retention(meta: Metadata, *, keep: int, sink: bool) -> list[str]:
    """Checkpoints to delete so that at most ``keep`` remain (the newest by last commit).

    With a sink, a checkpoint leaves the cache only once every object in it is persisted
    (it is then still in the sink); without one, the oldest beyond ``keep`` go.
    ``keep <= 0`` keeps everything.
    """
    if keep <= 0:
        return []
    groups = meta.checkpoints()
    newest_first = sorted(groups, key=lambda name: max(m.version for m in groups[name]), reverse=True)
    doomed = []
    for name in newest_first[keep:]:
        if not sink or all(m.persisted for m in groups[name]):
            doomed.append(name)
    return doomed
