"""Heartbeat replies carry what changed since the node's version: levels, hashes, pulls; snapshots only when needed."""

from __future__ import annotations

import json

import pytest

from ringseed.protocol import manifest, tracker, tracker_log

MiB = 1 << 20


def digest(index: int) -> str:
    return format(index, "064x")


def swarm(nodes: int, *, chunks: int = 8, replies: tracker_log.Replies = tracker_log.Replies.DELTA) -> tracker.Tracker:
    t = tracker.Tracker(epoch="e", offline_after=10.0, replies=replies)
    for i in range(nodes):
        t.register(node=f"n{i}", url=f"http://n{i}", session="s", now=0.0)
    layout = manifest.Layout.build([("m.bin", chunks * MiB, 0o644)], chunk_size=MiB)
    t.publish(node="n0", layout=layout, hashes=None, now=0.0)
    return t


class Node:
    """A node's copy of the shared view, kept the way an agent keeps it from replies."""

    def __init__(self, t: tracker.Tracker, name: str) -> None:
        self.t, self.name = t, name
        self.since: int | None = None
        self.availability: list[int] = []
        self.hashes: dict[int, str] = {}
        self.pulling: set[int] = set()
        self.views: list[tracker.View] = []

    def beat(self, now: float, **kwargs: object) -> tracker.View:
        view = self.t.heartbeat(node=self.name, now=now, since=self.since, epoch="e", **kwargs).view  # type: ignore[arg-type]
        self.absorb(view)
        return view

    def absorb(self, view: tracker.View) -> None:
        self.views.append(view)
        self.since = view.version
        if view.full:
            assert view.availability is not None
            self.availability, self.pulling = list(view.availability), set(view.pulling)
        else:
            if view.availability is not None:
                self.availability = list(view.availability)
            for level, indices in view.levels.items():
                for index in indices:
                    self.availability[index] = level
            self.pulling = (self.pulling | set(view.pulling)) - set(view.pulling_stopped)
        self.hashes.update(view.hashes)


def test_levels_change_at_powers_of_two_and_a_node_hears_only_changes() -> None:
    t = swarm(9)
    watcher = Node(t, "n8")
    first = watcher.beat(0.1)
    assert first.full and first.availability == [0] * 8  # first contact: a snapshot
    t.heartbeat(node="n0", now=0.2, chunks=[(0, digest(0))])
    view = watcher.beat(0.3)
    assert not view.full and view.levels == {1: [0]} and view.hashes == {0: digest(0)}
    for name in ("n1", "n2"):  # counts 2 and 3: the level goes to 2 once
        t.heartbeat(node=name, now=0.4, chunks=[(0, None)])
    assert watcher.beat(0.5).levels == {2: [0]}
    assert watcher.beat(0.6) == tracker.View(version=watcher.since)  # nothing changed: nothing told
    t.heartbeat(node="n3", now=0.7, chunks=[(0, None)])  # 4 holders
    assert watcher.beat(0.8).levels == {4: [0]}
    t.heartbeat(node="n4", now=0.9, chunks=[(0, None)])  # 5: still level 4
    assert watcher.beat(1.0).levels == {}
    assert watcher.availability[0] == 4 and t.availability()[0] == 5


def test_a_node_is_not_told_about_chunks_it_holds_until_it_drops_one() -> None:
    t = swarm(4)
    t.heartbeat(node="n0", now=0.1, chunks=[(i, digest(i)) for i in range(2)])
    holder = Node(t, "n3")
    holder.beat(0.2, chunks=[(0, None)])
    t.heartbeat(node="n1", now=0.3, chunks=[(0, None), (1, None)])
    view = holder.beat(0.4)
    assert view.levels == {2: [1]}  # chunk 0 went to 2 holders as well, but n3 holds it: not told
    view = holder.beat(0.5, dropped=[0])  # the level of 0 did not change with the drop (3 -> 2) ...
    assert view.levels == {2: [0]}  # ... but n3 heard nothing of it while it held it: told now
    assert holder.availability[:2] == [2, 2]


