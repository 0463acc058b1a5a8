"""The lock a master replica must hold to lead, and the small record kept beside it.

Owns the two lock kinds; the rules of who may lead are :mod:`ringseed.protocol.election`.

- :class:`FileLock` (cluster-free): an exclusive ``flock`` on ``<dir>/<name>.lock``, held for
  as long as the leader's process lives (the kernel releases it when the process dies, even on
  SIGKILL); the record is ``<dir>/<name>.record.json``, replaced atomically.
- :class:`LeaseLock` (in a cluster): a ``coordination.k8s.io/v1`` Lease ``<name>`` in the
  master's namespace. The holder renews it every ``duration / 3`` seconds; another replica may
  take it once ``renewTime + leaseDurationSeconds`` has passed. Updates carry the Lease's
  ``resourceVersion`` so two replicas cannot both win. The record is the Lease annotation
  ``ringseed.io/record`` (JSON). A leader that cannot renew before its Lease runs out has lost
  it: :meth:`LeaseLock.held` turns false and the master stops acknowledging writes.

Every method may block on I/O; they are async and run blocking calls in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Protocol

from ringseed.protocol import election

RECORD_ANNOTATION = "ringseed.io/record"


class LockError(Exception):
    """The lock's store could not be read or written (the caller retries or steps down)."""


class Lock(Protocol):
    renew_every: float  # seconds between renewals while held

    async def try_acquire(self) -> bool: ...

    async def renew(self) -> bool: ...

    async def release(self) -> None: ...

    async def read(self) -> election.Record: ...

    async def write(self, record: election.Record) -> None: ...

    def held(self) -> bool: ...


