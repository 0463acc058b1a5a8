"""The memory tier: recently verified chunks kept in RAM to relay to peers without a disk read.

Rules: a byte budget (``budget`` bytes; 0 disables the tier); least recently used chunks are
evicted first; only verified chunks are ever put here (the caller checks); a chunk larger than
the whole budget is not kept. Single-threaded (the agent's event loop); values are treated as
immutable once stored.
"""

from __future__ import annotations

from collections import OrderedDict


class MemoryTier:
    """An LRU map from chunk index to its verified bytes, bounded by a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget = max(0, budget)
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._chunks: OrderedDict[int, bytes | bytearray] = OrderedDict()

    def put(self, index: int, data: bytes | bytearray) -> None:
        if len(data) > self.budget:
            return
        self.discard(index)
        self._chunks[index] = data
        self.used += len(data)
        while self.used > self.budget:
            _, old = self._chunks.popitem(last=False)
            self.used -= len(old)

    def get(self, index: int) -> bytes | bytearray | None:
        data = self._chunks.get(index)
        if data is None:
            self.misses += 1
            return None
        self.hits += 1
        self._chunks.move_to_end(index)
        return data

    def discard(self, index: int) -> None:
        old = self._chunks.pop(index, None)
        if old is not None:
            self.used -= len(old)

    def __len__(self) -> int:
        return len(self._chunks)
