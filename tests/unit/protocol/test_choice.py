"""Chunk and peer choice policies."""

from __future__ import annotations

import random
from collections import Counter

from ringseed.protocol import choice


def test_rarest_first_prefers_fewest_holders_and_skips_unheld() -> None:
    avail = [0, 5, 1, 3, 1]
    picked = choice.rarest_first(candidates=range(5), availability=avail, count=3, rng=random.Random(0))
    assert set(picked[:2]) == {2, 4} and picked[2] == 3


def test_rarest_first_spreads_ties() -> None:
    avail = [1] * 16
    firsts = Counter(
        choice.rarest_first(candidates=range(16), availability=avail, count=1, rng=random.Random(s))[0]
        for s in range(200)
    )
    assert len(firsts) > 8


def test_endgame_only_when_everything_missing_is_in_flight() -> None:
    assert choice.endgame(missing={1, 2}, in_flight={1: 1}, free_slots=2) == []
    assert choice.endgame(missing={1, 2}, in_flight={1: 1, 2: 2}, free_slots=2) == [1]


def test_least_loaded_orders_by_load_and_avoids() -> None:
    hs = [choice.Holder("a", "ua", 3), choice.Holder("b", "ub", 0), choice.Holder("c", "uc", 1)]
    assert [h.name for h in choice.least_loaded(hs, avoid={"c"}, rng=random.Random(0))] == ["b", "a"]
