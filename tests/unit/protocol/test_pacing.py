"""Heartbeat pacing: the tracker scales the pace to its budget, purges follow it, agents obey it (fake clock)."""

from __future__ import annotations

import heapq
import random

import pytest

from ringseed.protocol import manifest, pacing, tracker

MiB = 1 << 20


def digest(index: int) -> str:
    return format(index, "064x")


def layout(chunks: int) -> manifest.Layout:
    return manifest.Layout.build([("m.bin", chunks * MiB, 0o644)], chunk_size=MiB)


def test_the_pace_scales_with_the_swarm_to_the_budget() -> None:
    budget = pacing.Budget(interval=2.0, gap=0.05, rate=1000.0)
    assert budget.pace(nodes=10) == pacing.Pace(interval=2.0, gap=0.05)  # a small swarm: the base pace
    assert budget.pace(nodes=1000) == pacing.Pace(interval=2.0, gap=1.0)
    assert budget.pace(nodes=10_000) == pacing.Pace(interval=10.0, gap=10.0)
    assert budget.pace(nodes=10_000, duty=True) == pacing.Pace(interval=10.0, gap=0.05)  # duty keeps the base gap
    for nodes in (1, 50, 999, 4_000, 65_536):  # the swarm's worst case (every node always has news)
        assert nodes / budget.pace(nodes=nodes).gap <= 1000.0 or budget.pace(nodes=nodes).gap == 0.05
    unscaled = pacing.Budget(interval=2.0, gap=0.05)
    assert unscaled.pace(nodes=10_000) == pacing.Pace(interval=2.0, gap=0.05)
    with pytest.raises(ValueError, match="positive"):
        pacing.Budget(interval=2.0, gap=0.05, rate=0.0)


def test_the_silence_follows_the_largest_interval_in_force() -> None:
    budget = pacing.Budget(interval=2.0, gap=0.05, rate=100.0)
    assert budget.silence(now=0.0) == 0.0  # the base pace: the configured offline_after rules
    slow = budget.told(budget.pace(nodes=1000), now=0.0)  # 10 s: a node told it may be silent until 30
    assert slow.interval == 10.0 and budget.silence(now=5.0) == 30.0
    budget.told(budget.pace(nodes=300), now=5.0)  # a faster pace told later does not shorten it ...
    assert budget.silence(now=29.9) == 30.0
    budget.told(budget.pace(nodes=1000), now=8.0)  # ... and the slow one, told again, lasts longer
    assert budget.silence(now=37.9) == 30.0
    budget.told(budget.pace(nodes=300), now=38.5)  # every node told 10 s is heard from or offline by 38
    assert budget.silence(now=38.5) == 9.0
    budget.told(budget.pace(nodes=10), now=48.0)  # the base pace again (3 s was in force until 47.5)
    assert budget.silence(now=48.0) == 0.0


def tracker_of(nodes: int, *, rate: float | None = 10.0) -> tracker.Tracker:
    budget = pacing.Budget(interval=1.0, gap=0.05, rate=rate) if rate is not None else None
    t = tracker.Tracker(epoch="e", offline_after=5.0, budget=budget)
    for i in range(nodes):
        t.register(node=f"n{i}", url=f"http://n{i}", session="s", now=0.0)
    return t


def test_heartbeat_replies_name_the_pace_and_purges_wait_three_intervals() -> None:
    t = tracker_of(40)  # 40 nodes at 10 heartbeats/s: every 4 s
    reply = t.heartbeat(node="n1", now=0.0)
    assert reply.pace == pacing.Pace(interval=4.0, gap=4.0)
    assert t.heartbeat(node="n0", now=0.0).pace == pacing.Pace(interval=4.0, gap=0.05)  # n0 holds origin duty
    for i in range(40):
        t.heartbeat(node=f"n{i}", now=0.5)
    assert t.purge(now=12.4) == [] and t.offline_after == 12.0  # 3 x 4 s, not the configured 5 s
    assert sorted(t.purge(now=12.6)) == sorted(f"n{i}" for i in range(40))
    small = tracker_of(3)
    assert small.heartbeat(node="n1", now=0.0).pace == pacing.Pace(interval=1.0, gap=0.3)
    assert small.purge(now=5.1) == ["n0", "n1", "n2"] and small.offline_after == 5.0  # the configured silence
    assert tracker_of(3, rate=None).heartbeat(node="n1", now=0.0).pace is None  # no budget: no pace told


