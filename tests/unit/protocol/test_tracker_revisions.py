"""The tracker and source revisions without sockets (fake clock): confirmation, replacement, refusals."""

from __future__ import annotations

import pytest

from ringseed.protocol import manifest, revision, tracker

MiB = 1 << 20
H = "ab" * 32


def rev(tag: str = "t1", size: int = 4 * MiB - 7) -> revision.Revision:
    return revision.Revision.of_listing([("a.bin", size, 0o644, tag)], chunk_size=MiB)


def cached_swarm(old: revision.Revision) -> tracker.Tracker:
    """A fresh tracker whose nodes bring copies cached under ``old`` (n0 registers first: duty)."""
    t = tracker.Tracker(epoch="e1", offline_after=10.0, claim_grace=0.0)
    for i in range(3):
        chunks = {c: H for c in range(old.layout.chunk_count)}
        t.register(
            node=f"n{i}", url=f"http://n{i}", session="s", now=0.1 * i, layout=old.layout, source=old, chunks=chunks
        )
    return t


def verify(t: tracker.Tracker, node: str, now: float) -> None:
    assert t.digest is not None
    t.heartbeat(node=node, now=now, verified_digest=t.digest, revision=t.revision)


def test_cached_copies_count_as_verified_only_once_the_duty_holder_confirmed_the_revision() -> None:
    old = rev()
    t = cached_swarm(old)
    verify(t, "n1", now=1.0)
    status = t.status(now=1.0)
    assert status["revision"] == old.id and not status["revision_confirmed"]
    assert status["nodes"]["n1"]["complete"] and not status["nodes"]["n1"]["verified"]
    assert t.claim_origin(node="n0", count=4, now=1.0) == []  # nothing pulled for a revision maybe stale
    t.publish(node="n1", layout=old.layout, hashes=None, now=1.1, source=old)  # not on duty: no confirmation
    assert not t.confirmed
    t.publish(node="n0", layout=old.layout, hashes=None, now=1.2, source=old)  # the duty holder listed the same
    assert t.status(now=1.3)["nodes"]["n1"]["verified"] and t.status(now=1.3)["revision_confirmed"]


def test_a_new_revision_from_the_duty_holder_replaces_the_old_one_and_its_holdings() -> None:
    old, new = rev(), rev(tag="t2")
    t = cached_swarm(old)
    with pytest.raises(tracker.Conflict, match="only the node on origin duty"):
        t.publish(node="n1", layout=new.layout, hashes=None, now=1.0, source=new, replaces=old.id)
    with pytest.raises(tracker.Conflict, match="must name it in 'replaces'"):
        t.publish(node="n0", layout=new.layout, hashes=None, now=1.0, source=new, replaces=None)
    t.publish(node="n0", layout=new.layout, hashes=None, now=1.0, source=new, replaces=old.id)
    assert t.source == new and t.confirmed and t.availability() == [0, 0, 0, 0] and t.hashes == [None] * 4
    assert t.claim_origin(node="n0", count=2, now=1.1) == [0, 1]
    # A node still on the old revision: its announcements are ignored and it learns nothing but the revision.
    stale = t.heartbeat(node="n1", now=1.2, chunks=[(2, None)], revision=old.id, verified_digest=None)
    assert stale.revision == new.id and stale.view == tracker.View(version=-1)  # nothing, not even a version
    assert t.availability()[2] == 0 and t.status(now=1.2)["nodes"]["n1"]["revision"] == old.id
    # It moves over and announces what it reused once the hashes are known.
    t.heartbeat(node="n0", now=1.3, chunks=[(0, H), (1, H)], revision=new.id)
    moved = t.heartbeat(node="n1", now=1.4, revision=new.id, since=None, epoch="e1")
    assert moved.view.full and moved.view.hashes == {0: H, 1: H}
    t.heartbeat(node="n1", now=1.5, chunks=[(0, None)], revision=new.id)
    assert t.availability()[0] == 2


def test_registering_with_another_revision_rejects_every_chunk() -> None:
    old, new = rev(), rev(tag="t2")
    t = tracker.Tracker(epoch="e1", offline_after=10.0)
    t.register(node="n0", url="u0", session="s", now=0.0)
    t.publish(node="n0", layout=new.layout, hashes=None, now=0.1, source=new)
    rejected = t.register(node="n1", url="u1", session="s", now=0.2, layout=old.layout, source=old, chunks={0: H})
    assert rejected == [0] and t.availability()[0] == 0 and t.revision == new.id


def test_a_different_layout_without_duty_is_still_a_conflict() -> None:
    t = cached_swarm(rev())
    other = manifest.Layout.build([("b.bin", 3 * MiB, 0o644)], chunk_size=MiB)
    with pytest.raises(tracker.Conflict):
        t.publish(node="n2", layout=other, hashes=None, now=1.0)


def test_a_node_that_cannot_pull_hands_origin_duty_to_one_that_can() -> None:
    t = tracker.Tracker(epoch="e1", offline_after=10.0)
    for i in range(3):
        t.register(node=f"n{i}", url=f"http://n{i}", session="s", now=0.1 * i)
    t.publish(node="n0", layout=rev().layout, hashes=None, now=0.5, source=rev())
    assert t.duty == ["n0"] and t.claim_origin(node="n0", count=2, now=1.0) == [0, 1]
    full = tracker.Problem(reason="DiskFull", message="staging is full")
    t.heartbeat(node="n0", now=1.1, problem=full)
    assert t.duty == ["n1"] and "n0" not in t.assigned.values()  # its assignments went with it
    for name in ("n1", "n2"):
        t.heartbeat(node=name, now=1.2, problem=tracker.Problem(reason="OriginError", message="403"))
    assert len(t.duty) == 1  # nobody fit: a seat is still taken rather than left empty
    t.heartbeat(node="n2", now=1.3, problem=None)
    assert t.duty == ["n2"]
