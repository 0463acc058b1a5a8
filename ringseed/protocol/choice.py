"""Chunk and peer choice: the pure policies an agent (and the simulator) uses to pick work.

Owns three decisions, all pure (no I/O, no clock; randomness comes in as a ``random.Random``):

- :func:`rarest_first` picks which missing chunks to fetch next: among the chunks the caller
  may fetch (hash known, not held, not in flight), those with the fewest holders first, ties
  broken at random so that peers fetching at the same time spread over different chunks.
  Chunks nobody holds (availability 0) are never picked: they come from the origin duty.
- :func:`endgame` picks duplicate requests for the last chunks: when every missing chunk is
  already in flight and download slots are free, the in-flight chunks with the fewest
  outstanding requests are requested again from another holder (first answer wins).
- :func:`least_loaded` orders candidate holders of a chunk: fewest active uploads first,
  ties at random; peers in ``avoid`` are left out.

Cost: ``rarest_first`` is O(len(candidates)) per call (one pass plus a small heap), never
O(nodes x chunks), so the simulator can call it per node event at 10,000 nodes.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Holder:
    """A peer that holds a chunk, as the tracker reports it."""

    name: str
    url: str
    load: int


def rarest_first(
    *,
    candidates: Iterable[int],
    availability: Sequence[int],
    count: int,
    rng: random.Random,
) -> list[int]:
    """Up to ``count`` chunks from ``candidates``, rarest (fewest holders, but at least one) first."""
    if count <= 0:
        return []
    keyed: list[tuple[int, float, int]] = []
    for index in candidates:
        have = availability[index] if index < len(availability) else 0
        if have > 0:
            keyed.append((have, rng.random(), index))
    return [index for _, _, index in heapq.nsmallest(count, keyed)]


def endgame(
    *,
    missing: Collection[int],
    in_flight: Mapping[int, int],
    free_slots: int,
    max_duplicates: int = 2,
) -> list[int]:
    """Chunks to request once more: only when every missing chunk is in flight.

    ``in_flight`` maps a chunk to its number of outstanding requests; a chunk is never asked
    for more than ``max_duplicates`` times at once.
    """
    if free_slots <= 0 or not missing or any(index not in in_flight for index in missing):
        return []
    order = sorted((in_flight[index], index) for index in missing if in_flight[index] < max_duplicates)
    return [index for _, index in order[:free_slots]]


def least_loaded(
    holders: Iterable[Holder],
    *,
    avoid: Collection[str] = (),
    rng: random.Random,
) -> list[Holder]:
    """Holders not in ``avoid``, fewest active uploads first, ties in random order."""
    keyed = [(h.load, rng.random(), h) for h in holders if h.name not in avoid]
    keyed.sort(key=lambda item: (item[0], item[1]))
    return [h for _, _, h in keyed]
