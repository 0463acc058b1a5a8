"""The membership state machine, driven directly with explicit time (no sockets, no clock)."""

from __future__ import annotations

import pytest

from ringseed.protocol import membership as m

K = m.RoundKind


def _group(n: int, *, min_peers: int | None = None) -> m.Membership:
    group = m.Membership(min_peers=min_peers or n)
    for i in range(n):
        group.register(peer_id=f"p{i}", host="127.0.0.1", port=9000 + i, now=0.0)
    return group


def _begin_all(group: m.Membership, *, now: float = 1.0, op: str = "all_reduce") -> int:
    tags = {group.vote(K.COLLECTIVE, peer_id=p, payload={"op": op, "nbytes": 64}, now=now) for p in group.accepted()}
    assert len(tags) == 1
    return tags.pop()


def test_first_min_peers_are_accepted_together() -> None:
    group = m.Membership(min_peers=3)
    group.register(peer_id="a", host="h", port=1, now=0.0)
    group.register(peer_id="b", host="h", port=2, now=0.0)
    assert group.accepted() == [] and group.pending() == ["a", "b"]
    group.register(peer_id="c", host="h", port=3, now=0.0)
    assert group.accepted() == ["a", "b", "c"]
    assert group.epoch == 1


def test_collective_performs_only_when_every_peer_voted() -> None:
    group = _group(3)
    tag = group.vote(K.COLLECTIVE, peer_id="p0", payload={"op": "all_reduce", "nbytes": 8}, now=1.0)
    assert group.result(K.COLLECTIVE, tag) is None
    assert group.stage(tag) is m.OpStage.VOTE_INITIATE
    assert group.phase is m.Phase.COLLECTIVE_RUNNING
    group.vote(K.COLLECTIVE, peer_id="p1", payload={"op": "all_reduce", "nbytes": 8}, now=1.0)
    group.vote(K.COLLECTIVE, peer_id="p2", payload={"op": "all_reduce", "nbytes": 8}, now=1.0)
    result = group.result(K.COLLECTIVE, tag)
    assert result is not None and [a["peer_id"] for a in result["ring"]] == ["p0", "p1", "p2"]
    assert group.stage(tag) is m.OpStage.PERFORMING


def test_complete_needs_every_participant() -> None:
    group = _group(3)
    tag = _begin_all(group)
    group.end(peer_id="p0", tag=tag, ok=True, now=2.0)
    group.end(peer_id="p1", tag=tag, ok=True, now=2.0)
    assert group.decision(tag) is None and group.stage(tag) is m.OpStage.VOTE_COMPLETE
    assert group.status()["collectives"] == [
        {"tag": tag, "op": "all_reduce", "stage": "VoteComplete", "waiting_for": ["p2"]}
    ]
    group.end(peer_id="p2", tag=tag, ok=True, now=2.0)
    decision = group.decision(tag)
    assert decision is not None and decision.verdict is m.Verdict.COMPLETE
    assert group.phase is m.Phase.IDLE
    assert group.status()["last_all_reduce"]["bytes"] == 64
    assert group.status()["collectives"] == []


def test_one_failure_aborts_for_everybody_and_the_verdict_is_final() -> None:
    group = _group(3)
    tag = _begin_all(group)
    epoch = group.epoch
    group.end(peer_id="p0", tag=tag, ok=True, now=2.0)
    group.end(peer_id="p1", tag=tag, ok=False, reason="socket reset", now=2.0)
    group.end(peer_id="p2", tag=tag, ok=True, now=2.0)
    decision = group.decision(tag)
    assert decision is not None and decision.verdict is m.Verdict.ABORT and "socket reset" in decision.reason
    assert group.epoch == epoch + 1
    assert group.aborts_since(0) == [tag]


def test_stale_abort_cannot_hit_the_next_operation() -> None:
    group = _group(2)
    first = _begin_all(group)
    for p in group.accepted():
        group.end(peer_id=p, tag=first, ok=True, now=2.0)
    second = _begin_all(group, now=3.0)
    assert second == first + 1
    group.abort(tag=first, reason="late abort", now=3.5)
    assert group.decision(second) is None
    assert group.aborts_since(0) == []