def test_the_configured_silence_returns_once_the_slow_pace_has_run_out() -> None:
    t = tracker_of(40)
    for i in range(40):
        t.heartbeat(node=f"n{i}", now=1.0)  # told 4 s: silent until 13 at most
    for i in range(4):
        t.heartbeat(node=f"n{i}", now=13.5)
    assert sorted(t.purge(now=13.5)) == sorted(f"n{i}" for i in range(4, 40))  # most nodes left
    assert t.heartbeat(node="n1", now=13.6).pace == pacing.Pace(interval=1.0, gap=0.4)
    assert t.purge(now=14.0) == [] and t.offline_after == 12.0  # n0, n2, n3 were told 4 s at 13.5
    for now in (20.0, 25.0):
        for i in range(4):
            t.heartbeat(node=f"n{i}", now=now)
    assert t.purge(now=25.6) == [] and t.offline_after == 5.0


def test_the_agent_heartbeats_at_the_interval_and_early_news_waits_for_the_gap() -> None:
    p = pacing.Pacer(interval=1.0, gap=0.05)
    assert p.due(now=0.0, news=False) == 0.0  # nothing sent yet: at once
    p.sent(now=0.0)
    assert p.due(now=0.0, news=False) == 1.0 and p.due(now=0.0, news=True) == 0.05
    p.follow(interval=10.0, gap=4.0)  # the tracker's pace for a big swarm
    assert p.due(now=1.0, news=False) == 9.0 and p.due(now=1.0, news=True) == 3.0
    assert p.due(now=4.0, news=True) == 0.0 and p.due(now=12.0, news=False) == 0.0
    p.follow(interval=None, gap="x")  # a reply that names no pace (an older master) keeps it
    assert (p.interval, p.gap) == (10.0, 4.0)
    p.follow(interval=1e9, gap=-1)  # nonsense is bounded or ignored
    assert (p.interval, p.gap) == (pacing.MAX_INTERVAL, 4.0)
    p.follow(interval=2.0, gap=1e-9)
    assert (p.interval, p.gap) == (2.0, pacing.MIN_GAP)
    p.follow(interval=1.0, gap=5.0)  # a gap above the interval is the interval
    assert (p.interval, p.gap) == (1.0, 1.0)
    p.follow(interval=True, gap=False)  # (JSON booleans are not seconds)
    assert (p.interval, p.gap) == (1.0, 1.0)


def test_a_paced_swarm_sends_within_the_budget() -> None:
    """Agents with news all the time (every one verifies a chunk per 50 ms) heartbeat as the
    tracker paces them: the swarm's rate stays within the budget after the first replies, plus
    the early heartbeats of the node on origin duty (at the base gap)."""
    rate, nodes, horizon = 100.0, 500, 30.0
    t = tracker_of(nodes, rate=rate)
    pacers = {f"n{i}": pacing.Pacer(interval=1.0, gap=0.05) for i in range(nodes)}
    sent: list[float] = []
    due = [(i / nodes, f"n{i}") for i in range(nodes)]  # spread over the first second
    while due[0][0] <= horizon:
        now, name = heapq.heappop(due)
        pacer = pacers[name]
        pacer.sent(now=now)
        sent.append(now)
        pace = t.heartbeat(node=name, now=now).pace
        assert pace is not None
        pacer.follow(interval=pace.interval, gap=pace.gap)
        heapq.heappush(due, (now + pacer.due(now=now, news=True), name))
        if len(sent) % 100 == 0:
            assert t.purge(now=now) == []  # nobody paced looks silent
    late = [s for s in sent if s >= 10.0]
    assert len(late) / (horizon - 10.0) <= rate * 1.01 + 1 / 0.05


