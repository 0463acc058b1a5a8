"""Long-polls: deadlines, who is woken by which news, and a swarm of waiters woken by supply, not all at once."""

from __future__ import annotations

import pytest

from ringseed.protocol import manifest, tracker, watches

MiB = 1 << 20


def digest(index: int) -> str:
    return format(index, "064x")


def test_deadlines_are_clamped_and_come_due() -> None:
    w = watches.Watches()
    long = w.add(node="a", chunks=[1], now=10.0, wait=1e9)
    now = w.add(node="b", chunks=None, now=10.0, wait=-3)
    short = w.add(node="c", chunks=[2], now=10.0, wait=2.5)
    assert long.deadline == 10.0 + watches.MAX_WAIT and now.deadline == 10.0 and short.deadline == 12.5
    assert w.due(now=12.4) == [now.id]
    assert sorted(w.due(now=12.5)) == sorted([now.id, short.id])
    w.remove(now.id)
    w.remove(short.id)
    assert w.due(now=1e6) == [long.id] and len(w) == 1
    with pytest.raises(ValueError, match="at most"):
        w.add(node="a", chunks=range(watches.MAX_CHUNKS + 1), now=0, wait=1)


def test_news_wakes_watchers_of_the_chunk_and_a_few_of_any_chunk_per_copy() -> None:
    w = watches.Watches(per_copy=2)
    mine = w.add(node="x", chunks=[7, 8], now=0, wait=5)
    other = w.add(node="y", chunks=[9], now=0, wait=5)
    anyone = [w.add(node=f"n{i}", chunks=None, now=0, wait=5) for i in range(10)]
    holders = {"n0", "n2"}  # they hold chunk 7 already: never woken for it
    w.news(7, copies=1, lacks=lambda node: node not in holders)
    assert w.take_woken() == [mine.id, anyone[1].id, anyone[3].id]  # per_copy x 1, oldest first
    assert w.take_woken() == []
    w.news(7, copies=2, lacks=lambda node: node not in holders)  # two more copies: four more woken
    assert w.take_woken() == [a.id for a in (anyone[4], anyone[5], anyone[6], anyone[7])]
    w.news(8, copies=1, lacks=lambda node: True)  # x was woken already (once only)
    assert mine.id not in w.take_woken()
    assert w.get(other.id) is not None


def swarm(nodes: int = 4) -> tracker.Tracker:
    t = tracker.Tracker(epoch="e", offline_after=10.0)
    for i in range(nodes):
        t.register(node=f"n{i}", url=f"http://n{i}", session="s", now=0.0)
    t.publish(node="n0", layout=manifest.Layout.build([("m", 8 * MiB, 0o644)], chunk_size=MiB), hashes=None, now=0.0)
    return t


def test_a_watch_answers_at_once_when_news_came_since_the_nodes_version() -> None:
    t = swarm()
    version = t.heartbeat(node="n3", now=0.1, epoch="e").view.version
    t.heartbeat(node="n0", now=0.2, chunks=[(0, digest(0))])
    assert t.watch(node="n3", chunks=[0], since=version, epoch="e", now=0.3, wait=5) is None
    assert t.watch(node="n3", chunks=None, since=version, epoch="e", now=0.3, wait=5) is None
    assert t.watch(node="n3", chunks=None, since=None, epoch="e", now=0.3, wait=5) is None  # nothing absorbed yet
    assert t.watch(node="n3", chunks=[1], since=version, epoch="e", now=0.3, wait=0) is None  # no wait: answer
    assert t.watch(node="n3", chunks=[1], since=version, epoch="e", now=0.3, wait=5) is not None


def test_a_parked_watch_is_woken_by_a_new_copy_or_a_pull_not_by_more_of_the_same() -> None:
    t = swarm(5)
    t.heartbeat(node="n0", now=0.1, chunks=[(0, digest(0))])
    t.heartbeat(node="n1", now=0.1, chunks=[(0, None)])
    version = t.heartbeat(node="n4", now=0.2, epoch="e").view.version
    waiting = t.watch(node="n4", chunks=[0, 1], since=version, epoch="e", now=0.3, wait=5)
    assert waiting is not None
    t.heartbeat(node="n2", now=0.4, chunks=[(0, None)])  # 3 holders: still level 2, nothing new to fetch
    assert t.watches.take_woken() == []
    t.heartbeat(node="n3", now=0.5, chunks=[(0, None)])  # 4 holders: level 4
    assert t.watches.take_woken() == [waiting.id]
    t.unwatch(waiting.id)
    view = t.view(node="n4", since=version, epoch="e", now=0.6)
    assert view.levels == {4: [0]}
    pull = t.watch(node="n4", chunks=[1], since=view.version, epoch="e", now=0.7, wait=5)
    assert pull is not None
    assert t.claim_origin(node="n0", count=1, now=0.8) == [1]  # a pull of 1 starts: it can be streamed
    assert t.watches.take_woken() == [pull.id]


def test_watching_too_many_or_unknown_chunks_is_refused() -> None:
    t = swarm()
    with pytest.raises(tracker.TrackerError, match="at most"):
        t.watch(node="n1", chunks=range(watches.MAX_CHUNKS + 1), since=0, epoch="e", now=0.1, wait=1)
    with pytest.raises(tracker.TrackerError, match="out of range"):
        t.watch(node="n1", chunks=[8], since=0, epoch="e", now=0.1, wait=1)
    with pytest.raises(tracker.UnknownNode):
        t.watch(node="ghost", chunks=None, since=0, epoch="e", now=0.1, wait=1)
