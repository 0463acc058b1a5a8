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
  or newer than the current version) or when more entries passed since than there are chunks
  (the snapshot is then the smaller answer). The log keeps at most ``limit`` availability and
  as many pull entries (the oldest half goes when full), and every hash learned for the layout.
"""

from __future__ import annotations

import bisect
import enum

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
    """Versioned changes per kind: ``(version, chunk)`` pairs in version order.

    ``AVAIL`` and ``PULL`` changes keep at most ``limit`` entries each (the oldest half goes when
    full); ``HASH`` changes are kept for the whole layout (one per chunk at most)."""

    def __init__(self, *, limit: int = 1 << 16) -> None:
        self.limit = max(2, limit)
        self.version = 0
        self._versions: dict[int, list[int]] = {AVAIL: [], HASH: [], PULL: []}
        self._indices: dict[int, list[int]] = {AVAIL: [], HASH: [], PULL: []}
        self._floor: dict[int, int] = {AVAIL: 0, HASH: 0, PULL: 0}  # versions up to it may be gone

    def add(self, kind: int, index: int) -> None:
        self.version += 1
        versions, indices = self._versions[kind], self._indices[kind]
        versions.append(self.version)
        indices.append(index)
        if kind != HASH and len(versions) > self.limit:
            cut = len(versions) // 2
            self._floor[kind] = versions[cut - 1]
            del versions[:cut], indices[:cut]

    def restart(self, *, limit: int | None = None) -> None:
        """Forget every entry (a new layout): every version up to now needs a snapshot."""
        self.version += 1
        for kind in self._versions:
            self._versions[kind], self._indices[kind] = [], []
            self._floor[kind] = self.version
        if limit is not None:
            self.limit = max(2, limit)

    def since(self, kind: int, version: int) -> list[int] | None:
        """The chunks of ``kind`` changed after ``version`` (in order, repeats kept), or None when
        that version is unknown here (older than what is kept, or newer than now)."""
        if not self._floor[kind] <= version <= self.version:
            return None
        versions = self._versions[kind]
        return self._indices[kind][bisect.bisect_right(versions, version) :]

    def all(self, kind: int) -> list[int]:
        """Every kept change of ``kind`` (the hashes learned for this layout, in order)."""
        return self._indices[kind]
