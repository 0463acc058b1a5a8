"""A replica of a master whose state is soft (the tracker role): it leads while it holds the lock, else it follows.

Owns the life cycle of such a replica; the lock is :mod:`ringseed.master.election` (a file lock
cluster-free, a Kubernetes Lease in a cluster, the same as the cache master's), the rules
:mod:`ringseed.protocol.election` (soft state: the lock holder leads at once).

Rules:
- Without a lock (a single replica) it leads from the start.
- With a lock it tries to take it every ``poll_every`` seconds. Once it holds it, it writes the
  next term into the election record (its instance id and URL) and leads with fresh state
  (``on_lead``: a new tracker with a new epoch; agents re-register with what they verified, so
  nothing is fetched again).
- The leader renews the lock every ``lock.renew_every`` seconds; when the lock is no longer held
  (a Lease it could not renew in time) it stops leading at once and campaigns again.
- A follower reads the record to know the leader's URL (:attr:`SoftReplica.leader_url`); the
  master answers its clients' calls with 503 ``not_leader`` naming it (``X-Ringseed-Leader``),
  and ``/readyz`` is 200 only on the leader (a Service behind a readiness probe routes to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable

from aiohttp import web as aioweb

from ringseed import web
from ringseed.master import election as locks
from ringseed.protocol import election

log = logging.getLogger(__name__)


class SoftReplica:
    """Leader or follower of a soft-state master; :meth:`run` campaigns and leads until cancelled."""

    def __init__(
        self, *, lock: locks.Lock | None, url: str, poll_every: float, on_lead: Callable[[], None], role: str
    ) -> None:
        self.lock = lock
        self.url = url
        self.poll_every = poll_every
        self.on_lead = on_lead
        self.role = role
        self.instance = secrets.token_hex(6)
        self.leading = False
        self.leader_url = ""
        self.term = 0
        self.became_leader = asyncio.Event()

    async def run(self) -> None:
        if self.lock is None:
            self._lead(election.Record(term=1, leader=self.instance, leader_url=self.url))
            return
        while True:
            await self._campaign(self.lock)
            await self._hold(self.lock)

    async def _campaign(self, lock: locks.Lock) -> None:
        while True:
            try:
                if await lock.try_acquire():
                    record = await lock.read()
                    decision = election.decide(record, me=self.instance, has_state=False, waited=0, grace=0, soft=True)
                    assert decision is election.Decision.LEAD
                    new = election.take_over(record, me=self.instance, url=self.url, seq=0, lost=False)
                    await lock.write(new)
                    self._lead(new)
                    return
                self.leader_url = (await lock.read()).leader_url
            except locks.LockError as exc:
                log.warning("Master lock unavailable: %s", exc)
            await asyncio.sleep(self.poll_every)

    def _lead(self, record: election.Record) -> None:
        self.term, self.leader_url = record.term, self.url
        self.on_lead()
        self.leading = True
        self.became_leader.set()
        log.info("Master (%s) %s leads term %d at %s", self.role, self.instance, self.term, self.url or "-")

    async def _hold(self, lock: locks.Lock) -> None:
        while True:
            await asyncio.sleep(lock.renew_every)
            with contextlib.suppress(locks.LockError):
                await lock.renew()
            if not lock.held():
                log.error("Master (%s) %s lost its lock; following again", self.role, self.instance)
                self.leading = False
                self.became_leader.clear()
                self.leader_url = ""
                return


def lifecycle(replica: SoftReplica) -> Callable[[aioweb.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context running ``replica`` (and releasing its lock at the end)."""

    async def release() -> None:
        if replica.lock is not None:
            with contextlib.suppress(Exception):
                await replica.lock.release()

    return web.background(replica.run, after=release)
