"""Tracker policy without sockets: rarest first inputs, least loaded, purge, origin duty, completion."""

from __future__ import annotations

import random

import pytest

from ringseed.protocol import manifest, tracker

MiB = 1 << 20
H = "ab" * 32


def layout(chunks: int = 4) -> manifest.Layout:
    return manifest.Layout.build([("a.bin", chunks * MiB - 7, 0o644)], chunk_size=MiB)


def swarm(nodes: int = 3, *, seeders: int = 1, offline_after: float = 10.0) -> tracker.Tracker:
    t = tracker.Tracker(epoch="e1", offline_after=offline_after, seeders=seeders)
    for i in range(nodes):
        t.register(node=f"n{i}", url=f"http://n{i}", session=f"s{i}", now=float(i) * 0.01)
    t.publish(node="n0", layout=layout(), hashes=None, now=0.1)
    return t


def test_first_registered_gets_duty_and_its_hashes_are_accepted() -> None:
    t = swarm()
    reply = t.heartbeat(node="n0", now=1.0, chunks=[(0, H)])
    assert reply.origin_duty and reply.rejected == []
    assert t.availability()[0] == 1
    assert t.heartbeat(node="n1", now=1.0).view.hashes == {0: H}


def test_hash_claim_from_non_duty_node_is_refused() -> None:
    t = swarm()
    reply = t.heartbeat(node="n1", now=1.0, chunks=[(1, "cd" * 32)])
    assert reply.rejected == [1] and not reply.origin_duty
    assert t.hashes[1] is None and t.availability()[1] == 0


def test_conflicting_layout_and_hash_are_refused() -> None:
    t = swarm()
    other = manifest.Layout.build([("b.bin", 3 * MiB, 0o644)], chunk_size=MiB)
    with pytest.raises(tracker.Conflict):
        t.publish(node="n1", layout=other, hashes=None, now=1.0)
    t.publish(node="n1", layout=layout(), hashes=None, now=1.0)  # same layout: fine
    t.heartbeat(node="n0", now=1.0, chunks=[(0, H)])
    assert t.heartbeat(node="n0", now=1.1, chunks=[(0, "cd" * 32)]).rejected == [0]


def test_origin_claims_give_each_unheld_chunk_once() -> None:
    t = swarm(seeders=2)
    first = t.claim_origin(node="n0", count=2, now=1.0)
    second = t.claim_origin(node="n1", count=2, now=1.0)
    assert first == [0, 1] and second == [2, 3]
    assert t.claim_origin(node="n0", count=2, now=1.1) == [0, 1]  # open assignments repeated
    with pytest.raises(tracker.Forbidden):
        t.claim_origin(node="n2", count=1, now=1.0)


def test_duty_and_assignments_move_when_holder_goes_silent() -> None:
    t = swarm(offline_after=10.0)
    assert t.claim_origin(node="n0", count=2, now=1.0) == [0, 1]
    t.heartbeat(node="n0", now=2.0, chunks=[(0, H)])
    for name in ("n1", "n2"):
        t.heartbeat(node=name, now=11.0)
    assert t.purge(now=12.5) == ["n0"]
    assert t.duty == ["n1"]
    assert t.availability()[0] == 0  # the only copy died with n0
    assert t.claim_origin(node="n1", count=4, now=12.6) == [0, 1, 2, 3]
    assert t.status(now=12.6)["nodes"]["n0"]["online"] is False


def test_peers_are_least_loaded_online_and_unpenalised() -> None:
    t = swarm(nodes=4)
    t.heartbeat(node="n0", now=1.0, chunks=[(0, H)])
    t.heartbeat(node="n1", now=1.0, chunks=[(0, None)], load=3)
    t.heartbeat(node="n2", now=1.0, chunks=[(0, None)], load=1)
    rng = random.Random(1)
    assert [p.name for p in t.peers(chunk=0, node="n3", now=1.0, rng=rng)] == ["n0", "n2", "n1"]
    # each hand-out counts as load until the next heartbeat, so the next askers spread out
    firsts = {t.peers(chunk=0, node="n3", now=1.0, rng=rng)[0].name for _ in range(2)}
    assert firsts == {"n0", "n2"}
    t.report(reporter="n3", peer="n2", chunk=0, now=1.1)
    assert "n2" not in [p.name for p in t.peers(chunk=0, node="n3", now=1.2, rng=rng)]  # never to its reporter
    assert "n2" in [p.name for p in t.peers(chunk=0, node="n1", now=1.2, rng=rng)]  # one report removes no one
    assert t.availability()[0] == 3
    t.report(reporter="n1", peer="n2", chunk=0, now=1.3)  # a second, distinct reporter
    t.purge(now=1.3)  # the periodic pass judges
    assert "n2" not in [p.name for p in t.peers(chunk=0, node="n0", now=1.4, rng=rng)]
    assert t.availability()[0] == 2


