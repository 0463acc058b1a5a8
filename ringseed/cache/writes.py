"""Writes into the node cache: buffers to writers, chunks hashed and replicated as they come, commit.

Owns the life of one write (one file a training process writes through the SDK or the FUSE
mount) on the writer's node:

1. ``open``: the path is checked (:func:`ringseed.protocol.cacheobjects.check_writable`) and the
   master places the replicas (``replicas - 1`` other nodes; an error if there are too few).
2. ``buffer``: the writer gets tmpfs buffers of ``chunk_size`` bytes, allocated by the agent under
   the memory budget (back-pressure: it waits while the cache is full of unpersisted chunks).
3. ``submit``: each filled buffer becomes a chunk: hashed, kept, and pushed to every replica at
   once, while the writer fills the next buffer (replication streams chunk by chunk).
4. ``finish`` waits until every chunk is held here and on every replica; ``commit`` records the
   file(s) with the master (one entry: all files of a transaction appear together, or none).
   Only then does the writer's ``close()`` return: the acknowledgement means ``replicas`` copies.

A replica that fails is replaced by a new placement (excluding it) and every chunk so far is
pushed to the new one; a write fails with a clear error only when no replacement is left. A
write left idle for ``idle_timeout`` is aborted (its buffers released; its chunks, referenced
by nothing, are dropped by the master's orphan rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringseed.cache import chunks, master_client, peers
from ringseed.protocol import cacheobjects as objects

if TYPE_CHECKING:
    from ringseed.cache.service import CacheAgent

log = logging.getLogger(__name__)


class WriteError(Exception):
    """A write that cannot complete; ``code`` names the kind, the message says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Session:
    id: str
    path: str
    replicas: list[tuple[str, str]]  # (name, url)
    tasks: dict[int, asyncio.Task[tuple[str, int]]] = field(default_factory=dict)
    buffers: dict[str, int] = field(default_factory=dict)  # buffer name -> reservation ticket
    pushed: dict[str, set[str]] = field(default_factory=dict)  # replica name -> chunks it holds
    last_use: float = field(default_factory=time.monotonic)
    failed: str | None = None
    done: tuple[dict[str, Any], list[str]] | None = None  # (file entry, copies) after finish


