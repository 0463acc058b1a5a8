"""Holdings and the random set used by the simulator."""

from __future__ import annotations

import random

from ringseed.sim import state


def test_candidates_are_held_elsewhere_missing_here_and_not_in_flight() -> None:
    held = state.Holdings(nodes=2, chunks=6)
    for chunk in (0, 1, 2, 4):
        held.add(0, chunk)
    held.add(1, 0)
    assert held.candidates(1, busy={2}) == [1, 4]
    assert held.unheld(5, skip={3}) == [5]


def test_a_dead_holder_stops_counting() -> None:
    held = state.Holdings(nodes=2, chunks=2)
    assert held.add(0, 0) is True
    assert held.add(1, 0) is False
    held.drop(0)
    assert held.avail == [1, 0]
    assert held.sample_holders(0, limit=4, alive=[False, True], rng=random.Random(1)) == [1]


def test_random_set_take_removes_what_it_returns() -> None:
    items = state.RandomSet()
    items.extend(range(10))
    items.discard(3)
    taken = items.take(4, random.Random(2))
    assert len(taken) == 4 and 3 not in taken
    rest = items.drain()
    assert sorted(rest + taken) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert len(items) == 0
