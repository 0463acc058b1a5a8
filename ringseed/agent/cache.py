"""The memory tier: recently verified chunks kept in RAM to relay to peers without a disk read.

Rules: a byte budget (``budget`` bytes; 0 disables the tier); least recently used chunks are
evicted first; only verified chunks are ever put here (the caller checks); a chunk larger than
the whole budget is not kept. A *pinned* chunk (its disk write has not finished yet) is never
evicted; the caller bounds how many chunks it pins so pinned bytes stay within the budget, and
unpins a chunk once its write is done. Single-threaded (the agent's event loop); values are treated as
immutable once stored.
"""

from __future__ import annotations

from collections import OrderedDict

Data = bytes | bytearray | memoryview  # a chunk's bytes (often a view of a pooled buffer, see ``buffers``)


class MemoryTier:
    """An LRU map from chunk index to its verified bytes, bounded by a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget = max(0, budget)
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._chunks: OrderedDict[int, Data] = OrderedDict()
        self.pinned: set[int] = set()

    def put(self, index: int, data: Data, *, pin: bool = False) -> bool:
        """Keep ``data`` (pinned if ``pin``); False if it does not fit the budget and was not kept."""
        if len(data) > self.budget:
            return False
        self.discard(index)
        self._chunks[index] = data
        self.used += len(data)
        if pin:
            self.pinned.add(index)
        if self.used > self.budget:
            for old_index in [i for i in self._chunks if i not in self.pinned]:
                self.used -= len(self._chunks.pop(old_index))
                if self.used <= self.budget:
                    break
        return True

    def unpin(self, index: int) -> None:
        self.pinned.discard(index)

    def get(self, index: int) -> Data | None:
        data = self._chunks.get(index)
        if data is None:
            self.misses += 1
            return None
        self.hits += 1
        self._chunks.move_to_end(index)
        return data

    def discard(self, index: int) -> None:
        self.pinned.discard(index)
        old = self._chunks.pop(index, None)
        if old is not None:
            self.used -= len(old)

    def clear(self) -> None:
        self._chunks.clear()
        self.pinned.clear()
        self.used = 0

    def __len__(self) -> int:
        return len(self._chunks)
