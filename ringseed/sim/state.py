"""Who holds what in the simulated swarm, kept so that every question is cheap at 10,000 nodes.

Owns the holdings bitmap, per-chunk availability and holder lists, and a set with O(1) random
removal. Rules:

- ``avail[c]`` counts live holders (the numbers :func:`ringseed.protocol.choice.rarest_first`
  ranks by); holder lists are append-only and may name dead nodes, which samplers filter out.
- A node's candidate chunks are found between its lowest missing chunk and the highest chunk
  anyone ever held, so a node that keeps up with the origin scans a short window, not the model.
"""

from __future__ import annotations

import random
from collections.abc import Container, Iterable, Sequence


class Holdings:
    """Chunk holdings of ``nodes`` nodes over ``chunks`` chunks."""

    def __init__(self, *, nodes: int, chunks: int) -> None:
        self.chunks = chunks
        self.held = [bytearray(chunks) for _ in range(nodes)]
        self.count = [0] * nodes
        self.avail = [0] * chunks
        self.holders: list[list[int]] = [[] for _ in range(chunks)]
        self.low = [0] * nodes
        self.frontier = 0
        self._origin_scan = 0

    def has(self, node: int, chunk: int) -> bool:
        return bool(self.held[node][chunk])

    def add(self, node: int, chunk: int) -> bool:
        """Record a new copy; True when it is the chunk's only live copy (news for starved nodes)."""
        row = self.held[node]
        row[chunk] = 1
        self.count[node] += 1
        self.avail[chunk] += 1
        self.holders[chunk].append(node)
        self.frontier = max(self.frontier, chunk + 1)
        low = self.low[node]
        while low < self.chunks and row[low]:
            low += 1
        self.low[node] = low
        return self.avail[chunk] == 1

    def drop(self, node: int) -> None:
        """``node`` died: its copies stop counting."""
        row = self.held[node]
        for chunk in range(self.chunks):
            if row[chunk]:
                self.avail[chunk] -= 1
                if self.avail[chunk] == 0:
                    self._origin_scan = min(self._origin_scan, chunk)

    def candidates(self, node: int, *, busy: Container[int]) -> list[int]:
        """Chunks ``node`` may fetch from a peer: held somewhere, not by it, not in flight."""
        row, avail = self.held[node], self.avail
        return [c for c in range(self.low[node], self.frontier) if not row[c] and avail[c] and c not in busy]

    def unheld(self, want: int, *, skip: Container[int]) -> list[int]:
        """Up to ``want`` chunks nobody holds, lowest index first, leaving out ``skip``."""
        found: list[int] = []
        index = self._origin_scan
        avail = self.avail
        while index < self.chunks and avail[index]:
            index += 1
        self._origin_scan = index
        while index < self.chunks and len(found) < want:
            if not avail[index] and index not in skip:
                found.append(index)
            index += 1
        return found

    def sample_holders(self, chunk: int, *, limit: int, alive: Sequence[bool], rng: random.Random) -> list[int]:
        """Live holders of ``chunk``: all of them, or ``limit`` drawn at random when there are more."""
        names = self.holders[chunk]
        if len(names) <= limit:
            return [n for n in names if alive[n]]
        drawn = set(rng.choices(names, k=limit))
        return [n for n in drawn if alive[n]]

    def complete(self, node: int) -> bool:
        return self.count[node] == self.chunks


class RandomSet:
    """A set of ints with O(1) add, discard and random removal."""

    def __init__(self) -> None:
        self._items: list[int] = []
        self._where: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: object) -> bool:
        return item in self._where

    def add(self, item: int) -> None:
        if item not in self._where:
            self._where[item] = len(self._items)
            self._items.append(item)

    def discard(self, item: int) -> None:
        where = self._where.pop(item, None)
        if where is None:
            return
        last = self._items.pop()
        if where < len(self._items):
            self._items[where] = last
            self._where[last] = where

    def take(self, count: int, rng: random.Random) -> list[int]:
        """Remove and return up to ``count`` members drawn at random."""
        taken: list[int] = []
        while self._items and len(taken) < count:
            item = self._items[rng.randrange(len(self._items))]
            self.discard(item)
            taken.append(item)
        return taken

    def drain(self) -> list[int]:
        """Remove and return every member."""
        items = self._items
        self._items, self._where = [], {}
        return items

    def extend(self, items: Iterable[int]) -> None:
        for item in items:
            self.add(item)