def test_completion_and_verification_come_from_holdings_and_digest() -> None:
    t = swarm(nodes=2)
    t.heartbeat(node="n0", now=1.0, chunks=[(i, f"{i:02x}" * 32) for i in range(4)])
    t.heartbeat(node="n1", now=1.0, chunks=[(i, None) for i in range(3)])
    status = t.status(now=1.0)
    assert status["nodes"]["n0"]["complete"] and not status["nodes"]["n1"]["complete"]
    digest = status["manifest_digest"]
    assert digest is not None and status["nodes_ready"] == 0
    t.heartbeat(node="n0", now=1.1, verified_digest=digest)
    assert t.status(now=1.1)["nodes_ready"] == 1


def test_reregistration_after_restart_restores_hashes_and_holdings() -> None:
    t = tracker.Tracker(epoch="e2", offline_after=10.0)
    t.register(node="n1", url="u", session="s", now=0.0, layout=layout(), chunks={2: H})
    t.register(node="n2", url="u", session="s", now=0.0, layout=layout())
    assert t.hashes[2] == H and t.availability()[2] == 1
    reply = t.heartbeat(node="n2", now=0.5, since=7, epoch="old")
    assert reply.view.full and reply.view.hashes == {2: H}  # a version of another epoch gets a snapshot
    assert reply.view.availability == [0, 0, 1, 0]
    assert t.heartbeat(node="n1", now=0.5, since=7, epoch="old").view.hashes == {}  # it holds the chunk


def test_heartbeat_from_unknown_node_asks_to_register() -> None:
    t = swarm()
    with pytest.raises(tracker.UnknownNode):
        t.heartbeat(node="ghost", now=1.0)


def test_origin_bytes_survive_purge() -> None:
    t = swarm(offline_after=1.0)
    t.heartbeat(node="n0", now=0.5, counters={"origin_bytes": 1000})
    t.heartbeat(node="n1", now=5.0)
    t.purge(now=5.0)
    assert t.status(now=5.0)["bytes_from_origin"] == 1000


def test_availability_stays_equal_to_a_recount_through_joins_reports_and_purges() -> None:
    rng = random.Random(7)
    t = tracker.Tracker(epoch="e", offline_after=5.0)
    t.register(node="n0", url="u", session="s", now=0.0, layout=layout(8))
    now = 0.0
    for step in range(400):
        now += 0.1
        name = f"n{rng.randrange(6)}"
        if name not in t.nodes:
            t.register(node=name, url="u", session=f"s{step}", now=now)
        action = rng.random()
        if action < 0.6:
            index = rng.randrange(8)
            digest = t.hashes[index] or f"{index:02x}" * 32
            t.heartbeat(node=name, now=now, chunks=[(index, digest if name in t.duty else None)])
        elif action < 0.65:
            peer = f"n{rng.randrange(6)}"
            if peer != name:
                t.report(reporter=name, peer=peer, chunk=0, now=now)
        else:
            t.purge(now=now)
        recount = [sum(1 for n in t.holders_of(i) if n not in t.penalised) for i in range(8)]
        assert t.availability() == recount


def test_claims_wait_for_reregistration_after_a_restart_but_not_on_a_fresh_start() -> None:
    restarted = tracker.Tracker(epoch="e", offline_after=10.0, now=100.0, claim_grace=1.0)
    restarted.register(node="n0", url="u", session="s", now=100.0, layout=layout())
    assert restarted.claim_origin(node="n0", count=2, now=100.2) == []  # unconfirmed: maybe stale
    restarted.publish(node="n0", layout=layout(), hashes=None, now=100.3)  # duty took it from the source
    assert restarted.claim_origin(node="n0", count=2, now=100.5) == []  # the grace still runs
    assert restarted.claim_origin(node="n0", count=2, now=101.5) == [0, 1]
    fresh = tracker.Tracker(epoch="e", offline_after=10.0, now=100.0, claim_grace=1.0)
    fresh.register(node="n0", url="u", session="s", now=100.0)
    fresh.publish(node="n0", layout=layout(), hashes=None, now=100.1)
    assert fresh.claim_origin(node="n0", count=2, now=100.2) == [0, 1]


def test_chunks_being_pulled_are_listed_and_streamable_from_their_puller_only() -> None:
    t = swarm(offline_after=10.0)
    assert t.claim_origin(node="n0", count=2, now=1.0) == [0, 1]
    assert t.heartbeat(node="n1", now=1.1).view.pulling == [0, 1]
    source = t.stream_source(chunk=0, node="n1", now=1.2)
    assert source is not None and (source.name, source.url) == ("n0", "http://n0")
    assert t.stream_source(chunk=0, node="n0", now=1.2) is None  # never the puller itself
    assert t.stream_source(chunk=2, node="n1", now=1.2) is None  # not being pulled
    t.heartbeat(node="n0", now=2.0, chunks=[(0, H)])  # pulled and held: an ordinary holder now
    assert t.heartbeat(node="n1", now=2.1).view.pulling == [1]
    assert t.stream_source(chunk=0, node="n1", now=2.2) is None
    t.report(reporter="n1", peer="n0", chunk=0, now=2.3)
    assert t.stream_source(chunk=1, node="n1", now=2.4) is None  # never offered to its reporter
    assert t.stream_source(chunk=1, node="n2", now=2.4) is not None  # one report removes no one
    assert t.stream_source(chunk=1, node="n2", now=20.0) is None  # the puller went silent
    with pytest.raises(tracker.TrackerError):
        t.stream_source(chunk=99, node="n1", now=2.5)
