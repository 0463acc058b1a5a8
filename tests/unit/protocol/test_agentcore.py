"""The agent core: download and origin-duty decisions driven by events and a fake clock."""

from __future__ import annotations

import math
import random
from typing import TypeVar

import pytest

from ringseed.protocol import agentcore as core
from ringseed.protocol import agentsteps as steps
from ringseed.protocol import choice, manifest

MiB = 1 << 20
LAYOUT = manifest.Layout.build([("model.bin", 8 * MiB, 0o644)], chunk_size=MiB)
HASHES = {i: f"h{i}" for i in range(8)}
A = TypeVar("A")


def make(*, hashes: dict[int, str] | None = None, seed: int = 0, **settings: float) -> core.AgentCore:
    agent = core.AgentCore(settings=core.Settings(**settings), rng=random.Random(seed))  # type: ignore[arg-type]
    agent.adopt(layout=LAYOUT, revision="r1", held={}, hashes=HASHES if hashes is None else hashes)
    agent.tracker_state(revision="r1", confirmed=True, duty=False)
    return agent


def peer(name: str, load: int = 0) -> choice.Holder:
    return choice.Holder(name=name, url=f"http://{name}", load=load)


def of(kind: type[A], actions: list[steps.Action]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def fetch_to_end(agent: core.AgentCore, find: steps.FindHolders, *, now: float, peers: list[str]) -> steps.Fetch:
    (step,) = agent.holders(find.job, [peer(p) for p in peers], now=now)
    assert isinstance(step, steps.Fetch)
    return step


def good(index: int) -> steps.Got:
    return steps.Got(length=LAYOUT.chunk_length(index), digest=HASHES[index])


def test_rarest_first_fills_the_download_slots() -> None:
    agent = make()
    agent.set_availability([5, 1, 3, 0, 2, 4, 6, 1])
    finds = of(steps.FindHolders, agent.tick(now=0.0))
    assert len(finds) == 4
    assert {f.index for f in finds} == {1, 7, 4, 2}  # fewest holders first; 3 has none (origin's)
    assert of(steps.FindHolders, agent.tick(now=0.0)) == []  # every slot taken


def test_a_verified_chunk_is_stored_announced_and_frees_its_slot() -> None:
    agent = make()
    agent.set_availability([1] + [0] * 7)
    (find,) = of(steps.FindHolders, agent.tick(now=0.0))
    fetch = fetch_to_end(agent, find, now=0.0, peers=["a"])
    (store,) = agent.fetched(fetch.job, good(0), now=0.1)
    assert isinstance(store, steps.Store) and store.digest == "h0" and store.source == "a"
    agent.held_chunk(0, "h0", from_origin=False, source="a")
    assert agent.stored(store.job, now=0.2) == []
    assert agent.jobs == {} and 0 not in agent.missing
    assert agent.take_announcements(10) == ([(0, None, "a")], [])


def test_busy_holders_are_skipped_and_the_chunk_waits_briefly() -> None:
    agent = make(retry_after=0.1)
    agent.set_availability([2] + [0] * 7)
    (find,) = of(steps.FindHolders, agent.tick(now=0.0))
    fetch = fetch_to_end(agent, find, now=0.0, peers=["a", "b"])
    (nxt,) = agent.fetched(fetch.job, steps.Refused(429), now=0.0)
    assert isinstance(nxt, steps.Fetch) and nxt.holder.name == "b"
    assert agent.fetched(nxt.job, steps.Refused(429), now=0.0) == []  # job over: not now
    assert agent.tick(now=0.01) == []
    wake = agent.next_wakeup(now=0.01)
    assert 0.05 <= wake <= 0.15
    assert agent.tick(now=wake - 0.001) == []
    (again,) = of(steps.FindHolders, agent.tick(now=wake))
    (fetch,) = agent.holders(again.job, [peer("a"), peer("b")], now=1.0)  # avoided about retry_after only
    assert isinstance(fetch, steps.Fetch) and fetch.holder.name == "a"


def test_a_wrong_body_is_reported_avoided_for_good_and_the_chunk_backs_off() -> None:
    agent = make(retry_after=0.1, retry_cap=2.0)
    agent.set_availability([2] + [0] * 7)
    (find,) = of(steps.FindHolders, agent.tick(now=0.0))
    fetch = fetch_to_end(agent, find, now=0.0, peers=["liar", "b"])
    actions = agent.fetched(fetch.job, steps.Got(length=MiB, digest="bad"), now=0.0)
    assert of(steps.Report, actions) == [steps.Report(peer="liar", index=0)]
    (nxt,) = of(steps.Fetch, actions)
    assert nxt.holder.name == "b" and agent.avoid["liar"] == math.inf and agent.rejected_chunks == 1
    assert agent.fetched(nxt.job, steps.Unreachable("refused"), now=0.0) == []
    assert agent.retries.failures(0) == 1 and not agent.tick(now=0.04)  # failed: at least base/2
    later = agent.tick(now=0.2)
    (again,) = of(steps.FindHolders, later)
    assert agent.holders(again.job, [peer("liar")], now=0.2) == []  # never asked again


def test_a_short_body_fails_and_the_next_holder_is_asked() -> None:
    agent = make()
    agent.set_availability([2] + [0] * 7)
    (find,) = of(steps.FindHolders, agent.tick(now=0.0))
    fetch = fetch_to_end(agent, find, now=0.0, peers=["a", "b"])
    (nxt,) = agent.fetched(fetch.job, steps.Broken(received=100), now=0.0)
    assert isinstance(nxt, steps.Fetch) and nxt.holder.name == "b" and agent.avoid["a"] == 5.0


def test_a_new_copy_makes_a_backed_off_chunk_ready_at_once() -> None:
    agent = make()
    agent.set_availability([1] + [0] * 7)
    (find,) = of(steps.FindHolders, agent.tick(now=0.0))
    fetch = fetch_to_end(agent, find, now=0.0, peers=["a"])
    agent.fetched(fetch.job, steps.Unreachable(), now=0.0)
    assert agent.tick(now=0.0) == []
    agent.set_availability([2] + [0] * 7)
    assert [f.index for f in of(steps.FindHolders, agent.tick(now=0.0))] == [0]


def test_unreachable_peers_in_a_row_raise_a_problem_until_one_answers() -> None:
    agent = make(unreachable_problem_after=3)
    agent.set_availability([3] * 8)
    problems: list[steps.Action] = []
    now = 0.0
    for name in ["a", "b", "c"]:
        (find, *_) = of(steps.FindHolders, agent.tick(now=now))
        fetch = fetch_to_end(agent, find, now=now, peers=[name])
        problems += agent.fetched(fetch.job, steps.Unreachable(), now=now)
        now += 10.0
    assert [type(a) for a in problems] == [steps.SetProblem]
    (find, *_) = of(steps.FindHolders, agent.tick(now=now))
    fetch = fetch_to_end(agent, find, now=now, peers=["d"])
    assert steps.ClearProblem(core.PEER_UNREACHABLE) in agent.fetched(fetch.job, good(find.index), now=now)


def test_end_game_duplicates_and_cancels_the_loser() -> None:
    agent = make(hashes={0: "h0"}, endgame_requests=2)
    agent.set_availability([3] + [0] * 7)
    (first,) = of(steps.FindHolders, agent.tick(now=0.0))
    (second,) = of(steps.FindHolders, agent.tick(now=0.0))
    assert second.index == 0 and second.job != first.job
    a = fetch_to_end(agent, first, now=0.0, peers=["a"])
    fetch_to_end(agent, second, now=0.0, peers=["b"])
    (store,) = agent.fetched(a.job, good(0), now=0.5)
    assert agent.held_chunk(0, "h0", from_origin=False, source="a") == [steps.Cancel(second.job)]
    agent.stored(store.job, now=0.5)
    assert agent.jobs == {}


def test_nothing_starts_while_staging_is_full() -> None:
    agent = make()
    agent.set_availability([1] * 8)
    agent.pause(True)
    assert agent.tick(now=0.0) == []
    agent.pause(False)
    assert len(agent.tick(now=0.0)) == 4


def test_a_stream_waits_for_the_hash_and_a_mismatch_blames_nobody() -> None:
    agent = make(hashes={})
    agent.set_pulling([2])
    (src,) = of(steps.FindSource, agent.tick(now=0.0))
    (fetch,) = agent.sources(src.job, [], peer("seed"), now=0.0)
    assert isinstance(fetch, steps.Fetch) and fetch.stream
    (wait,) = agent.fetched(fetch.job, steps.Got(length=MiB, digest="x"), now=1.0)
    assert isinstance(wait, steps.AwaitHash) and wait.until == 31.0
    agent.learn_hashes({2: "h2"})
    assert agent.hash_waited(src.job, now=1.1) == []  # no match: dropped, nobody reported
    assert agent.rejected_chunks == 1 and "seed" not in agent.avoid
    agent.set_pulling([3])
    (src,) = of(steps.FindSource, agent.tick(now=2.0))
    agent.learn_hashes({3: "h3"})
    (fetch,) = agent.sources(src.job, [], peer("seed"), now=2.0)
    (store,) = agent.fetched(fetch.job, good(3), now=2.5)
    assert isinstance(store, steps.Store) and store.source == "seed"
    agent.held_chunk(3, "h3", from_origin=False, source="seed")
    agent.stored(store.job, now=2.5)
    assert agent.streamed_chunks == 1


def test_a_stream_whose_pull_ended_fetches_from_the_holders() -> None:
    agent = make(hashes={})
    agent.set_pulling([1])
    (src,) = of(steps.FindSource, agent.tick(now=0.0))
    (wait,) = agent.sources(src.job, [peer("seed")], None, now=0.0)
    assert isinstance(wait, steps.AwaitHash)
    agent.learn_hashes({1: "h1"})
    (fetch,) = agent.hash_waited(src.job, now=0.1)
    assert isinstance(fetch, steps.Fetch) and not fetch.stream


def test_events_of_an_earlier_revision_are_forgotten() -> None:
    agent = make()
    agent.set_availability([1] * 8)
    (find, *_) = of(steps.FindHolders, agent.tick(now=0.0))
    agent.adopt(layout=LAYOUT, revision="r2", held={}, hashes=HASHES)
    assert agent.holders(find.job, [peer("a")], now=0.0) == []
    assert agent.jobs == {}


def test_announcements_of_a_dropped_chunk_are_withdrawn_and_failed_heartbeats_resend() -> None:
    agent = make()
    agent.held_chunk(1, "h1", from_origin=True)
    agent.held_chunk(2, "h2", from_origin=False, source="a")
    agent.dropped_chunk(1)
    batch, drops = agent.take_announcements(10)
    assert batch == [(2, None, "a")] and drops == [1]
    agent.dropped_chunk(2)
    agent.announcements_failed(batch, drops)
    assert agent.take_announcements(10) == ([], [1, 2])
    assert agent.learn_hashes({0: "other"}) == [] and agent.learn_hashes({3: "x"}) == []
    agent.held_chunk(4, "h4", from_origin=False)
    assert agent.learn_hashes({4: "not-h4"}) == [4]


def test_a_registration_voids_only_what_it_listed() -> None:
    """Chunks verified or dropped while a registration was in flight are still told (a follower
    taking over mid-transfer used to miss a node's last chunk: its announcement was discarded)."""
    agent = make()
    agent.held_chunk(1, "h1", from_origin=False, source="a")
    agent.held_chunk(2, "h2", from_origin=False, source="a")
    carried = dict(agent.held)  # the registration's body
    agent.held_chunk(3, "h3", from_origin=False, source="b")  # verified during the call
    agent.dropped_chunk(2)  # lost during the call
    agent.registered(carried)
    assert agent.take_announcements(10) == ([(3, None, "b")], [2])


def test_chunks_a_heartbeat_did_not_take_are_told_again_with_their_hash_while_held() -> None:
    """A leader that just took over does not know a peer-fetched chunk's hash until the nodes
    re-register, and a heartbeat cannot teach it (only the origin puller's can): the reply names
    the chunk as rejected, and the node used to count it as told, so the tracker never knew the
    node held it (seen once in CI: a node verified 49 of 49 chunks and the leader counted 48)."""
    agent = make()
    agent.held_chunk(1, "h1", from_origin=False, source="a")
    agent.held_chunk(2, "h2", from_origin=False, source="a")
    agent.held_chunk(3, "h3", from_origin=False, source="a")
    batch, _ = agent.take_announcements(10)
    assert [a[0] for a in batch] == [1, 2, 3]
    agent.dropped_chunk(3)
    agent.held_chunk(2, "h2", from_origin=False, source="b")  # already queued again: not twice
    agent.announcements_rejected([1, 2, 3, 7])
    assert agent.take_announcements(10) == ([(1, "h1", None), (2, None, "b")], [3])
    agent.announcements_rejected([])
    assert agent.take_announcements(10) == ([], [])


# -- origin duty ------------------------------------------------------------------------------


def on_duty(**settings: float) -> core.AgentCore:
    agent = make(hashes={}, **settings)
    assert agent.tracker_state(revision="r1", confirmed=True, duty=True) == [steps.Retake()]
    assert not of(steps.Claim, agent.tick(now=0.0))  # the source is checked first
    agent.source_taken(revision="r1")
    return agent


def test_origin_duty_claims_pulls_and_stores_with_the_hash() -> None:
    agent = on_duty()
    (_claim,) = of(steps.Claim, agent.tick(now=0.0))
    assert of(steps.Claim, agent.tick(now=0.0)) == []  # one claim at a time
    (pull,) = agent.claimed([0, 1, 2], now=0.0)
    assert isinstance(pull, steps.Pull) and pull.index == 0
    assert of(steps.Claim, agent.tick(now=0.0)) == []  # the one read slot is taken
    actions = agent.pulled(pull.job, "h0", now=1.0)
    (store,) = of(steps.Store, actions)
    assert store.from_origin and store.digest == "h0"
    agent.held_chunk(0, "h0", from_origin=True)
    agent.stored(store.job, now=1.0)
    assert agent.take_announcements(10)[0] == [(0, "h0", None)]


def test_a_read_hands_the_pipe_on_before_it_ends() -> None:
    agent = on_duty(origin_depth=1, lookahead=0.5)
    agent.tick(now=0.0)
    (pull,) = agent.claimed([0, 1], now=0.0)
    assert not agent.pull_progress(pull.job, filled=MiB // 4, length=MiB, elapsed=1.0)
    assert agent.pull_progress(pull.job, filled=MiB * 7 // 8, length=MiB, elapsed=1.0)
    (_claim,) = of(steps.Claim, agent.tick(now=1.0))
    (second,) = agent.claimed([0, 1], now=1.0)
    assert second.index == 1  # the ending read overlaps the next; no third read
    agent.tick(now=1.0)
    assert of(steps.Claim, agent.tick(now=1.0)) == []


def test_failed_pulls_back_off_and_raise_origin_error() -> None:
    agent = on_duty(origin_problem_after=2, origin_retry_base=1.0)
    now = 0.0
    problems: list[steps.Action] = []
    for _ in range(2):
        agent.tick(now=now)
        (pull,) = agent.claimed([0], now=now)
        problems += agent.pull_failed(pull.job, steps.PullFailure.ERROR, "timeout", now=now)
        assert agent.pull_failures.until(0) > now
        agent.tick(now=now)
        assert agent.claimed([0], now=now) == []  # backing off
        assert agent.next_wakeup(now=now) == pytest.approx(now + 0.05)  # claims again soon
        now = agent.pull_failures.until(0)
    assert [type(p) for p in problems] == [steps.SetProblem]
    agent.tick(now=now)
    (pull,) = agent.claimed([0], now=now)
    assert steps.ClearProblem(core.ORIGIN_ERROR) in agent.pulled(pull.job, "h0", now=now)


def test_a_source_changed_under_a_pull_stops_pulling_until_it_is_taken_again() -> None:
    agent = on_duty()
    agent.tick(now=0.0)
    (pull,) = agent.claimed([0], now=0.0)
    assert agent.pull_failed(pull.job, steps.PullFailure.SOURCE_CHANGED, "etag", now=0.0) == [steps.Retake()]
    assert not agent.may_pull() and agent.tick(now=5.0) == []
    agent.source_taken(revision="r1")
    assert of(steps.Claim, agent.tick(now=5.0))


def test_pulls_that_contradict_the_manifest_are_given_up() -> None:
    agent = on_duty(max_mismatches=2, origin_retry_base=0.1)
    agent.learn_hashes({0: "h0"})
    agent.tick(now=0.0)
    (pull,) = agent.claimed([0], now=0.0)
    assert agent.pulled(pull.job, "other", now=0.0) == [steps.Retake()]
    agent.source_taken(revision="r1")
    agent.tick(now=1.0)
    (pull,) = agent.claimed([0], now=1.0)
    (problem,) = agent.pulled(pull.job, "other", now=1.0)
    assert isinstance(problem, steps.SetProblem) and problem.reason == core.SOURCE_CHANGED
    agent.tick(now=100.0)
    assert agent.claimed([0], now=100.0) == []  # given up under this revision


def test_a_claimed_candidate_is_reused_not_pulled() -> None:
    agent = make(hashes={})
    agent.adopt(layout=LAYOUT, revision="r1", held={}, hashes={}, candidates=[0])
    agent.tracker_state(revision="r1", confirmed=True, duty=True)
    agent.source_taken(revision="r1")
    agent.tick(now=0.0)
    (reuse,) = agent.claimed([0], now=0.0)
    assert isinstance(reuse, steps.Reuse)
    agent.reused(reuse.job)
    assert agent.pulls == {}


@pytest.mark.parametrize("duty", [False, True])
def test_no_claims_without_duty_or_on_another_revision(duty: bool) -> None:
    agent = make(hashes={})
    agent.tracker_state(revision="r0", confirmed=True, duty=duty)
    agent.source_stale = False
    assert of(steps.Claim, agent.tick(now=0.0)) == []
