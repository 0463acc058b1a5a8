"""Stuck origin pulls: the deadline from the learned origin rate, the hand-over, the late result."""

from __future__ import annotations

from ringseed.protocol import assignments, manifest, tracker

MiB = 1 << 20
GOOD = "aa" * 32
BAD = "bb" * 32


def test_the_rate_is_learned_from_completions_and_the_deadline_follows_it() -> None:
    a = assignments.Assignments(factor=4.0, slack=10.0, assumed_rate=1e6)
    a.assign(0, "p", now=0.0)
    a.assign(1, "p", now=0.0)
    assert a.deadline("p", chunk_bytes=MiB) == 0.0 + 4 * MiB / 1e6 + 10.0  # the assumed rate
    assert a.complete(0, node="p", now=2.0, nbytes=4 * MiB) == "p"  # 4 MiB in 2 s
    assert a.rate == 2 * MiB
    assert a.complete(1, node="p", now=6.0, nbytes=4 * MiB) == "p"  # the next took 4 s after the first ended
    assert a.rate == 0.75 * 2 * MiB + 0.25 * MiB
    a.assign(2, "p", now=7.0)
    expected = MiB / a.rate
    assert a.deadline("p", chunk_bytes=MiB) == 7.0 + 4 * expected + 10.0
    assert a.stuck(now=7.0 + 4 * expected + 10.0, chunk_bytes=MiB) == []
    assert a.stuck(now=7.0 + 4 * expected + 10.01, chunk_bytes=MiB) == ["p"]
    a.progressed("p", now=20.0)  # bytes arrived: the clock starts again
    assert a.stuck(now=20.0 + 4 * expected + 10.0, chunk_bytes=MiB) == []


def test_a_copy_announced_by_someone_else_ends_the_pull_without_teaching_a_rate() -> None:
    a = assignments.Assignments()
    a.assign(3, "p", now=0.0)
    assert a.complete(3, node="other", now=1.0, nbytes=MiB) == "p"
    assert a.rate is None and 3 not in a and a.deadline("p", chunk_bytes=MiB) is None


def swarm(names: list[str], *, chunks: int = 6, slack: float = 5.0) -> tracker.Tracker:
    t = tracker.Tracker(epoch="e", offline_after=60.0, stall_slack=slack, stall_cooloff=100.0)
    for i, name in enumerate(names):
        t.register(node=name, url=f"http://{name}", session="s", now=i * 0.01)
    layout = manifest.Layout.build([("m.bin", chunks * MiB, 0o644)], chunk_size=MiB)
    t.publish(node=names[0], layout=layout, hashes=None, now=0.1)
    return t


def beat_all(t: tracker.Tracker, now: float) -> None:
    for name in list(t.nodes):
        t.heartbeat(node=name, now=now)


def test_a_stuck_puller_hands_its_chunks_on_and_its_late_result_follows_the_first_verified_copy() -> None:
    t = swarm(["p", "q", "r"])
    assert t.claim_origin(node="p", count=2, now=1.0) == [0, 1]
    t.heartbeat(node="p", now=2.0, chunks=[(0, GOOD)])  # 1 MiB in 1 s
    rate = t.pulls.rate
    assert rate is not None
    assert t.claim_origin(node="p", count=2, now=2.0) == [1, 2]
    deadline = t.pulls.deadline("p", chunk_bytes=MiB)
    assert deadline == 2.0 + 4 * MiB / rate + 5.0
    beat_all(t, deadline - 0.1)  # alive, but its pulls do not move
    t.purge(now=deadline - 0.1)
    assert t.duty == ["p"]
    beat_all(t, deadline + 0.1)
    t.purge(now=deadline + 0.1)
    assert t.duty == ["q"] and t.assigned == {} and "p" in t.stalled
    assert t.heartbeat(node="p", now=deadline + 0.2).origin_duty is False
    now = deadline + 0.3
    assert t.claim_origin(node="q", count=2, now=now) == [1, 2]  # handed on
    # p's stuck pull of 1 ends late, before q's: no duty, no assignment, no hash known -> refused
    assert t.heartbeat(node="p", now=now + 0.1, chunks=[(1, GOOD)]).rejected == [1]
    assert t.hashes[1] is None and t.assigned == {1: "q", 2: "q"}
    t.heartbeat(node="q", now=now + 0.2, chunks=[(1, GOOD)])
    # p's pull of 2 ends after q's: the first verified copy set the hash; p's copy counts if it agrees
    t.heartbeat(node="q", now=now + 0.3, chunks=[(2, GOOD)])
    assert t.heartbeat(node="p", now=now + 0.4, chunks=[(2, GOOD)]).rejected == []
    assert t.heartbeat(node="r", now=now + 0.4, chunks=[(1, BAD)]).rejected == [1]  # no one overrides it
    assert t.availability()[:3] == [1, 1, 2] and t.hashes[1] == GOOD
    # nothing is assigned again: each of 1 and 2 left the origin twice at most, never a third time
    assert t.claim_origin(node="q", count=6, now=now + 0.5) == [3, 4, 5]


def test_a_slow_puller_whose_bytes_move_is_not_stuck() -> None:
    t = swarm(["p", "q"])
    assert t.claim_origin(node="p", count=1, now=1.0) == [0]
    deadline = t.pulls.deadline("p", chunk_bytes=MiB)
    assert deadline is not None
    now, origin = 1.0, 0
    while now < 3 * deadline:
        now += 2.0
        origin += 1000  # a trickle, still moving
        t.heartbeat(node="p", now=now, counters={"origin_bytes": origin})
        t.heartbeat(node="q", now=now)
        t.purge(now=now)
    assert t.duty == ["p"] and t.assigned == {0: "p"}


def test_a_stuck_puller_keeps_duty_when_nobody_else_can_and_comes_back_after_the_cooloff() -> None:
    alone = swarm(["p"])
    alone.claim_origin(node="p", count=1, now=1.0)
    deadline = alone.pulls.deadline("p", chunk_bytes=MiB)
    assert deadline is not None
    alone.heartbeat(node="p", now=deadline + 1)
    alone.purge(now=deadline + 1)
    assert alone.duty == ["p"] and alone.claim_origin(node="p", count=1, now=deadline + 2) == [0]

    t = swarm(["p", "q"])
    t.claim_origin(node="p", count=1, now=1.0)
    deadline = t.pulls.deadline("p", chunk_bytes=MiB)
    assert deadline is not None
    beat_all(t, deadline + 1)
    t.purge(now=deadline + 1)
    assert t.duty == ["q"]
    later = deadline + 1 + t.stall_cooloff + 1
    for when in (deadline + 50, later):  # both stay online
        t.heartbeat(node="q", now=when)
        t.heartbeat(node="p", now=when)
    t.purge(now=later)
    assert t.stalled == {} and t.duty == ["q"]  # q keeps the duty it holds ...
    t.heartbeat(node="p", now=later + 60)
    t.purge(now=later + 61)  # ... until it goes silent; p may hold it again
    assert list(t.nodes) == ["p"] and t.duty == ["p"]