class FileLock:
    """``flock`` on a local file; the record in a JSON file beside it."""

    renew_every = 1.0

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.lock"
        self.record_path = directory / f"{name}.record.json"
        self._fd: int | None = None

    async def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    async def renew(self) -> bool:
        return self._fd is not None  # a flock lasts as long as the process holds the descriptor

    async def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    async def read(self) -> election.Record:
        try:
            return election.Record.from_dict(json.loads(self.record_path.read_text()))
        except FileNotFoundError:
            return election.Record()
        except (OSError, ValueError) as exc:
            raise LockError(f"{self.record_path}: unreadable election record: {exc}") from exc

    async def write(self, record: election.Record) -> None:
        if self._fd is None:
            raise LockError("only the lock holder writes the election record")
        await asyncio.to_thread(self._write_sync, record)

    def _write_sync(self, record: election.Record) -> None:
        tmp = self.record_path.with_suffix(f".tmp-{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record.to_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.record_path)

    def held(self) -> bool:
        return self._fd is not None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _micro(ts: datetime.datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: Any) -> datetime.datetime | None:
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    if isinstance(value, str) and value:
        with contextlib.suppress(ValueError):
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


class LeaseLock:
    """A Kubernetes Lease as the lock; the record in an annotation on it."""

    def __init__(self, *, api: Any, namespace: str, name: str, identity: str, duration: float = 15.0) -> None:
        self.api = api  # kubernetes.client.CoordinationV1Api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.renew_every = duration / 3
        self._valid_until = 0.0  # monotonic
        self._version: str | None = None

    @classmethod
    def in_cluster(cls, *, namespace: str, name: str, identity: str, duration: float = 15.0) -> LeaseLock:
        from kubernetes import client, config

        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return cls(api=client.CoordinationV1Api(), namespace=namespace, name=name, identity=identity, duration=duration)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(getattr(self.api, method), *args, **kwargs)
        except ApiException as exc:
            if exc.status in (404, 409):
                raise
            raise LockError(f"Lease {self.namespace}/{self.name}: {method} failed: {exc.status} {exc.reason}") from exc
        except OSError as exc:
            raise LockError(f"Lease {self.namespace}/{self.name}: {method} failed: {exc}") from exc

    async def _patch(self, body: dict[str, Any]) -> Any:
        # a JSON merge patch (the client would send a dict as a JSON patch, which the server refuses)
        return await self._call(
            "patch_namespaced_lease", self.name, self.namespace, body, _content_type="application/merge-patch+json"
        )

    async def _get(self) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = await self._call("read_namespaced_lease", self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise LockError(f"Lease {self.namespace}/{self.name}: read failed: {exc.status}") from exc
        body: dict[str, Any] = self.api.api_client.sanitize_for_serialization(lease)
        return body

    async def try_acquire(self) -> bool:
        from kubernetes.client.exceptions import ApiException

        started = time.monotonic()
        lease = await self._get()
        now = _now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": _micro(now),
        }
        try:
            if lease is None:
                body = {
                    "metadata": {"name": self.name, "annotations": {}},
                    "spec": {**spec, "acquireTime": _micro(now)},
                }
                created = await self._call("create_namespaced_lease", self.namespace, body)
                self._version = getattr(created.metadata, "resource_version", None)
            else:
                current = lease.get("spec") or {}
                holder = current.get("holderIdentity")
                renewed = _parse_time(current.get("renewTime"))
                length = float(current.get("leaseDurationSeconds") or self.duration)
                takeable = election.lease_takeable(
                    holder=holder,
                    renewed_at=renewed.timestamp() if renewed is not None else None,
                    duration=length,
                    me=self.identity,
                    now=now.timestamp(),
                )
                if not takeable:
                    return False
                if holder != self.identity:
                    spec["acquireTime"] = _micro(now)
                patch = {"metadata": {"resourceVersion": lease["metadata"].get("resourceVersion")}, "spec": spec}
                updated = await self._patch(patch)
                self._version = getattr(updated.metadata, "resource_version", None)
        except ApiException as exc:
            if exc.status == 409:  # someone else won the race
                return False
            raise LockError(f"Lease {self.namespace}/{self.name}: {exc.status} {exc.reason}") from exc
        self._valid_until = started + self.duration
        return True

    async def renew(self) -> bool:
        """Renew while held; False once the Lease is someone else's (or could not be renewed in time)."""
        try:
            ok = await self.try_acquire()
        except LockError:
            ok = False
        if not ok and time.monotonic() >= self._valid_until:
            self._valid_until = 0.0
        return ok

    async def release(self) -> None:
        if self._valid_until == 0.0:
            return
        self._valid_until = 0.0
        with contextlib.suppress(Exception):
            await self._patch({"spec": {"holderIdentity": "", "renewTime": None}})

    async def read(self) -> election.Record:
        lease = await self._get()
        raw = (((lease or {}).get("metadata") or {}).get("annotations") or {}).get(RECORD_ANNOTATION)
        try:
            return election.Record.from_dict(json.loads(raw) if raw else None)
        except ValueError as exc:
            raise LockError(f"Lease {self.namespace}/{self.name}: unreadable record: {exc}") from exc

    async def write(self, record: election.Record) -> None:
        if not self.held():
            raise LockError("only the Lease holder writes the election record")
        await self._patch({"metadata": {"annotations": {RECORD_ANNOTATION: json.dumps(record.to_dict())}}})

    def held(self) -> bool:
        return time.monotonic() < self._valid_until


def make_lock(*, lock_dir: str | None, lease: str | None, name: str, duration: float = 15.0) -> Lock:
    """The lock of a replicated master: ``<lock_dir>/<name>.lock`` (cluster-free) or the Lease
    ``lease`` in ``$POD_NAMESPACE`` with ``$POD_NAME`` and a random suffix as identity (in a
    cluster). Exactly one of ``lock_dir`` and ``lease`` is given."""
    if (lock_dir is None) == (lease is None):
        raise ValueError("give exactly one of a lock directory (cluster-free) or a Lease name (Kubernetes)")
    if lock_dir is not None:
        return FileLock(Path(lock_dir), name)
    assert lease is not None
    namespace = os.environ.get("POD_NAMESPACE", "default")
    identity = f"{os.environ.get('POD_NAME', name)}-{secrets.token_hex(4)}"
    return LeaseLock.in_cluster(namespace=namespace, name=lease, identity=identity, duration=duration)
