"""Who may lead once it holds the lock: never a replica that lacks acknowledged state (unless told it is lost)."""

from __future__ import annotations

import pytest

from ringseed.protocol import election

D = election.Decision


def test_fresh_group_leads_at_once() -> None:
    assert election.decide(election.Record(), me="a", has_state=False, waited=0, grace=30) is D.LEAD


def test_the_in_sync_follower_takes_over() -> None:
    record = election.Record(term=3, leader="a", leader_url="http://a", sync="b")
    assert election.decide(record, me="b", has_state=True, waited=0, grace=30) is D.LEAD
    new = election.take_over(record, me="b", url="http://b", seq=9, lost=False)
    assert (new.term, new.leader, new.sync, new.lost) == (4, "b", "", False)


def test_a_follower_out_of_sync_or_restarted_waits_for_the_state() -> None:
    record = election.Record(term=3, leader="a", sync="")
    assert election.decide(record, me="b", has_state=True, waited=5, grace=30) is D.WAIT
    named = election.Record(term=3, leader="a", sync="b")
    assert election.decide(named, me="b", has_state=False, waited=5, grace=30) is D.WAIT  # restarted: memory empty


def test_after_the_grace_a_replica_leads_and_says_state_was_lost() -> None:
    record = election.Record(term=3, leader="a", sync="")
    assert election.decide(record, me="b", has_state=False, waited=31, grace=30) is D.LEAD_LOST
    assert election.take_over(record, me="b", url="u", seq=0, lost=True).lost


def test_record_round_trips() -> None:
    record = election.with_sync(election.Record(term=2, leader="a", leader_url="u"), follower="b", seq=7)
    assert election.Record.from_dict(record.to_dict()) == record
    assert election.Record.from_dict(None) == election.Record()


def test_a_soft_state_master_leads_whenever_it_holds_the_lock() -> None:
    record = election.Record(term=3, leader="a", sync="")
    assert election.decide(record, me="b", has_state=False, waited=0, grace=30, soft=True) is D.LEAD
    assert election.take_over(record, me="b", url="http://b", seq=0, lost=False).term == 4


def test_a_lease_is_takeable_when_free_mine_or_run_out() -> None:
    take = election.lease_takeable
    assert take(holder=None, renewed_at=None, duration=8, me="b", now=100.0)
    assert take(holder="", renewed_at=99.0, duration=8, me="b", now=100.0)
    assert take(holder="b", renewed_at=99.0, duration=8, me="b", now=100.0)  # renewing my own
    assert not take(holder="a", renewed_at=99.0, duration=8, me="b", now=100.0)
    assert not take(holder="a", renewed_at=92.0, duration=8, me="b", now=100.0)  # exactly at the end: still a's
    assert take(holder="a", renewed_at=91.9, duration=8, me="b", now=100.0)
    assert take(holder="a", renewed_at=None, duration=8, me="b", now=100.0)


@pytest.mark.parametrize("offline_after", [2.0, 3.0, 10.0, 30.0])
def test_a_dead_leaders_lease_is_taken_within_one_heartbeat_timeout(offline_after: float) -> None:
    """A fake clock: the leader renews on time until it dies at a random moment; the follower
    polls; it leads before agents would count as silent."""
    import random

    timing = election.lease_timing(takeover_within=offline_after)
    assert timing.duration == int(timing.duration) >= 1 and timing.renew_every < timing.duration
    rng = random.Random(int(offline_after * 10))
    for _ in range(200):
        dies = rng.uniform(0, 100)
        renewed = 0.0
        while renewed + timing.renew_every <= dies:
            renewed += timing.renew_every  # the leader's last renewal before it died
        now = rng.uniform(0, timing.poll_every)  # the follower's polls, from a random phase
        while not election.lease_takeable(holder="a", renewed_at=renewed, duration=timing.duration, me="b", now=now):
            now += timing.poll_every
        assert now - dies <= offline_after, (now, dies, timing)