def test_silent_peer_is_removed_and_its_operation_aborted() -> None:
    group = _group(3)
    tag = _begin_all(group)
    for p in ("p0", "p1"):
        group.heartbeat(peer_id=p, now=4.0)
    assert group.expire(now=4.0, timeout=3.0) == ["p2"]
    decision = group.decision(tag)
    assert decision is not None and decision.verdict is m.Verdict.ABORT and "p2" in decision.reason
    assert group.accepted() == ["p0", "p1"]


def test_survivors_retry_without_waiting_for_the_dead_peer() -> None:
    group = _group(3)
    tag = group.vote(K.COLLECTIVE, peer_id="p0", payload={"op": "all_reduce"}, now=1.0)
    group.vote(K.COLLECTIVE, peer_id="p1", payload={"op": "all_reduce"}, now=1.0)
    group.remove("p2", reason="killed", now=2.0)
    result = group.result(K.COLLECTIVE, tag)
    assert result is not None and [a["peer_id"] for a in result["ring"]] == ["p0", "p1"]


def test_mismatched_operations_are_aborted() -> None:
    group = _group(2)
    tag = group.vote(K.COLLECTIVE, peer_id="p0", payload={"op": "all_reduce", "nbytes": 8}, now=1.0)
    group.vote(K.COLLECTIVE, peer_id="p1", payload={"op": "broadcast", "nbytes": 8}, now=1.0)
    decision = group.decision(tag)
    assert decision is not None and decision.verdict is m.Verdict.ABORT


def test_newcomer_is_accepted_by_vote_of_every_peer() -> None:
    group = _group(2)
    group.register(peer_id="new", host="h", port=1, now=1.0)
    assert group.pending() == ["new"]
    with pytest.raises(m.MembershipError) as err:
        group.vote(K.COLLECTIVE, peer_id="new", payload={}, now=1.0)
    assert err.value.code == "not_accepted"
    number = group.vote(K.ACCEPT, peer_id="p0", payload={}, now=1.0)
    assert group.phase is m.Phase.VOTING_ACCEPT_PEERS
    group.vote(K.ACCEPT, peer_id="p1", payload={}, now=1.0)
    result = group.result(K.ACCEPT, number)
    assert result is not None and result["accepted"] == ["new"]
    assert group.accepted() == ["p0", "p1", "new"]
    tag = _begin_all(group, now=2.0)
    collective = group.result(K.COLLECTIVE, tag)
    assert collective is not None and len(collective["ring"]) == 3


def test_sync_most_common_hash_set_wins_and_revision_rises() -> None:
    group = _group(3)
    good = {"w": "aa", "b": "bb"}
    number = group.vote(K.SYNC, peer_id="p0", payload={"revision": 7, "hashes": good}, now=1.0)
    group.vote(K.SYNC, peer_id="p1", payload={"revision": 0, "hashes": {"w": "00", "b": "bb"}}, now=1.0)
    group.vote(K.SYNC, peer_id="p2", payload={"revision": 7, "hashes": good}, now=1.0)
    result = group.result(K.SYNC, number)
    assert result is not None
    assert result["revision"] == 8 and result["source"] == "p0"
    assert result["fetch"] == ["w"] and result["outliers"] == ["p1"] and result["error"] == ""


def test_bandwidth_round_reorders_the_ring_by_its_slowest_link() -> None:
    group = m.Membership(min_peers=4, optimize_topology=True)
    for i in range(4):
        group.register(peer_id=f"p{i}", host="h", port=i, now=0.0)
    fast = {("p0", "p2"), ("p2", "p1"), ("p1", "p3"), ("p3", "p0")}
    number = 0
    for a in group.accepted():
        row = {b: (10.0 if (a, b) in fast else 1.0) for b in group.accepted() if b != a}
        number = group.vote(K.BANDWIDTH, peer_id=a, payload={"row": row}, now=1.0)
    result = group.result(K.BANDWIDTH, number)
    assert result is not None and result["bottleneck_bps"] == 10.0
    assert group.accepted() == ["p0", "p2", "p1", "p3"]


def test_reregistering_with_a_new_address_replaces_the_lost_peer() -> None:
    group = _group(2)
    tag = _begin_all(group)
    group.register(peer_id="p1", host="127.0.0.1", port=1234, now=2.0)
    decision = group.decision(tag)
    assert decision is not None and decision.verdict is m.Verdict.ABORT
    assert group.accepted() == ["p0"] and group.pending() == ["p1"]
