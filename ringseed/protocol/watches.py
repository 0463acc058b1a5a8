"""Long-polls on the tracker: which node waits for news of which chunks, and until when.

Owns the decisions of ``POST /v1/watch`` (:mod:`ringseed.master.tracker` parks the requests; the
tracker, :mod:`ringseed.protocol.tracker`, reports news). Pure: no I/O; time is the ``now``
argument.

Rules:
- A watch names up to ``MAX_CHUNKS`` chunks, or none (any chunk its node lacks), and waits at
  most ``MAX_WAIT`` seconds: its deadline is ``now + wait`` with ``wait`` clamped to
  ``[0, MAX_WAIT]``. A woken or expired watch answers with the changes since the node's version;
  its owner then removes it.
- News of a chunk is a new copy (its availability level went up, so it can be fetched or
  fetched from more holders) or a pull from the origin that started (it can be streamed).
- News wakes every watch that names the chunk. Watches of any chunk are woken in the order they
  came, at most ``per_copy`` per new copy and only those whose node lacks the chunk: a chunk
  that appears while 10,000 nodes wait wakes as many as its holders can serve at once, not all
  of them (the others hear of it on their deadline, at the latest at their next heartbeat).
  At most ``SCAN_FACTOR`` times that many are looked at, so news costs O(copies), never
  O(watches).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

MAX_CHUNKS = 64
MAX_WAIT = 30.0
PER_COPY = 4  # the agent's default upload slots
SCAN_FACTOR = 8  # watches of any chunk looked at per one woken (nodes that hold it are skipped)


@dataclass(frozen=True)
class Ticket:
    """One parked watch."""

    id: int
    node: str
    chunks: frozenset[int] | None
    deadline: float


class Watches:
    """The parked watches of one tracker."""

    def __init__(self, *, per_copy: int = PER_COPY) -> None:
        self.per_copy = max(1, per_copy)
        self._tickets: dict[int, Ticket] = {}
        self._by_chunk: dict[int, set[int]] = {}
        self._any: dict[int, str] = {}  # ticket -> node, oldest first
        self._woken: list[int] = []
        self._next = 1

    def __len__(self) -> int:
        return len(self._tickets)

    def add(self, *, node: str, chunks: Collection[int] | None, now: float, wait: float) -> Ticket:
        """Park a watch of ``chunks`` (None: any chunk ``node`` lacks) for ``wait`` seconds at most."""
        if chunks is not None and len(chunks) > MAX_CHUNKS:
            raise ValueError(f"a watch names at most {MAX_CHUNKS} chunks, not {len(chunks)}")
        ticket = Ticket(
            id=self._next,
            node=node,
            chunks=frozenset(chunks) if chunks is not None else None,
            deadline=now + min(max(0.0, wait), MAX_WAIT),
        )
        self._next += 1
        self._tickets[ticket.id] = ticket
        if ticket.chunks is None:
            self._any[ticket.id] = node
        else:
            for index in ticket.chunks:
                self._by_chunk.setdefault(index, set()).add(ticket.id)
        return ticket

    def remove(self, ticket: int) -> None:
        found = self._tickets.pop(ticket, None)
        if found is not None:
            self._unlink(found)

    def _unlink(self, found: Ticket) -> None:
        """Nothing wakes ``found`` any more."""
        if found.chunks is None:
            self._any.pop(found.id, None)
            return
        for index in found.chunks:
            waiting = self._by_chunk.get(index)
            if waiting is not None:
                waiting.discard(found.id)
                if not waiting:
                    del self._by_chunk[index]

    def news(self, index: int, *, copies: int, lacks: Callable[[str], bool]) -> None:
        """Chunk ``index`` gained ``copies`` copies (or a pull of it started: 1); wake who waits for it."""
        for ticket in self._by_chunk.pop(index, ()):
            self._wake(ticket)
        budget = self.per_copy * max(1, copies)
        chosen: list[int] = []
        for scanned, (ticket, node) in enumerate(self._any.items()):
            if len(chosen) >= budget or scanned >= SCAN_FACTOR * budget:
                break
            if lacks(node):
                chosen.append(ticket)
        for ticket in chosen:
            self._wake(ticket)

    def _wake(self, ticket: int) -> None:
        found = self._tickets.get(ticket)
        if found is not None:
            self._woken.append(ticket)
            self._unlink(found)

    def take_woken(self) -> list[int]:
        """The watches woken since the last call (each once)."""
        woken, self._woken = self._woken, []
        return woken

    def due(self, *, now: float) -> list[int]:
        """Parked watches whose deadline has passed."""
        return [t.id for t in self._tickets.values() if t.deadline <= now]

    def get(self, ticket: int) -> Ticket | None:
        return self._tickets.get(ticket)
