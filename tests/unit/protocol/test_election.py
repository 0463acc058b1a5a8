"""Who may lead once it holds the lock: never a replica that lacks acknowledged state (unless told it is lost)."""

from __future__ import annotations

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
