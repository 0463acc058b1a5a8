"""Fluid model of full-duplex links: concurrent chunk transfers sharing upload and download capacity.

Owns the transfers in progress and the clock. Rules:

- Every endpoint has an upload capacity and a download capacity (bytes/s), independent of
  each other (full duplex). A transfer's rate is the smaller of its sender's share
  (upload capacity / uploads in progress there) and its receiver's share (download
  capacity / downloads in progress there).
- Rates change only when a transfer starts or ends at one of its endpoints, so a start or an
  end reprices only the transfers of those two endpoints: O(slots) work per event, whatever N.
- Completions live in one heap; a repriced transfer pushes a new entry and bumps its version,
  and stale entries are skipped when popped (lazy deletion).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

_EPSILON = 1e-9


@dataclass(eq=False)
class Transfer:
    """One chunk moving from ``sender`` to ``receiver`` (mutable, owned by :class:`Network`)."""

    sender: int
    receiver: int
    chunk: int
    size: int
    remaining: float
    rate: float = 0.0
    since: float = 0.0
    version: int = 0
    active: bool = True


class Network:
    """Endpoints with capacities and the transfers between them."""

    def __init__(self, *, up: Sequence[float], down: Sequence[float]) -> None:
        self.up = list(up)
        self.down = list(down)
        self.uploads: list[list[Transfer]] = [[] for _ in self.up]
        self.downloads: list[list[Transfer]] = [[] for _ in self.up]
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Transfer]] = []
        self._seq = itertools.count()
        self.started = 0

    def start(self, *, sender: int, receiver: int, chunk: int, size: int) -> Transfer:
        """Begin a transfer now and reprice the transfers it now shares links with."""
        transfer = Transfer(sender=sender, receiver=receiver, chunk=chunk, size=size, remaining=float(size))
        transfer.since = self.now
        self.uploads[sender].append(transfer)
        self.downloads[receiver].append(transfer)
        self.started += 1
        self._reprice(sender, receiver)
        return transfer

    def cancel(self, transfer: Transfer) -> None:
        """Stop a transfer (its bytes so far are lost) and reprice its neighbours."""
        if transfer.active:
            self._remove(transfer)

    def next_time(self) -> float:
        """When the next transfer completes (inf when none is in progress)."""
        heap = self._heap
        while heap and (not heap[0][3].active or heap[0][2] != heap[0][3].version):
            heapq.heappop(heap)
        return heap[0][0] if heap else float("inf")

    def pop(self) -> Transfer:
        """Advance the clock to the next completion and return that finished transfer."""
        self.next_time()
        when, _, _, transfer = heapq.heappop(self._heap)
        self.now = max(self.now, when)
        self._remove(transfer)
        return transfer

    def advance(self, when: float) -> None:
        """Move the clock forward to ``when`` (no completion happens before it)."""
        self.now = max(self.now, when)

    def _remove(self, transfer: Transfer) -> None:
        transfer.active = False
        self.uploads[transfer.sender].remove(transfer)
        self.downloads[transfer.receiver].remove(transfer)
        self._reprice(transfer.sender, transfer.receiver)

    def _reprice(self, sender: int, receiver: int) -> None:
        for transfer in self.uploads[sender]:
            self._set_rate(transfer)
        for transfer in self.downloads[receiver]:
            if transfer.sender != sender:
                self._set_rate(transfer)

    def _set_rate(self, transfer: Transfer) -> None:
        rate = min(
            self.up[transfer.sender] / len(self.uploads[transfer.sender]),
            self.down[transfer.receiver] / len(self.downloads[transfer.receiver]),
        )
        if transfer.version and abs(rate - transfer.rate) <= _EPSILON * rate:
            return
        now = self.now
        transfer.remaining = max(0.0, transfer.remaining - transfer.rate * (now - transfer.since))
        transfer.since = now
        transfer.rate = rate
        transfer.version += 1
        done = now + transfer.remaining / rate if rate > 0 else float("inf")
        heapq.heappush(self._heap, (done, next(self._seq), transfer.version, transfer))