class Writes:
    """The write sessions of one cache agent."""

    def __init__(self, agent: CacheAgent) -> None:
        self.agent = agent
        self.sessions: dict[str, Session] = {}
        self._replace_lock = asyncio.Lock()

    def get(self, write_id: str) -> Session:
        session = self.sessions.get(write_id)
        if session is None:
            raise WriteError("unknown_write", f"no open write {write_id!r} (finished, aborted or timed out)")
        session.last_use = time.monotonic()
        return session

    async def open(self, path: str) -> Session:
        clean = objects.check_writable(path)
        replicas: list[tuple[str, str]] = []
        if self.agent.replicas > 1:
            chosen = await self._retrying(self.agent.master.place)
            replicas = [(r["name"], r["url"]) for r in chosen]
        session = Session(id=secrets.token_hex(12), path=clean, replicas=replicas)
        self.sessions[session.id] = session
        return session

    async def buffer(self, session: Session) -> tuple[str, int]:
        """A fresh writer buffer ``(name, size)`` for ``session``."""
        deadline = time.monotonic() + self.agent.config.write_deadline
        try:
            name, ticket = await self.agent.store.new_buffer(self.agent.config.chunk_size, deadline=deadline)
        except chunks.CacheFull as exc:
            raise WriteError("cache_full", f"no room for a write buffer: {exc}") from exc
        session.buffers[name] = ticket
        return name, self.agent.config.chunk_size

    def submit(self, session: Session, *, index: int, buffer: str, length: int) -> None:
        ticket = session.buffers.pop(buffer, None)
        if ticket is None:
            raise WriteError("bad_buffer", f"buffer {buffer!r} does not belong to write {session.id}")
        if index in session.tasks:
            self.agent.store.release(ticket)
            raise WriteError("bad_index", f"chunk {index} of write {session.id} was submitted twice")
        if not 0 < length <= self.agent.config.chunk_size:
            self.agent.store.release(ticket)
            raise WriteError("bad_length", f"chunk length {length} is outside (0, {self.agent.config.chunk_size}]")
        session.tasks[index] = asyncio.create_task(self._chunk(session, buffer, ticket, length))

    async def _chunk(self, session: Session, buffer: str, ticket: int, length: int) -> tuple[str, int]:
        sha = await self.agent.store.adopt_buffer(buffer, ticket=ticket, length=length)
        self.agent.store.book.pin(sha)
        try:
            await self._replicate(session, sha, length)
        finally:
            self.agent.store.book.unpin(sha)
        return sha, length

    async def _replicate(self, session: Session, sha: str, length: int) -> None:
        while True:
            targets = list(session.replicas)
            results = await asyncio.gather(
                *(self._push(session, name, url, sha, length) for name, url in targets), return_exceptions=True
            )
            failed = [(t, r) for t, r in zip(targets, results, strict=True) if isinstance(r, BaseException)]
            if not failed:
                return
            for (name, _), problem in failed:
                await self._replace(session, name, problem)

    async def _push(self, session: Session, name: str, url: str, sha: str, length: int) -> None:
        await peers.push(
            self.agent.http,
            url=url,
            token=self.agent.config.token,
            sha=sha,
            path=self.agent.store.path(sha),
            length=length,
        )
        session.pushed.setdefault(name, set()).add(sha)

    async def _replace(self, session: Session, name: str, problem: BaseException) -> None:
        async with self._replace_lock:
            if name not in dict(session.replicas):
                return  # another chunk's failure already replaced it
            log.warning("Replica %s failed for %s (%s); placing the copy elsewhere", name, session.path, problem)
            taken = {n for n, _ in session.replicas} | {self.agent.config.node_name, name}
            try:
                chosen = await self.agent.master.place(count=1, exclude=sorted(taken))
            except master_client.MasterError as exc:
                session.failed = f"replica {name} failed ({problem}) and no other node could be placed: {exc}"
                raise WriteError("replica_failed", session.failed) from exc
            fresh = [(r["name"], r["url"]) for r in chosen if r["name"] not in taken]
            if not fresh:
                session.failed = f"replica {name} failed ({problem}) and no other node with room is online"
                raise WriteError("replica_failed", session.failed)
            session.replicas = [r for r in session.replicas if r[0] != name] + fresh[:1]
            session.pushed.pop(name, None)
            new_name, new_url = fresh[0]
            for task in session.tasks.values():
                if task.done() and not task.cancelled() and task.exception() is None:
                    sha, length = task.result()
                    await self._push(session, new_name, new_url, sha, length)

    async def finish(self, session: Session, *, size: int) -> tuple[dict[str, Any], list[str]]:
        """Wait for every chunk (local and replicated); the file entry for a commit and its copies."""
        if session.done is not None:
            return session.done
        indices = sorted(session.tasks)
        if indices != list(range(len(indices))):
            raise WriteError("missing_chunks", f"write {session.id} has chunks {indices[:8]}..., not 0..n-1")
        try:
            results = [await session.tasks[i] for i in indices]
        except WriteError:
            raise
        except chunks.CacheFull as exc:
            raise WriteError("cache_full", str(exc)) from exc
        except (peers.PeerError, OSError) as exc:
            raise WriteError("write_failed", f"{session.path}: {exc}") from exc
        refs = [[sha, length] for sha, length in results]
        total = sum(length for _, length in results)
        if total != size:
            raise WriteError("bad_size", f"{session.path}: the writer says {size} bytes but the chunks hold {total}")
        copies = [self.agent.config.node_name, *(name for name, _ in session.replicas)]
        session.done = ({"path": session.path, "size": size, "chunks": refs}, copies)
        return session.done

    async def commit(self, write_id: str, files: list[dict[str, Any]], copies: list[str]) -> Any:
        """Record ``files`` with the master (retrying through a leader switch; the write id makes it once)."""
        return await self._retrying(lambda: self.agent.master.commit(write_id=write_id, files=files, copies=copies))

    async def _retrying(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()`` until the master's leader answers (a switch takes seconds), up to the write deadline."""
        deadline = time.monotonic() + self.agent.config.write_deadline
        while True:
            try:
                return await call()
            except master_client.Unavailable as exc:
                if time.monotonic() > deadline:
                    raise WriteError("master_unavailable", f"could not commit: {exc}") from exc
                await asyncio.sleep(0.2)
            except master_client.UnknownNode:
                await self.agent.register()
            except master_client.Refused as exc:
                raise WriteError(exc.error or "refused", exc.reason) from exc

    def uncommitted_chunks(self) -> set[str]:
        """Chunks of open writes (no object refers to them yet; they must not be dropped as orphans)."""
        out: set[str] = set()
        for session in self.sessions.values():
            for task in session.tasks.values():
                if task.done() and not task.cancelled() and task.exception() is None:
                    out.add(task.result()[0])
        return out

    def close(self, session: Session) -> None:
        self.sessions.pop(session.id, None)
        for ticket in session.buffers.values():
            self.agent.store.release(ticket)
        session.buffers.clear()

    def abort(self, session: Session) -> None:
        for task in session.tasks.values():
            task.cancel()
        for name in list(session.buffers):
            with contextlib.suppress(OSError):
                (self.agent.store.buffers_dir / name).unlink()
        self.close(session)

    def expire(self, *, now: float) -> None:
        for session in list(self.sessions.values()):
            if now - session.last_use > self.agent.config.idle_timeout:
                log.warning("Write %s of %s idle for too long; aborted", session.id, session.path)
                self.abort(session)
