"""Who holds which chunk, in memory and time that stay small at 10,000 nodes.

Owns the holdings part of the tracker's state (:mod:`ringseed.protocol.tracker` keeps one
:class:`Holdings`). Pure: no I/O, no clock; randomness comes in as a ``random.Random``.

Rules:
- A node's holdings are a ``bytearray`` of one byte per chunk: 7,451 chunks take 7.3 KB per node
  (73 MB at 10,000 nodes), where a set of ints took about 60 times that.
- Per chunk the number of holders. While a chunk has at most ``SPARSE_MAX`` holders they are
  also kept as a list, sampled directly; above that the chunk is *dense* and holders are found
  by probing nodes at random, each probe succeeding at least once in ``nodes / SPARSE_MAX``. A
  dense chunk whose count falls below ``SPARSE_MAX / 2`` gets its list back (one pass over the
  nodes; the hysteresis keeps a chunk from switching back and forth).
- :meth:`Holdings.sample` draws up to ``k`` distinct holders that pass a filter, in O(k) probes
  for a sparse chunk and O(k x nodes / holders) for a dense one, bounded by ``MAX_PROBES``: the
  cost of offering peers never grows with the number of holders.
- Only nodes that :meth:`Holdings.join` ed hold anything; :meth:`Holdings.leave` returns what a
  node held (and forgets it); :meth:`Holdings.reset` starts a new layout with nothing held.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

SPARSE_MAX = 1024
MAX_PROBES = 4096
_NOTHING = bytearray()


class Holdings:
    """Holdings of every joined node, and holders per chunk."""

    def __init__(self) -> None:
        self.chunk_count = 0
        self._have: dict[str, bytearray] = {}
        self._held: dict[str, int] = {}
        self._count: list[int] = []
        self._lists: list[list[str] | None] = []
        self._names: list[str] = []  # joined nodes, for probing dense chunks
        self._pos: dict[str, int] = {}

    def reset(self, chunk_count: int) -> None:
        """A new layout of ``chunk_count`` chunks: nobody holds anything."""
        self.chunk_count = chunk_count
        self._count = [0] * chunk_count
        self._lists = [[] for _ in range(chunk_count)]
        for name in self._have:
            self._have[name] = bytearray(chunk_count)
            self._held[name] = 0

    # -- membership --------------------------------------------------------------------------

    def join(self, name: str) -> None:
        if name in self._have:
            return
        self._have[name] = bytearray(self.chunk_count)
        self._held[name] = 0
        self._pos[name] = len(self._names)
        self._names.append(name)

    def leave(self, name: str) -> list[int]:
        """Forget ``name``; returns the chunks it held (they no longer count)."""
        if name not in self._have:
            return []
        held = self.held(name)
        for index in held:
            self._unhold(name, index)
        del self._have[name], self._held[name]
        pos = self._pos.pop(name)
        last = self._names.pop()
        if last != name:
            self._names[pos] = last
            self._pos[last] = pos
        return held

    # -- chunks ------------------------------------------------------------------------------

    def add(self, name: str, index: int) -> bool:
        """``name`` holds ``index`` now; False if it already did."""
        return bool(self.add_many(name, (index,)))

    def add_many(self, name: str, indices: Iterable[int]) -> list[int]:
        """:meth:`add` for each of ``indices``; returns those ``name`` did not hold before."""
        have = self._have[name]
        added: list[int] = []
        for index in indices:
            if not have[index]:
                have[index] = 1
                added.append(index)
        self._counted(name, added)
        return added

    def add_run(self, name: str, first: int, stop: int) -> Sequence[int]:
        """:meth:`add_many` of ``first .. stop - 1``; when ``name`` held none of them (the usual
        announcement: a node gets chunks in runs) its bytes are set in one slice and the result
        is the range itself."""
        have = self._have[name]
        if first >= stop or have.find(1, first, stop) >= 0:
            return self.add_many(name, range(first, stop))
        have[first:stop] = b"\x01" * (stop - first)
        added = range(first, stop)
        self._counted(name, added)
        return added

    def _counted(self, name: str, added: Sequence[int]) -> None:
        """Counts and holder lists for ``added``, just set in ``name``'s bytes."""
        count, lists = self._count, self._lists
        for index in added:
            n = count[index] = count[index] + 1
            listed = lists[index]
            if listed is not None:
                if n > SPARSE_MAX:
                    lists[index] = None
                else:
                    listed.append(name)
        self._held[name] += len(added)

    def remove(self, name: str, index: int) -> bool:
        """``name`` no longer holds ``index``; False if it did not."""
        have = self._have.get(name)
        if have is None or not have[index]:
            return False
        self._unhold(name, index)
        return True

    def _unhold(self, name: str, index: int) -> None:
        self._have[name][index] = 0
        self._held[name] -= 1
        count = self._count[index] = self._count[index] - 1
        listed = self._lists[index]
        if listed is not None:
            listed.remove(name)
        elif count < SPARSE_MAX // 2:
            self._lists[index] = [n for n in self._names if self._have[n][index]]

    def holds(self, name: str, index: int) -> bool:
        have = self._have.get(name)
        return have is not None and 0 <= index < len(have) and bool(have[index])

    def held(self, name: str) -> list[int]:
        """The chunks ``name`` holds, in index order (O(held), the scan runs in C)."""
        have = self._have.get(name)
        out: list[int] = []
        if have is None:
            return out
        index = have.find(1)
        while index >= 0:
            out.append(index)
            index = have.find(1, index + 1)
        return out

    def have_of(self, name: str) -> bytearray:
        """``name``'s holdings, one byte per chunk (read it, never change it)."""
        return self._have.get(name, _NOTHING)

    def held_count(self, name: str) -> int:
        return self._held.get(name, 0)

    def count(self, index: int) -> int:
        """Holders of ``index`` (every joined node, penalised or not)."""
        return self._count[index]

    def holders(self, index: int) -> set[str]:
        """Every holder of ``index`` (O(nodes) for a dense chunk: for status and tests, not requests)."""
        listed = self._lists[index]
        if listed is not None:
            return set(listed)
        return {n for n in self._names if self._have[n][index]}

    def sample(self, index: int, *, k: int, rng: random.Random, accept: Callable[[str], bool]) -> list[str]:
        """Up to ``k`` distinct holders of ``index`` that pass ``accept``, drawn at random."""
        count = self._count[index]
        if count == 0 or k <= 0:
            return []
        listed = self._lists[index]
        if listed is not None and len(listed) <= 2 * k:
            picks = [n for n in listed if accept(n)]
            rng.shuffle(picks)
            return picks[:k]
        pool = listed if listed is not None else self._names
        probes = min(MAX_PROBES, 4 * k * max(1, len(pool) // count) + 4 * k)
        found: list[str] = []
        seen: set[str] = set()
        size = len(pool)
        for _ in range(probes):
            name = pool[int(rng.random() * size)]
            if name in seen:
                continue
            seen.add(name)
            if (listed is not None or self._have[name][index]) and accept(name):
                found.append(name)
                if len(found) == k:
                    break
        return found
