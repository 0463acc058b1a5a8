"""Chunk buffers, reused: receiving or pulling a chunk writes into memory that is already mapped.

A fresh 64 MiB buffer per chunk costs 16,384 page faults, the kernel zeroing every page, Python
zeroing it again and an ``munmap`` when it is freed: about as much CPU as receiving the bytes.
A :class:`Pool` hands out views of anonymous memory maps it keeps and reuses.

Rules:
- :meth:`Pool.take` returns a writable ``memoryview`` of exactly the length asked for, backed by
  one of the pool's maps (``capacity`` bytes each, 4 KiB pages). Its contents are whatever the
  last user left: the caller fills every byte it uses.
- No ``MADV_HUGEPAGE``: a huge page is a free 2 MiB block, exactly what a virtual machine with
  free page reporting has given back to its host, so its first touch is a host fault for every
  page of it. Measured on such a machine (BENCHMARKS section 4, session 6): first touch 0.6-2.1
  ns/B with huge pages, 0.4-0.5 with 4 KiB pages; with huge pages the pool's first use was half
  a receiver's CPU for a 1 GiB model. A buffer is filled by ``recv_into`` and hashed sequentially,
  so huge pages saved nothing measurable afterwards.
- Nobody gives a buffer back. A map is reused only when the pool holds the last reference to it:
  every view of it (slices, views held by a worker thread, the memory tier, a response being
  written) keeps the map alive and referenced, so a buffer still read or written anywhere is
  never handed out again. CPython's reference count is the proof (``sys.getrefcount``).
- At most ``limit`` maps are kept. When all are in use, or the length is larger than
  ``capacity``, a one-off map is returned (freed as usual when its last view goes).
- :meth:`Pool.trim` unmaps the free maps beyond ``keep`` (the agent calls it when it has every
  chunk, so an idle node does not hold RAM for downloads it will not make).
"""

from __future__ import annotations

import mmap
import sys

_FREE_REFS = 3  # the pool's list, the loop variable and getrefcount's own argument


def _new_map(length: int) -> mmap.mmap:
    return mmap.mmap(-1, max(1, length), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class Pool:
    """Up to ``limit`` reusable anonymous maps of ``capacity`` bytes each."""

    def __init__(self, *, capacity: int, limit: int) -> None:
        if capacity <= 0 or limit < 0:
            raise ValueError(f"buffer pool needs capacity > 0 and limit >= 0, got {capacity}, {limit}")
        self.capacity = capacity
        self.limit = limit
        self._maps: list[mmap.mmap] = []
        self.reused = 0
        self.created = 0
        self.one_off = 0

    def take(self, length: int) -> memoryview:
        """A writable view of ``length`` bytes nobody else uses (contents undefined)."""
        if length > self.capacity:
            self.one_off += 1
            return memoryview(_new_map(length))[:length]
        for area in self._maps:
            if sys.getrefcount(area) <= _FREE_REFS:
                self.reused += 1
                return memoryview(area)[:length]
        area = _new_map(self.capacity)
        if len(self._maps) < self.limit:
            self._maps.append(area)
            self.created += 1
        else:
            self.one_off += 1
        return memoryview(area)[:length]

    def free(self) -> int:
        """How many of the pool's maps nobody uses now."""
        return sum(1 for area in self._maps if sys.getrefcount(area) <= _FREE_REFS)

    def trim(self, keep: int = 0) -> None:
        """Unmap free maps until at most ``keep`` free ones are left."""
        kept: list[mmap.mmap] = []
        free = 0
        for area in self._maps:
            if sys.getrefcount(area) <= _FREE_REFS:
                free += 1
                if free > keep:
                    area.close()
                    continue
            kept.append(area)
        self._maps = kept

    def __len__(self) -> int:
        return len(self._maps)
