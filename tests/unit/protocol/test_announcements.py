"""Announcements as runs: the agent's packing, and the tracker holding runs exactly as items."""

from __future__ import annotations

import random

from ringseed.protocol import announcements, manifest, tracker, trust

MiB = 1 << 20


def digest(index: int) -> str:
    return format(index, "064x")


def swarm(nodes: int = 4, chunks: int = 32) -> tracker.Tracker:
    t = tracker.Tracker(epoch="e", offline_after=10.0, judge=trust.Trust())
    for i in range(nodes):
        t.register(node=f"n{i}", url=f"http://n{i}", session="s", now=0.0)
    layout = manifest.Layout.build([("m.bin", chunks * MiB - 5, 0o644)], chunk_size=MiB)
    t.publish(node="n0", layout=layout, hashes=None, now=0.0)
    return t


def test_pack_keeps_hashed_items_and_runs_the_rest_naming_each_source_once() -> None:
    batch = [(7, None, "a"), (5, None, "a"), (6, None, None), (9, "ff" * 32, None), (10, None, "b"), (5, None, "c")]
    items, runs, sources = announcements.pack(batch)
    assert items == [[9, "ff" * 32, None]]
    assert runs == [[5, 3], [10, 1]]
    assert sources == [[7, "a"], [10, "b"], [5, "c"]]
    assert announcements.pack([(i, None, f"s{i}") for i in range(40)], max_sources=4)[2] == [
        [i, f"s{i}"] for i in range(4)
    ]
    assert announcements.runs_of([]) == []


def test_expand_reads_runs_back_and_names_a_bad_one() -> None:
    import pytest

    assert announcements.expand(announcements.runs_of([9, 3, 4, 5, 11, 10])) == [3, 4, 5, 9, 10, 11]
    assert announcements.expand([]) == []
    for bad in ({"0": 1}, [[0]], [[0, 0]], [[-1, 2]], [["0", 1]], [[0, True]], [[0, 1 << 22]]):
        with pytest.raises(ValueError, match=r"pulling"):
            announcements.expand(bad, label="pulling")


def test_runs_hold_exactly_as_items_do() -> None:
    """Two trackers, one told chunk by chunk and one told in runs: the same holdings, counts,
    levels, bytes and pull completions, whatever the order and overlaps."""
    rng = random.Random(3)
    told, ran = swarm(), swarm()
    for t in (told, ran):
        t.heartbeat(node="n0", now=0.1, chunks=[(i, digest(i)) for i in range(24)])
        assert t.claim_origin(node="n0", count=4, now=0.2) == [24, 25, 26, 27]
        t.heartbeat(node="n0", now=0.3, chunks=[(i, digest(i)) for i in range(24, 30)])
    for step in range(200):
        node = f"n{rng.randrange(1, 4)}"
        first = rng.randrange(0, 32)
        batch = list(range(first, min(32, first + rng.randrange(1, 6))))
        now = 1.0 + step / 100
        a = told.heartbeat(node=node, now=now, chunks=[(i, None) for i in batch])
        b = ran.heartbeat(node=node, now=now, runs=announcements.runs_of(batch))
        assert sorted(a.rejected) == sorted(b.rejected) == [i for i in batch if i >= 30]
        if rng.random() < 0.2:
            gone = rng.randrange(0, 32)
            told.heartbeat(node=node, now=now, dropped=[gone])
            ran.heartbeat(node=node, now=now, dropped=[gone])
    assert told.availability() == ran.availability()
    assert told._level == ran._level
    for name in told.nodes:
        assert told.holdings.held(name) == ran.holdings.held(name)
        assert told.nodes[name].have_bytes == ran.nodes[name].have_bytes
    assert told.assigned == ran.assigned
    assert ran.nodes["n1"].have_bytes == sum(
        ran.layout.chunk_length(i) for i in ran.holdings.held("n1") if ran.layout is not None
    )


def test_a_run_is_refused_where_hashes_are_unknown_or_out_of_range() -> None:
    t = swarm()
    t.heartbeat(node="n0", now=0.1, chunks=[(i, digest(i)) for i in range(4)])
    reply = t.heartbeat(node="n1", now=0.2, runs=[(2, 4), (40, 2)])
    assert reply.rejected == [4, 5, 40, 41]
    assert t.holdings.held("n1") == [2, 3]
    assert t.availability()[:6] == [1, 1, 2, 2, 0, 0]


def test_sources_vouch_for_holders_of_chunks_the_node_holds_only() -> None:
    t = swarm()
    t.heartbeat(node="n0", now=0.1, chunks=[(i, digest(i)) for i in range(4)])
    t.heartbeat(node="n1", now=0.2, runs=[(0, 2)], sources=[(0, "n0"), (1, "n2")])
    assert t.trust.vouchers("n0") == 1  # n0 holds chunk 0
    assert t.trust.vouchers("n2") == 0  # n2 holds nothing: no evidence
    t.heartbeat(node="n2", now=0.3, runs=[(0, 1)], sources=[(3, "n0")])
    assert t.trust.vouchers("n0") == 1  # n2 does not hold chunk 3: no vouch


def test_a_run_clears_what_it_announces_from_the_suspect_list() -> None:
    t = swarm()
    t.heartbeat(node="n0", now=0.1, chunks=[(i, digest(i)) for i in range(4)])
    t.heartbeat(node="n1", now=0.2, runs=[(0, 4)])
    t.nodes["n1"].suspect.update({1, 3})  # (as the judge leaves it: told until announced again)
    assert t.heartbeat(node="n1", now=0.3, runs=[(1, 1)]).suspect == [3]
