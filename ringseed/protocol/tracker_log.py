"""What changed in a swarm's shared view, by version: so that a heartbeat reply carries changes, not the whole view.

Owns the version numbers of the tracker's shared view and the bounded log of its changes (the
tracker, :mod:`ringseed.protocol.tracker`, keeps one :class:`ChangeLog` and builds each
node's :class:`View` from it). Pure: no I/O, no clock.

Rules:
- The shared view is, per chunk, its availability *level*, its hash (once known) and whether
  it is being pulled from the origin. Every change of one of them is one log entry and moves
  the version on by one; the version never goes back within a tracker's life (a new layout
  moves ``base`` to the current version, so that every older version gets a snapshot).
- Levels: 0 for no holder, else the largest power of two not above the count of holders (1, 2,
  4, 8, ...). While N nodes fetch a chunk its level changes about log2(N) times, not N times, so
  the entries of a whole distribution are O(chunks x log N) and a node hears O(changes since
  its version) per reply. In exact mode (:data:`Replies.FULL`, the behaviour before deltas,
  kept for the side-by-side benchmark) the level is the count itself and a reply carrying any
  availability change carries the whole vector.
- A node names the version it last absorbed (``since``); it gets a snapshot instead of the
  changes when that version is unknown (null, another epoch, older than the log's first entry
  or newer than the current version) or when more chunks changed since than there are chunks
  (the snapshot is then the smaller answer). The log keeps, per chunk, the version of its last
  availability change and of its last pull change (at most ``limit`` chunks each, the oldest
  half goes when full), and every hash learned for the layout: what changed since a version
  costs O(chunks changed since), each once.
"""

from __future__ import annotations

import bisect
import enum
import itertools

AVAIL = 0
HASH = 1
PULL = 2


class Replies(enum.Enum):
    """How heartbeat replies tell availability: changes of levels, or the whole vector of counts."""

    DELTA = "delta"
    FULL = "full"


def level(count: int) -> int:
    """The level a count of holders is told as: 0, or the largest power of two not above it."""
    return 0 if count <= 0 else 1 << (count.bit_length() - 1)


class ChangeLog:
    """Versioned changes per kind.

    ``HASH`` changes are ``(version, chunk)`` pairs in version order, kept for the whole layout
    (one per chunk at most). ``AVAIL`` and ``PULL`` keep, per chunk, the version of its *last*
    change only, in version order (a chunk that changed again moves to the end): what changed
    since a version is then each changed chunk once, found by walking back from the newest
    (O(chunks changed since), not O(changes since): while a chunk spreads to N nodes its level
    changes log2(N) times). They keep at most ``limit`` chunks each (the oldest half goes when
    full; those versions then need a snapshot)."""

    def __init__(self, *, limit: int = 1 << 16) -> None:
        self.limit = max(2, limit)
        self.version = 0
        self._versions: list[int] = []  # HASH
        self._indices: list[int] = []
        self._last: dict[int, dict[int, int]] = {AVAIL: {}, PULL: {}}  # chunk -> version of its last change
        self._floor: dict[int, int] = {AVAIL: 0, HASH: 0, PULL: 0}  # versions up to it may be gone

    def add(self, kind: int, index: int) -> None:
        self.version += 1
        if kind == HASH:
            self._versions.append(self.version)
            self._indices.append(index)
            return
        last = self._last[kind]
        last.pop(index, None)  # (re-inserted: the dict's order is the order of last change)
        last[index] = self.version
        if len(last) > self.limit:
            cut = len(last) // 2
            gone = list(itertools.islice(last, cut))
            self._floor[kind] = last[gone[-1]]
            for chunk in gone:
                del last[chunk]

    def restart(self, *, limit: int | None = None) -> None:
        """Forget every entry (a new layout): every version up to now needs a snapshot."""
        self.version += 1
        self._versions, self._indices = [], []
        self._last = {AVAIL: {}, PULL: {}}
        for kind in self._floor:
            self._floor[kind] = self.version
        if limit is not None:
            self.limit = max(2, limit)

    def since(self, kind: int, version: int) -> list[int] | None:
        """The chunks of ``kind`` changed after ``version`` (each once, in the order of their last
        change), or None when that version is unknown here (older than what is kept, or newer
        than now)."""
        if not self._floor[kind] <= version <= self.version:
            return None
        if kind == HASH:
            return self._indices[bisect.bisect_right(self._versions, version) :]
        out: list[int] = []
        for index, changed in reversed(self._last[kind].items()):
            if changed <= version:
                break
            out.append(index)
        out.reverse()
        return out

    def all(self, kind: int) -> list[int]:
        """Every kept change of ``kind`` (for ``HASH``: the hashes learned for this layout, in order)."""
        return self._indices if kind == HASH else list(self._last[kind])