def test_replies_cost_changes_not_chunks() -> None:
    t = swarm(40, chunks=4096)
    t.heartbeat(node="n0", now=0.1, chunks=[(i, digest(i)) for i in range(4096)])
    nodes = [Node(t, f"n{i}") for i in range(1, 40)]
    for node in nodes:
        node.beat(0.2)  # snapshots
    for step, node in enumerate(nodes):  # every node fetches a few chunks from n0, heartbeats follow
        node.beat(0.3 + step * 0.001, chunks=[(i, None, "n0") for i in range(step * 8, step * 8 + 8)])
    quiet = Node(t, "n39")
    quiet.since = nodes[-1].since
    steady = [node.beat(1.0) for node in nodes[:5]]
    for view in steady:
        assert not view.full and sum(len(v) for v in view.levels.values()) <= 40 * 8
        assert len(json.dumps(view.levels)) < 4096  # the whole vector would be 4,096 entries
    assert quiet.beat(1.1) == tracker.View(version=quiet.since)


def test_snapshots_for_unknown_old_future_or_foreign_versions() -> None:
    t = swarm(3)
    node = Node(t, "n2")
    node.beat(0.1)
    current = node.since
    assert current is not None
    assert t.heartbeat(node="n2", now=0.2, since=current, epoch="other").view.full
    assert t.heartbeat(node="n2", now=0.2, since=current + 5, epoch="e").view.full
    assert t.heartbeat(node="n2", now=0.2, since=None, epoch="e").view.full
    t.log.limit = 4
    for i in range(8):
        t.heartbeat(node="n0", now=0.3, chunks=[(i, digest(i))])
    old = t.heartbeat(node="n2", now=0.4, since=current, epoch="e").view
    assert old.full and old.hashes == {i: digest(i) for i in range(8)}  # too old: a snapshot, every hash


def test_hashes_stay_deltas_when_the_availability_log_wrapped() -> None:
    t = swarm(3)
    node = Node(t, "n2")
    t.heartbeat(node="n0", now=0.1, chunks=[(0, digest(0))])
    node.beat(0.2)
    t.log.limit = 2
    t.heartbeat(node="n0", now=0.3, chunks=[(i, digest(i)) for i in range(1, 6)])
    view = node.beat(0.4)
    assert view.full and view.hashes == {i: digest(i) for i in range(1, 6)}  # not hash 0 again


def test_pulls_started_and_ended_are_told_as_changes() -> None:
    t = swarm(3)
    node = Node(t, "n2")
    node.beat(0.1)
    assert t.claim_origin(node="n0", count=2, now=0.2) == [0, 1]
    assert node.beat(0.3).pulling == [0, 1] and node.pulling == {0, 1}
    t.heartbeat(node="n0", now=0.4, chunks=[(0, digest(0))])
    view = node.beat(0.5)
    assert view.pulling == [] and view.pulling_stopped == [0] and node.pulling == {1}


def test_exact_mode_sends_the_whole_vector_whenever_a_count_changed() -> None:
    t = swarm(4, replies=tracker_log.Replies.FULL)
    node = Node(t, "n3")
    node.beat(0.1)
    t.heartbeat(node="n0", now=0.2, chunks=[(0, digest(0))])
    t.heartbeat(node="n1", now=0.3, chunks=[(0, None)])
    t.heartbeat(node="n2", now=0.4, chunks=[(0, None)])
    view = node.beat(0.5)
    assert not view.full and view.availability == [3, 0, 0, 0, 0, 0, 0, 0] and view.levels == {}
    assert node.beat(0.6).availability is None  # nothing changed