def test_the_front_of_the_pipeline_keeps_the_base_gap_on_a_bounded_number_of_seats() -> None:
    budget = pacing.Budget(interval=1.0, gap=0.05, rate=10.0, front_seats=2)
    t = tracker.Tracker(epoch="e", offline_after=5.0, budget=budget)
    names = [f"n{i}" for i in range(40)]
    for name in names:
        t.register(node=name, url=f"http://{name}", session="s", now=0.0)
    t.publish(node="n0", layout=layout(8), hashes=None, now=0.0)
    t.heartbeat(node="n0", now=0.1, chunks=[(i, digest(i)) for i in range(8)])  # n0 (duty) pulled all
    slow = pacing.Pace(interval=4.0, gap=4.0)
    assert t.heartbeat(node="n5", now=0.2).pace == slow
    for k, name in enumerate(names[1:4], start=1):  # holders 2, 3, 4 of chunk 0: the front
        assert t.heartbeat(node=name, now=0.3, chunks=[(0, None, "n0")]).pace == pacing.Pace(interval=4.0, gap=0.05)
        assert t.availability()[0] == k + 1
    assert t.heartbeat(node="n1", now=0.4).pace == slow  # two seats: n2 and n3 hold them now
    for name in names[4:8]:  # holders 5 to 8 of chunk 0: no longer rare, no seat
        assert t.heartbeat(node=name, now=0.5, chunks=[(0, None, "n0")]).pace == slow
    assert t.heartbeat(node="n3", now=0.6).pace == pacing.Pace(interval=4.0, gap=0.05)
    t.heartbeat(node="n3", now=0.7, dropped=[0])
    t.purge(now=30.0)  # everyone silent: gone, seats too
    assert budget.front == {}


def test_a_scaled_pace_is_jittered_around_the_nominal_one() -> None:
    budget = pacing.Budget(interval=2.0, gap=0.05, rate=1000.0, jitter=0.5, rng=random.Random(7))
    assert {budget.pace(nodes=10) for _ in range(100)} == {pacing.Pace(interval=2.0, gap=0.05)}  # base: exact
    paces = [budget.pace(nodes=10_000) for _ in range(2000)]  # nominal 10 s
    assert all(5.0 <= p.gap == p.interval <= 15.0 for p in paces)
    gaps = [p.gap for p in paces]
    assert min(gaps) < 5.1 and max(gaps) > 14.9  # the whole spread, one interval wide ...
    assert abs(sum(gaps) / len(gaps) - 10.0) < 0.2  # ... around the nominal pace: the budget holds on average
    duty = budget.pace(nodes=10_000, duty=True)
    assert duty.gap == 0.05 and 5.0 <= duty.interval <= 15.0  # duty keeps the base gap
    near = [budget.pace(nodes=3_000) for _ in range(200)]  # nominal 3 s: never below the base pace
    assert all(p.interval >= 2.0 and 1.5 <= p.gap <= 4.5 for p in near)
    for jitter in (-0.1, 1.0):
        with pytest.raises(ValueError, match="jitter"):
            pacing.Budget(interval=2.0, gap=0.05, rate=1000.0, jitter=jitter, rng=random.Random(1))
    with pytest.raises(ValueError, match="random source"):
        pacing.Budget(interval=2.0, gap=0.05, rate=1000.0, jitter=0.5)


@pytest.mark.parametrize("jitter", [0.0, pacing.DEFAULT_JITTER])
def test_jitter_spreads_agents_that_heartbeat_in_lockstep(jitter: float) -> None:
    """1,000 agents that all heartbeat at t = 0 (they started together) and always have news, at
    a budget of 100 heartbeats/s (10 s each): without jitter they keep heartbeating in one wave
    every 10 s; jittered, the waves are gone after a few beats (no second has more than 1.5x the
    budget) and the mean rate stays within the budget."""
    rate, nodes = 100.0, 1000
    budget = pacing.Budget(interval=1.0, gap=0.05, rate=rate, jitter=jitter, rng=random.Random(3))
    t = tracker.Tracker(epoch="e", offline_after=5.0, budget=budget)
    for i in range(nodes):
        t.register(node=f"n{i}", url=f"http://n{i}", session="s", now=0.0)
    pacers = {f"n{i}": pacing.Pacer(interval=1.0, gap=0.05) for i in range(nodes)}
    due = [(0.0, name) for name in pacers]
    per_second = [0] * 100
    while due[0][0] < 100.0:
        now, name = heapq.heappop(due)
        pacer = pacers[name]
        pacer.sent(now=now)
        reply = t.heartbeat(node=name, now=now)
        per_second[int(now)] += not reply.origin_duty  # (the duty node keeps the base gap: 20/s)
        pace = reply.pace
        assert pace is not None
        pacer.follow(interval=pace.interval, gap=pace.gap)
        heapq.heappush(due, (now + pacer.due(now=now, news=True), name))
    steady = per_second[40:]
    assert sum(steady) / len(steady) <= rate * 1.02
    if jitter:
        assert max(steady) <= 1.5 * rate
    else:
        assert max(steady) >= nodes - 2  # one wave a pace apart
