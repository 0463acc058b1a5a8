"""A node cache's two tiers under hard budgets: what goes where, what is spilled, what is dropped.

Owns the accounting and the decisions of one cache agent's memory tier (tmpfs) and SSD tier;
the agent (``ringseed/cache/chunks.py``) moves the bytes. Pure: no I/O; time is ``now``.

Rules:
- Budgets are hard: the bytes counted in a tier (entries plus reservations) never exceed its
  budget. Room is made *before* it is granted: :meth:`TierBook.reserve` answers
  :class:`Granted`, or :class:`Make` (spills and drops to carry out first, then ask again), or
  :class:`Blocked` (nothing can be freed now: the caller waits for a change and gives up with
  the reason after its deadline; this is the back-pressure on writers).
- Entries are chunks by content hash. An entry is *evictable* when the bytes exist elsewhere
  for good: a checkpoint chunk once every object that uses it is persisted to the sink (the
  master says so), a dataset chunk always (its source has it). A chunk that is not evictable
  may move from memory to SSD (spill) but is never dropped: the last copy of something not yet
  persisted is never lost to make room.
- A pinned entry (being written, sent or moved) is neither spilled nor dropped; nor is one
  under a read lease (handed to a reader, which opens it at once) until the lease ends.
- Victims are taken least recently used first. From memory, an evictable victim is spilled
  when the SSD has free room for it without dropping anything, else dropped; a non-evictable
  one is spilled, dropping evictable SSD entries (LRU) to make room if needed.
- A reservation (a writer's buffer, a chunk being received) counts against its tier until it
  is turned into an entry (:meth:`TierBook.fill`) or released.
- Insertion: checkpoint chunks enter as most recently used (plain LRU). Dataset chunks enter
  *cold* (``cold=True``): at the least recently used end, except every ``BIP_EVERY``-th one,
  and move to the most recently used end only when read again (:meth:`TierBook.touch`). This is
  the bimodal insertion policy (BIP, Qureshi et al., ISCA 2007). Why not plain LRU: training
  reads a dataset in epochs; when the dataset is larger than the cache, LRU evicts every chunk
  before its next epoch comes round (hit ratio about 0), while BIP keeps a stable part of the
  set resident and churns only a few slots (hit ratio about cache / dataset, the best any
  policy reaches without knowing the future order). When the dataset fits, nothing is evicted
  and both behave the same.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field


class Tier(enum.Enum):
    MEMORY = "memory"
    SSD = "ssd"


@dataclass
class Entry:
    key: str
    size: int
    tier: Tier
    evictable: bool
    last_use: float
    pins: int = 0
    moving: bool = False  # a spill or drop of it is under way
    lease_until: float = 0.0

    def busy(self, now: float) -> bool:
        return bool(self.pins or self.moving or self.lease_until > now)


@dataclass(frozen=True)
class Granted:
    tier: Tier
    ticket: int


@dataclass(frozen=True)
class Make:
    spill: tuple[str, ...]  # memory -> SSD
    drop: tuple[str, ...]  # remove from whichever tier holds it


@dataclass(frozen=True)
class Blocked:
    reason: str


Plan = Granted | Make | Blocked


@dataclass
class _Budget:
    limit: int
    used: int = 0
    entries: OrderedDict[str, Entry] = field(default_factory=OrderedDict)

    @property
    def free(self) -> int:
        return self.limit - self.used


BIP_EVERY = 32


class TierBook:
    """Accounting of both tiers of one node."""

    def __init__(self, *, memory_bytes: int, ssd_bytes: int) -> None:
        if memory_bytes < 0 or ssd_bytes < 0:
            raise ValueError("budgets must be non-negative")
        self.tiers = {Tier.MEMORY: _Budget(memory_bytes), Tier.SSD: _Budget(ssd_bytes)}
        self.entries: dict[str, Entry] = {}
        self.reservations: dict[int, tuple[Tier, int]] = {}
        self._tickets = 0
        self._cold = 0

    # -- queries ---------------------------------------------------------------------------

    def used(self, tier: Tier) -> int:
        return self.tiers[tier].used

    def limit(self, tier: Tier) -> int:
        return self.tiers[tier].limit

    def free_bytes(self, *, now: float) -> int:
        """Bytes a new chunk could still take here without waiting: free plus evictable, both tiers."""
        total = 0
        for budget in self.tiers.values():
            total += budget.free + sum(e.size for e in budget.entries.values() if e.evictable and not e.busy(now))
        return total

    def get(self, key: str) -> Entry | None:
        return self.entries.get(key)

    # -- reservations ----------------------------------------------------------------------------

    def reserve(self, size: int, *, now: float, tiers: tuple[Tier, ...] = (Tier.MEMORY,)) -> Plan:
        """Room for ``size`` bytes in the first of ``tiers`` that can give it (see the module rules)."""
        if size < 0:
            raise ValueError("size must be non-negative")
        for tier in tiers:
            if self.tiers[tier].free >= size:
                return self._grant(tier, size)
        reasons = []
        for tier in tiers:
            plan = self._make_room(tier, size, now=now)
            if isinstance(plan, Make):
                return plan
            reasons.append(plan.reason)
        return Blocked("; ".join(reasons))

    def _grant(self, tier: Tier, size: int) -> Granted:
        self._tickets += 1
        self.reservations[self._tickets] = (tier, size)
        self.tiers[tier].used += size
        return Granted(tier=tier, ticket=self._tickets)

    def release(self, ticket: int) -> None:
        tier, size = self.reservations.pop(ticket)
        self.tiers[tier].used -= size

    def fill(self, ticket: int, *, key: str, size: int, evictable: bool, now: float, cold: bool = False) -> bool:
        """Turn reservation ``ticket`` into entry ``key`` of ``size`` (at most the reserved bytes).

        False when ``key`` is already held (the reservation is released; the caller discards
        its duplicate bytes).
        """
        tier, reserved = self.reservations.pop(ticket)
        budget = self.tiers[tier]
        budget.used -= reserved
        if size > reserved:
            raise ValueError(f"chunk {key[:12]} is {size} bytes, more than the {reserved} reserved")
        if key in self.entries:
            return False
        entry = Entry(key=key, size=size, tier=tier, evictable=evictable, last_use=now)
        self.entries[key] = entry
        budget.entries[key] = entry
        budget.used += size
        if cold:
            self._cold += 1
            if self._cold % BIP_EVERY:
                budget.entries.move_to_end(key, last=False)
        return True

    def _make_room(self, tier: Tier, size: int, *, now: float) -> Make | Blocked:
        budget = self.tiers[tier]
        if size > budget.limit:
            return Blocked(f"{tier.value} budget {budget.limit} bytes is smaller than {size}")
        need = size - budget.free
        spill: list[str] = []
        drop: list[str] = []
        ssd = self.tiers[Tier.SSD]
        ssd_free = ssd.free
        ssd_victims = [e for e in ssd.entries.values() if e.evictable and not e.busy(now)]
        for entry in list(budget.entries.values()):
            if need <= 0:
                break
            if entry.busy(now):
                continue
            if tier is Tier.SSD:
                if entry.evictable:
                    drop.append(entry.key)
                    need -= entry.size
                continue
            if entry.evictable and ssd_free < entry.size:
                drop.append(entry.key)
                need -= entry.size
                continue
            while ssd_free < entry.size and ssd_victims:
                victim = ssd_victims.pop(0)
                drop.append(victim.key)
                ssd_free += victim.size
            if ssd_free >= entry.size:
                spill.append(entry.key)
                ssd_free -= entry.size
                need -= entry.size
        if need > 0:
            return Blocked(self._why_full(tier, now=now))
        return Make(spill=tuple(spill), drop=tuple(drop))

    def _why_full(self, tier: Tier, *, now: float) -> str:
        budget = self.tiers[tier]
        pinned = sum(e.size for e in budget.entries.values() if e.busy(now))
        kept = sum(e.size for e in budget.entries.values() if not e.evictable)
        reserved = sum(s for t, s in self.reservations.values() if t is tier)
        return (
            f"{tier.value} tier full ({budget.used} of {budget.limit} bytes: {kept} not yet persisted, "
            f"{pinned} in use, {reserved} reserved) and the SSD tier cannot take more "
            f"({self.tiers[Tier.SSD].used} of {self.tiers[Tier.SSD].limit} bytes)"
        )

    # -- moves (the caller does the I/O between begin and end) -------------------------------

    def begin_move(self, key: str) -> Entry:
        entry = self.entries[key]
        if entry.moving or entry.pins:
            raise ValueError(f"chunk {key[:12]} is busy")
        entry.moving = True
        return entry

    def spilled(self, key: str) -> None:
        """The memory entry ``key`` now lives on SSD (its bytes were copied; the memory copy is gone)."""
        entry = self.entries[key]
        memory, ssd = self.tiers[Tier.MEMORY], self.tiers[Tier.SSD]
        del memory.entries[key]
        memory.used -= entry.size
        entry.tier, entry.moving = Tier.SSD, False
        ssd.entries[key] = entry
        ssd.used += entry.size

    def dropped(self, key: str) -> None:
        """``key``'s bytes are gone (evicted, dropped by the master, found corrupt)."""
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        budget = self.tiers[entry.tier]
        del budget.entries[key]
        budget.used -= entry.size

    def abort_move(self, key: str) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.moving = False

    # -- use ---------------------------------------------------------------------------------

    def touch(self, key: str, *, now: float) -> None:
        entry = self.entries[key]
        entry.last_use = now
        self.tiers[entry.tier].entries.move_to_end(key)

    def pin(self, key: str) -> Entry:
        entry = self.entries[key]
        entry.pins += 1
        return entry

    def lease(self, key: str, *, until: float) -> Entry:
        """Keep ``key`` where it is until ``until`` (a reader was handed its file)."""
        entry = self.entries[key]
        entry.lease_until = max(entry.lease_until, until)
        return entry

    def unlease(self, key: str) -> None:
        """The reader is done with ``key`` before its lease ran out."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.lease_until = 0.0

    def unpin(self, key: str) -> None:
        entry = self.entries.get(key)
        if entry is not None and entry.pins > 0:
            entry.pins -= 1

    def set_evictable(self, key: str, evictable: bool) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.evictable = evictable
