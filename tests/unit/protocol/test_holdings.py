"""Holdings: compact per-node bytes, holder lists that give way to probing, sampling that stays O(1)."""

from __future__ import annotations

import random

import pytest

from ringseed.protocol import holdings


def test_add_remove_leave_and_counts() -> None:
    h = holdings.Holdings()
    h.reset(8)
    for name in ("a", "b", "c"):
        h.join(name)
    assert h.add("a", 3) and not h.add("a", 3)  # once
    h.add("b", 3)
    h.add("b", 5)
    assert h.count(3) == 2 and h.holders(3) == {"a", "b"} and h.held("b") == [3, 5] and h.held_count("b") == 2
    assert h.remove("a", 3) and not h.remove("a", 3) and not h.remove("c", 3)
    assert h.leave("b") == [3, 5] and h.count(3) == 0 and h.count(5) == 0 and h.holders(5) == set()
    assert not h.holds("b", 3) and h.held_count("b") == 0
    h.reset(4)  # a new layout: nothing held, members kept
    assert h.held("c") == [] and h.have_of("c") == bytearray(4)


def test_dense_chunks_are_probed_and_get_their_list_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holdings, "SPARSE_MAX", 8)
    h = holdings.Holdings()
    h.reset(2)
    names = [f"n{i}" for i in range(40)]
    for name in names:
        h.join(name)
    for name in names[:20]:
        h.add(name, 0)
    assert h.holders(0) == set(names[:20])  # dense now: found by a pass over the nodes
    rng = random.Random(3)
    drawn = h.sample(0, k=5, rng=rng, accept=lambda n: True)
    assert len(drawn) == 5 and len(set(drawn)) == 5 and set(drawn) <= set(names[:20])
    assert all(n in ("n1", "n2") for n in h.sample(0, k=5, rng=rng, accept=lambda n: n in ("n1", "n2")))
    for name in names[:17]:  # down to 3 holders: below SPARSE_MAX / 2, listed again
        h.remove(name, 0)
    assert h.holders(0) == set(names[17:20])
    assert sorted(h.sample(0, k=5, rng=rng, accept=lambda n: True)) == names[17:20]


def test_sampling_never_costs_more_probes_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holdings, "SPARSE_MAX", 4)
    monkeypatch.setattr(holdings, "MAX_PROBES", 50)
    h = holdings.Holdings()
    h.reset(1)
    for i in range(10_000):
        h.join(f"n{i}")
    for i in range(0, 10_000, 100):  # 100 holders of 10,000 nodes: dense, 1 probe in 100 hits
        h.add(f"n{i}", 0)
    rng_draws = 0

    class Counting(random.Random):
        def random(self) -> float:
            nonlocal rng_draws
            rng_draws += 1
            return super().random()

    found = h.sample(0, k=16, rng=Counting(2), accept=lambda n: True)
    assert rng_draws <= 50 and all(h.holds(n, 0) for n in found)


def test_memory_per_node_is_a_byte_per_chunk() -> None:
    h = holdings.Holdings()
    h.reset(7451)
    h.join("a")
    assert len(h.have_of("a")) == 7451
