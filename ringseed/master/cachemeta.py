"""The master's cache role: the metadata of a group's node cache, kept by a leader and a follower.

Owns the leader/follower life cycle and the replication of the metadata log; the endpoints are
:mod:`ringseed.master.cachemeta_api`, the state :mod:`ringseed.protocol.cachelog` (hard,
replicated) and :mod:`ringseed.protocol.cachenodes` (soft, rebuilt from the agents), the rules of
who may lead :mod:`ringseed.protocol.election`, the lock :mod:`ringseed.master.election`.

Rules:
- Two replicas run the same command. The one holding the lock (and allowed to lead by the
  election record) is the leader; the other follows it: it registers with the leader
  (``POST /v1/replica/follow``), receives a snapshot, then every entry before the leader
  acknowledges it. Every other endpoint on a follower answers 503 ``not_leader`` with the
  leader's URL in ``X-Ringseed-Leader``.
- A write (commit, rename, delete, persisted, retention) is one entry. The leader takes writes
  one at a time: it sends the entry to the in-sync follower and waits for its ack (at most
  ``follower_timeout``); then it applies the entry and answers. If the follower does not ack,
  the leader first records ``sync = ""`` (so that follower can never take over with a stale
  log) and only then applies and answers. A leader whose lock is no longer valid (a Lease it
  could not renew) refuses writes (503) and exits, to come back as a follower.
- A follower becomes leader only when :func:`ringseed.protocol.election.decide` allows it;
  it then starts a new term. Agents find it through the URL list they were given (or the hint
  of a follower), re-register (the new leader's soft state starts empty) and go on.
- Retention (``keep``): after each commit or persisted mark the leader deletes the checkpoints
  beyond the newest ``keep`` (with a sink, only once they are persisted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web as aioweb

from ringseed import web
from ringseed.master import election as locks
from ringseed.protocol import cachelog, cachenodes, election

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 << 20
SNAPSHOT_BODY_BYTES = 512 << 20
LEADER_HEADER = web.LEADER_HEADER


class NotLeader(Exception):
    def __init__(self, leader_url: str) -> None:
        super().__init__(f"this master replica is not the leader; the leader is {leader_url or 'unknown'}")
        self.leader_url = leader_url


@dataclass(frozen=True)
class Settings:
    url: str  # where this replica answers (advertised to the other one and in the record)
    replicas: int = 2  # copies of each checkpoint (the writer's node included)
    sink: bool = False  # a sink is configured: objects get persisted, retention waits for it
    keep: int = 0  # checkpoints kept in the cache (0: all)
    offline_after: float = 10.0
    heartbeat_interval: float = 2.0
    orphan_grace: float = 600.0
    follower_timeout: float = 2.0
    takeover_grace: float = 60.0
    poll_interval: float = 0.2


class CacheMaster:
    """One replica of the cache master: leader or follower."""

    def __init__(self, *, token: str, lock: locks.Lock, settings: Settings) -> None:
        self.token = token
        self.lock = lock
        self.settings = settings
        self.instance = secrets.token_hex(6)
        self.meta = cachelog.Metadata()
        self.nodes = cachenodes.Nodes(offline_after=settings.offline_after, orphan_grace=settings.orphan_grace)
        self.leading = False
        self.has_state = False  # this replica followed a leader (or leads): its log is the group's
        self.record = election.Record()
        self.leader_url = ""
        self.term = 0
        self.follower: tuple[str, str] | None = None  # (instance, url)
        self.follower_in_sync = False
        self.writes = asyncio.Lock()
        self.lost = False
        self.started = time.monotonic()
        self.became_leader = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self._free_since: float | None = None

    # -- roles ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow until allowed to lead, then lead; a deposed leader starts again as an empty follower."""
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.settings.follower_timeout + 5))
        try:
            while True:
                await self._campaign()
                await self._lead()
                self.has_state, self.meta = False, cachelog.Metadata()
                self.became_leader.clear()
        finally:
            await self._http.close()

    async def _campaign(self) -> None:
        while True:
            if await self.lock.try_acquire():
                record = await self.lock.read()
                now = time.monotonic()
                self._free_since = self._free_since or now
                decision = election.decide(
                    record,
                    me=self.instance,
                    has_state=self.has_state,
                    waited=now - self._free_since,
                    grace=self.settings.takeover_grace,
                )
                if decision is not election.Decision.WAIT:
                    await self._take_over(record, lost=decision is election.Decision.LEAD_LOST)
                    return
                await self.lock.release()
                self.leader_url = record.leader_url
            else:
                self._free_since = None
                with contextlib.suppress(locks.LockError):
                    self.leader_url = (await self.lock.read()).leader_url
            await self._ask_to_follow()
            await asyncio.sleep(self.settings.poll_interval)

    async def _take_over(self, record: election.Record, *, lost: bool) -> None:
        if lost:
            log.error(
                "Cache master leads without the full state of term %d (no replica was in sync); committed "
                "objects it does not know are gone from the metadata (those persisted are in the sink)",
                record.term,
            )
        self.record = election.take_over(record, me=self.instance, url=self.settings.url, seq=self.meta.seq, lost=lost)
        await self.lock.write(self.record)
        self.term = self.record.term
        self.lost = lost
        self.has_state = True
        self.leading = True
        self.leader_url = self.settings.url
        self.follower, self.follower_in_sync = None, False
        self.nodes = cachenodes.Nodes(
            offline_after=self.settings.offline_after, orphan_grace=self.settings.orphan_grace
        )
        self.started = time.monotonic()
        log.info("Cache master %s leads term %d at seq %d", self.instance, self.term, self.meta.seq)
        self.became_leader.set()

    async def _ask_to_follow(self) -> None:
        if not self.leader_url or self.leader_url == self.settings.url or self._http is None:
            return
        body = {"instance": self.instance, "url": self.settings.url, "seq": self.meta.seq, "term": self.term}
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            async with self._http.post(
                self.leader_url + "/v1/replica/follow", json=body, headers=self._auth()
            ) as response:
                await response.read()

    async def _lead(self) -> None:
        every = min(1.0, self.settings.offline_after / 4, self.lock.renew_every)
        last_renew = time.monotonic()
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for name in self.nodes.purge(now=now):
                log.info("Cache node %s went silent; purged", name)
            if now - last_renew >= self.lock.renew_every:
                await self.lock.renew()
                last_renew = now
            if not self.lock.held():
                log.error("Cache master %s lost its lock; stepping down", self.instance)
                self.leading = False
                return
            await self._sync_follower()

    def settling(self) -> float:
        """Seconds left in which agents are still expected to re-register with this new leader."""
        window = 2 * self.settings.heartbeat_interval + 1.0
        return max(0.0, window - (time.monotonic() - self.started))

    # -- writes ----------------------------------------------------------------------------------

    def require_leader(self) -> None:
        if not self.leading:
            raise NotLeader(self.leader_url)
        if not self.lock.held():
            raise NotLeader("")

    async def write(self, prepare: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
        """Prepare one entry against the current state, replicate it, apply it; returns its result."""
        async with self.writes:
            self.require_leader()
            entry = prepare()
            if entry is None:
                return {"ok": True, "noop": True}
            seq = self.meta.seq + 1
            await self._replicate(seq, entry)
            self.require_leader()
            result = self.meta.apply(seq, entry)
        if entry["op"] in ("commit", "persisted"):
            await self._retain()
        return result

    async def _replicate(self, seq: int, entry: dict[str, Any]) -> None:
        if self.follower is not None and self.follower_in_sync:
            ok = await self._send("/v1/replica/append", {"entries": [[seq, entry]]})
            if ok:
                return
            log.warning("Follower %s did not acknowledge entry %d; continuing without it", self.follower[0], seq)
            self.follower_in_sync = False
        if self.record.sync:
            self.record = election.with_sync(self.record, follower="", seq=self.meta.seq)
            await self.lock.write(self.record)

    async def _send(self, path: str, body: dict[str, Any]) -> bool:
        if self.follower is None or self._http is None:
            return False
        payload = dict(body, term=self.term, leader=self.instance, leader_url=self.settings.url)
        try:
            async with self._http.post(
                self.follower[1] + path,
                json=payload,
                headers=self._auth(),
                timeout=aiohttp.ClientTimeout(total=self.settings.follower_timeout),
            ) as response:
                await response.read()
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _sync_follower(self) -> None:
        """Bring a registered, out-of-sync follower up to date with a snapshot, then name it ``sync``."""
        if self.follower is None or self.follower_in_sync:
            return
        async with self.writes:
            if self.follower is None or not await self._send(
                "/v1/replica/snapshot", {"snapshot": self.meta.snapshot()}
            ):
                return
            self.follower_in_sync = True
            self.record = election.with_sync(self.record, follower=self.follower[0], seq=self.meta.seq)
            await self.lock.write(self.record)
            log.info("Follower %s in sync at seq %d", self.follower[0], self.meta.seq)

    def add_follower(self, *, instance: str, url: str) -> None:
        if self.follower is None or self.follower[0] != instance:
            self.follower = (instance, url)
            self.follower_in_sync = False

    async def _retain(self) -> None:
        doomed = cachelog.retention(self.meta, keep=self.settings.keep, sink=self.settings.sink)
        for name in doomed:
            with contextlib.suppress(cachelog.MetaError):
                await self.write(lambda n=name: self.meta.prepare_delete(path=n, recursive=True))  # type: ignore[misc]
                log.info("Checkpoint %s left the cache (retention keeps %d)", name, self.settings.keep)

    # -- follower side -------------------------------------------------------------------------------

    def accept_snapshot(self, *, term: int, leader_url: str, snapshot: dict[str, Any]) -> int:
        self._check_term(term, leader_url)
        self.meta = cachelog.Metadata.from_snapshot(snapshot)
        self.has_state = True
        return self.meta.seq

    def accept_entries(self, *, term: int, leader_url: str, entries: list[Any]) -> int:
        self._check_term(term, leader_url)
        if not self.has_state:
            raise cachelog.Conflict("no snapshot yet")
        for seq, entry in entries:
            if int(seq) <= self.meta.seq:
                continue
            if int(seq) != self.meta.seq + 1:
                self.has_state = False
                raise cachelog.Conflict(f"entry {seq} does not follow {self.meta.seq}; send a snapshot")
            self.meta.apply(int(seq), entry)
        return self.meta.seq

    def _check_term(self, term: int, leader_url: str) -> None:
        if self.leading:
            raise cachelog.Conflict("this replica leads; it takes no entries")
        if term < self.term:
            raise cachelog.Conflict(f"term {term} is older than {self.term}")
        if term > self.term:
            self.has_state = False
        self.term = term
        self.leader_url = leader_url

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    # -- status ----------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": "cache",
            "leading": self.leading,
            "instance": self.instance,
            "term": self.term,
            "seq": self.meta.seq,
            "leader_url": self.leader_url,
            "follower_in_sync": self.follower_in_sync,
            "state_lost": self.lost,
        }
        if not self.leading:
            return out
        checkpoints = self.meta.checkpoints()
        out["nodes"] = sorted(self.nodes.nodes)
        out["objects"] = len(self.meta.objects)
        out["checkpoints"] = len(checkpoints)
        out["last_checkpoint"] = self._last_checkpoint(checkpoints)
        return out

    def _last_checkpoint(self, checkpoints: dict[str, list[Any]]) -> dict[str, Any] | None:
        if not checkpoints:
            return None
        name = max(checkpoints, key=lambda n: max(m.version for m in checkpoints[n]))
        files = checkpoints[name]
        return {
            "name": name,
            "files": len(files),
            "bytes": sum(m.size for m in files),
            "copies": min(self.nodes.copies(m) for m in files),
            "persisted": all(m.persisted for m in files),
            "committed_at": max(m.committed_at for m in files),
        }


def lifecycle(master: CacheMaster) -> Callable[[aioweb.Application], AsyncIterator[None]]:
    async def release() -> None:
        with contextlib.suppress(Exception):
            await master.lock.release()

    return web.background(master.run, after=release)


def problem_for(exc: Exception) -> web.HTTPProblem:
    if isinstance(exc, NotLeader):
        headers = {LEADER_HEADER: exc.leader_url} if exc.leader_url else None
        return web.problem(503, "not_leader", str(exc), headers=headers)
    if isinstance(exc, locks.LockError):
        return web.problem(503, "lock_unavailable", str(exc))
    status = {
        cachenodes.UnknownNode: 404,
        cachelog.NotFound: 404,
        cachelog.Conflict: 409,
        cachenodes.NotEnoughNodes: 409,
    }
    code = next((s for kind, s in status.items() if isinstance(exc, kind)), 400)
    return web.problem(code, getattr(exc, "code", "bad_request"), str(exc))
