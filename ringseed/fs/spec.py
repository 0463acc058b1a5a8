"""``ringseed://``: the node cache as an fsspec filesystem (registered through fsspec's entry point).

Owns the mapping of fsspec's API onto the local cache agent, so that ``fsspec.open``,
``torch.save(obj, fs.open(...))``, torch.distributed.checkpoint's ``FsspecWriter`` /
``FsspecReader`` and any fsspec user work unchanged.

Rules:
- Paths: ``ringseed://a/b`` and ``a/b`` name the same object in the group's tree;
  ``ringseed://data/<name>/...`` is the read-only dataset ``<name>`` (:mod:`ringseed.fs.data`:
  listings and sizes come from the dataset's revision, reads from the node's cache). A path
  that leaves the tree (``..``) is refused with ``PermissionError``.
- Directories are implicit (a directory exists while something is below it): ``mkdir`` and
  ``makedirs`` succeed without doing anything; ``rmdir`` of a non-empty directory fails.
- ``mv`` is one atomic rename in the master (a file or a whole directory); ``rm`` of a directory
  needs ``recursive=True``. ``cp_file`` copies through the cache (read, then write).
- Files are written once: ``open(path, "wb")`` only (no append, no update); reads are
  ``"rb"``. Text modes work through fsspec's wrapper.
- ``with fs.transaction:`` records every file written inside it with one master entry at the
  end (all visible together, or none if the block raised).
"""

from __future__ import annotations

import datetime
import errno
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.transaction import Transaction

from ringseed.fs import client as client_module
from ringseed.fs import data, files
from ringseed.protocol import cacheobjects


class RingseedTransaction(Transaction):  # type: ignore[misc]
    """An fsspec transaction whose files are recorded together by one commit."""

    def complete(self, commit: bool = True) -> None:
        written = [f for f in self.files if isinstance(f, files.WriteFile)]
        self.files.clear()
        self.fs._intrans = False
        self.fs._transaction = None
        if not commit:
            for f in written:
                f.discard()
            return
        try:
            for f in written:
                f.commit()
        except BaseException:
            for f in written:
                if not f.closed or f.result is not None:
                    f.discard()
            raise
        if written:
            fs: RingseedFileSystem = self.fs
            fs.client.call("POST", "/v1/local/commit", {"write_ids": [f.write_id for f in written]})


class RingseedFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """The node cache of this training pod's group, through its node's agent."""

    protocol = ("ringseed",)
    root_marker = ""
    transaction_type = RingseedTransaction
    cachable = False  # the socket and token come from the environment; a cached instance could be stale

    def __init__(
        self,
        socket: str | None = None,
        token: str | None = None,
        readahead: int = files.READAHEAD_CHUNKS,
        verify: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.client = client_module.LocalClient(socket_path=socket, token=token)
        self.readahead = readahead
        self.verify = verify
        self._views: dict[str, data.DataView] = {}

    # -- datasets (data/<name>/...) -------------------------------------------------------------

    def _data(self, path: str) -> tuple[data.DataView, str] | None:
        """``(view, path inside the dataset)`` for ``data/<name>/...``; None for ``data`` itself or other paths."""
        if not cacheobjects.is_data(path) or path == cacheobjects.DATA_ROOT:
            return None
        try:
            cacheobjects.check_path(path)
        except cacheobjects.PathError as exc:
            raise PermissionError(errno.EACCES, str(exc)) from None
        _, name, *rest = path.split("/", 2)
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = data.DataView(self.client, name)
        return view, (rest[0] if rest else "")

    def _sources(self) -> list[str]:
        return list(self.client.call("GET", "/v1/local/info").get("data_sources", []))

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        text = str(path)
        if text.startswith("ringseed://"):
            text = text[len("ringseed://") :]
        return text.strip("/")

    # -- metadata -------------------------------------------------------------------------------

    def _entry(self, raw: dict[str, Any]) -> dict[str, Any]:
        if raw.get("type") == "directory":
            return {"name": raw["path"], "size": 0, "type": "directory"}
        return {
            "name": raw["path"],
            "size": raw["size"],
            "type": "file",
            "version": raw["version"],
            "persisted": raw.get("persisted", False),
            "mtime": raw.get("committed_at", 0.0),
        }

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        clean = self._strip_protocol(path)
        if clean == cacheobjects.DATA_ROOT:
            return {"name": clean, "size": 0, "type": "directory"}
        found = self._data(clean)
        if found is not None:
            return found[0].info(found[1])
        return self._entry(self.client.call("GET", "/v1/local/stat", path=clean))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        clean = self._strip_protocol(path)
        entries: list[dict[str, Any]]
        found = self._data(clean)
        if clean == cacheobjects.DATA_ROOT:
            entries = [{"name": f"{clean}/{s}", "size": 0, "type": "directory"} for s in self._sources()]
        elif found is not None:
            entries = found[0].ls(found[1])
        else:
            answer = self.client.call("GET", "/v1/local/list", path=clean)
            entries = [self._entry(dict(f, type="file")) for f in answer["files"]]
            entries += [{"name": d, "size": 0, "type": "directory"} for d in answer["dirs"]]
        entries.sort(key=lambda e: str(e["name"]))
        return entries if detail else [e["name"] for e in entries]

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def modified(self, path: str) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.UTC)

    created = modified

    def ukey(self, path: str) -> str:
        return str(self.info(path).get("version", ""))

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self._strip_protocol(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self._strip_protocol(path)

    def rmdir(self, path: str) -> None:
        clean = self._strip_protocol(path)
        if self.ls(clean, detail=False):
            raise OSError(f"{clean}: directory not empty")

    # -- changes --------------------------------------------------------------------------------

    def rm_file(self, path: str) -> None:
        self.client.call("POST", "/v1/local/delete", {"path": self._strip_protocol(path), "recursive": False})

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        paths = path if isinstance(path, list) else [path]
        for item in paths:
            self.client.call("POST", "/v1/local/delete", {"path": self._strip_protocol(item), "recursive": recursive})
        self.invalidate_cache()

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        self.client.call("POST", "/v1/local/rename", {"src": src, "dst": dst})

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        with self.open(path1, "rb") as src, self.open(path2, "wb") as dst:
            while block := src.read(16 << 20):
                dst.write(block)

    # -- files ----------------------------------------------------------------------------------

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Any = None,
        autocommit: bool = True,
        cache_options: Any = None,
        **kwargs: Any,
    ) -> files.ReadFile | files.WriteFile | data.DataFile:
        clean = self._strip_protocol(path)
        found = self._data(clean) if mode == "rb" else None
        if found is not None:
            return data.DataFile(*found)
        if mode == "rb":
            return files.ReadFile(self.client, clean, readahead=self.readahead, verify=self.verify)
        if mode in ("wb", "xb"):
            if mode == "xb" and self.exists(clean):
                raise FileExistsError(clean)
            return files.WriteFile(self.client, clean, autocommit=autocommit)
        raise ValueError(f"mode {mode!r}: ringseed:// objects are written once (wb) and read (rb); no append or update")