def test_a_new_revision_sends_everyone_a_snapshot() -> None:
    from ringseed.protocol import revision

    t = swarm(3)
    node = Node(t, "n2")
    t.heartbeat(node="n0", now=0.1, chunks=[(0, digest(0))])
    node.beat(0.2)
    old = t.source
    assert old is not None
    new = revision.Revision(layout=old.layout, tags=("etag:x",))
    t.publish(node="n0", layout=new.layout, hashes=None, now=0.3, source=new, replaces=old.id)
    view = t.heartbeat(node="n2", now=0.4, since=node.since, epoch="e", revision=new.id).view
    assert view.full and view.availability == [0] * 8 and view.hashes == {}


def test_the_log_names_each_changed_chunk_once_in_the_order_of_its_last_change() -> None:
    log = tracker_log.ChangeLog()
    for index in (3, 1, 3, 2, 3):
        log.add(tracker_log.AVAIL, index)
    assert log.since(tracker_log.AVAIL, 0) == [1, 2, 3]
    assert log.since(tracker_log.AVAIL, 2) == [2, 3]  # (chunk 1 changed last at version 2)
    assert log.since(tracker_log.AVAIL, 5) == []
    assert log.since(tracker_log.AVAIL, 6) is None  # newer than now


def test_a_pull_that_began_and_ended_since_the_nodes_version_is_not_told() -> None:
    t = swarm(3)
    node = Node(t, "n2")
    node.beat(0.1)
    assert t.claim_origin(node="n0", count=1, now=0.2) == [0]
    t.heartbeat(node="n0", now=0.3, chunks=[(0, digest(0))])
    view = node.beat(0.4)
    assert view.pulling == [] and view.pulling_stopped == []  # it never heard of that pull
    assert t.claim_origin(node="n0", count=1, now=0.5) == [1]
    assert node.beat(0.6).pulling == [1]
    t.heartbeat(node="n0", now=0.7, chunks=[(1, digest(1))])
    assert node.beat(0.8).pulling_stopped == [1]  # it did hear of this one


@pytest.mark.parametrize("wire", ["items", "runs"])
@pytest.mark.parametrize("replies", list(tracker_log.Replies))
def test_a_node_following_replies_always_equals_the_tracker(replies: tracker_log.Replies, wire: str) -> None:
    import random

    rng = random.Random(5)
    t = swarm(6, chunks=16, replies=replies)
    nodes = {f"n{i}": Node(t, f"n{i}") for i in range(6)}
    held: dict[str, set[int]] = {n: set() for n in nodes}
    ever: dict[str, set[int]] = {n: set() for n in nodes}  # an agent knows the hash of what it held
    now = 0.0
    for _ in range(600):
        now += 0.01
        name = rng.choice(list(nodes))
        index = rng.randrange(16)
        action = rng.random()
        if action < 0.1 and name in t.duty:
            t.claim_origin(node=name, count=2, now=now)
            nodes[name].beat(now)
        elif action < 0.55:
            if wire == "runs" and name not in t.duty:
                run = (index, rng.randrange(1, 4))
                nodes[name].beat(now, runs=[run])
                announced = list(range(index, min(16, index + run[1])))
            else:
                chunk = (index, digest(index) if name in t.duty else None)
                nodes[name].beat(now, chunks=[chunk])
                announced = [index]
            for i in announced:
                if t.holdings.holds(name, i):
                    held[name].add(i)
                    ever[name].add(i)
        elif action < 0.7 and held[name]:
            gone = rng.choice(sorted(held[name]))
            held[name].discard(gone)
            nodes[name].beat(now, dropped=[gone])
        else:
            nodes[name].beat(now)
        for other, node in nodes.items():
            node.beat(now)
            expected = [tracker_log.level(c) if replies is tracker_log.Replies.DELTA else c for c in t.availability()]
            mine = t.holdings.have_of(other)
            assert [a for i, a in enumerate(node.availability) if not mine[i]] == [
                a for i, a in enumerate(expected) if not mine[i]
            ]
            assert node.pulling == set(t.assigned)
            known = [(i, h) for i, h in enumerate(t.hashes) if h is not None and i not in ever[other]]
            assert all(node.hashes.get(i) == h for i, h in known)
