"""The tracker applying trust: penalties, duty and assignments, suspect copies, drops, and the
issue's scenarios (a faulty receiver, a lying origin-duty node) driven round by round, no sockets."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from ringseed.protocol import manifest, tracker, trust

MiB = 1 << 20


def digest(index: int) -> str:
    return format(index, "064x")


def layout(chunks: int) -> manifest.Layout:
    return manifest.Layout.build([("m.bin", chunks * MiB, 0o644)], chunk_size=MiB)


def swarm(names: list[str], *, chunks: int = 8, seeders: int = 1, window: float = 600.0) -> tracker.Tracker:
    t = tracker.Tracker(epoch="e", offline_after=10.0, seeders=seeders, judge=trust.Trust(window=window))
    for i, name in enumerate(names):
        t.register(node=name, url=f"http://{name}", session="s", now=i * 0.01)
    t.publish(node=names[0], layout=layout(chunks), hashes=None, now=0.1)
    return t


def seed(t: tracker.Tracker, node: str, chunks: range, now: float) -> None:
    """``node`` (on duty) pulled ``chunks`` and announces them with their hashes."""
    t.heartbeat(node=node, now=now, chunks=[(i, digest(i)) for i in chunks])


def test_a_penalised_duty_holder_loses_duty_and_assignments_at_once() -> None:
    t = swarm(["liar", "a", "b", "c"])
    assert t.claim_origin(node="liar", count=4, now=1.0) == [0, 1, 2, 3]
    seed(t, "liar", range(2), now=1.5)  # pulled 0 and 1, still pulling 2 and 3
    t.report(reporter="a", peer="liar", chunk=0, now=2.0)
    t.purge(now=2.0)
    assert t.duty == ["liar"]  # one reporter is not enough
    t.report(reporter="b", peer="liar", chunk=1, now=2.1)
    assert t.duty == ["liar"]  # evidence is judged on the periodic pass ...
    t.purge(now=2.1)
    assert t.duty == ["a"] and t.penalised == {"liar"}
    assert t.assigned == {}  # its open assignments are released at once ...
    assert t.claim_origin(node="a", count=8, now=2.2) == list(range(8))  # ... and its copies do not count
    assert t.status(now=2.2)["nodes"]["liar"]["penalised"] is True


def test_penalty_survives_reregistration_and_purge_and_reporters_count_once() -> None:
    t = swarm(["p", "a", "b"])
    seed(t, "p", range(8), now=1.0)
    t.report(reporter="a", peer="p", chunk=0, now=2.0)
    t.register(node="a", url="http://a", session="new", now=2.5)  # a re-registers ...
    t.report(reporter="a", peer="p", chunk=1, now=3.0)  # ... and reports again: still one reporter
    t.purge(now=3.0)
    assert t.penalised == frozenset()
    t.report(reporter="b", peer="p", chunk=1, now=3.1)
    t.purge(now=3.1)
    assert t.penalised == {"p"}
    t.register(node="p", url="http://p", session="fresh", now=4.0, chunks={i: digest(i) for i in range(8)})
    assert t.penalised == {"p"} and t.availability() == [0] * 8  # a new session clears nothing
    for name in ("a", "b"):
        t.heartbeat(node=name, now=14.5)
    assert t.purge(now=14.6) == ["p"]
    t.register(node="p", url="http://p", session="again", now=15.0)
    assert t.penalised == {"p"} and "p" not in t.duty


def test_penalty_decays_and_availability_comes_back() -> None:
    t = swarm(["p", "a", "b"], window=100.0)
    seed(t, "p", range(8), now=1.0)
    for chunk, reporter in enumerate(("a", "b")):  # different chunks: no single copy is suspect
        t.report(reporter=reporter, peer="p", chunk=chunk, now=2.0)
    t.purge(now=2.0)
    assert t.availability() == [0] * 8
    for now in (50.0, 101.0):
        for name in t.nodes:
            t.heartbeat(node=name, now=now)
        t.purge(now=now)
    assert t.availability() == [0] * 8
    for name in t.nodes:
        t.heartbeat(node=name, now=102.5)
    t.purge(now=102.5)
    assert t.penalised == frozenset() and t.availability() == [1] * 8


def test_peers_that_serve_verified_chunks_shed_a_penalty() -> None:
    t = swarm(["p", "a", "b", "c", "d", "e"])
    seed(t, "p", range(8), now=1.0)
    for reporter in ("a", "b"):
        t.report(reporter=reporter, peer="p", chunk=0, now=2.0)
    t.purge(now=2.0)
    assert t.penalised == {"p"}
    t.heartbeat(node="c", now=3.0, chunks=[(1, None, "p")])  # c verified chunk 1 from p
    t.purge(now=3.0)
    assert t.penalised == {"p"}
    t.heartbeat(node="d", now=3.1, chunks=[(2, None, "p")])
    t.purge(now=3.1)
    assert t.penalised == frozenset() and t.availability()[3] == 1


def test_a_vouch_counts_only_for_a_holder_of_the_chunk() -> None:
    t = swarm(["p", "a", "b", "c", "d"])
    seed(t, "p", range(1), now=1.0)
    for reporter in ("a", "b"):
        t.report(reporter=reporter, peer="p", chunk=0, now=2.0)
    for fetcher in ("c", "d"):  # p holds only chunk 0: claims about chunk 5 prove nothing
        t.heartbeat(node=fetcher, now=3.0, chunks=[(5, None, "p")])
    t.purge(now=3.0)
    assert t.penalised == {"p"}


def test_faulty_receiver_never_takes_duty_over_credible_nodes() -> None:
    t = swarm(["h0", "bad", "h2", "h3", "h4"])
    seed(t, "h0", range(8), now=1.0)
    for peer in ("h2", "h3"):
        t.heartbeat(node=peer, now=1.5, chunks=[(i, None, "h0") for i in range(8)])
    for peer in ("h0", "h2", "h3"):
        t.report(reporter="bad", peer=peer, chunk=0, now=2.0)
    for name in ("h2", "h3", "h4"):
        t.heartbeat(node=name, now=2.5, chunks=[(0, None, "h0"), (1, None, "h2"), (2, None, "h3")])
    t.purge(now=2.5)
    assert t.discredited == {"bad"} and t.penalised == frozenset()
    # even with every credible node but one gone, the credible one gets the duty
    for name in ("h2", "h3", "h4", "bad"):
        t.heartbeat(node=name, now=11.5)
    t.purge(now=11.6)
    assert "h0" not in t.nodes and t.duty == ["h2"]
    for name in ("h3", "h4", "bad"):
        t.heartbeat(node=name, now=22.0)
    t.purge(now=22.1)
    assert "h2" not in t.nodes and t.duty == [
        "h3"
    ]  # bad (registered earlier) is passed over while someone credible is left


def test_a_discredited_duty_holder_gives_way_and_takes_duty_only_as_a_last_resort() -> None:
    t = swarm(["bad", "h1", "h2", "h3", "h4"])
    assert t.claim_origin(node="bad", count=2, now=1.0) == [0, 1]
    seed(t, "bad", range(4, 8), now=1.1)  # what it pulls from the origin is fine
    for name in ("h1", "h2"):
        t.heartbeat(node=name, now=1.2, chunks=[(i, None, "bad") for i in range(4, 8)])
    for peer in ("h1", "h2"):  # bad RAM: what it receives from peers fails verification
        t.report(reporter="bad", peer=peer, chunk=4, now=2.0)
    t.purge(now=2.0)
    assert t.duty == ["bad"]  # nothing contradicts it yet
    for fetcher in ("h3", "h4"):
        t.heartbeat(node=fetcher, now=2.1, chunks=[(4, None, "h1"), (5, None, "h2")])
    t.purge(now=2.1)
    assert t.discredited == {"bad"}
    assert t.duty == ["h1"] and t.assigned == {}  # its open assignments went with the duty
    t.heartbeat(node="bad", now=12.0)
    t.purge(now=12.5)
    assert list(t.nodes) == ["bad"] and t.duty == ["bad"]  # nobody credible left: better it than nobody


def test_a_dropped_chunk_is_no_longer_listed() -> None:
    t = swarm(["a", "b", "c"])
    seed(t, "a", range(3), now=1.0)
    t.heartbeat(node="b", now=1.1, chunks=[(0, None, "a"), (1, None, "a")])
    assert t.availability()[:3] == [2, 2, 1]
    t.heartbeat(node="b", now=1.2, dropped=[0, 2, 7])  # 2 and 7 it never held: ignored
    assert t.availability()[:3] == [1, 2, 1]
    assert "b" not in t.holders_of(0) and t.status(now=1.2)["nodes"]["b"]["chunks"] == 1
    t.heartbeat(node="b", now=1.3, dropped=[1], chunks=[(1, None, "a")])  # dropped, then fetched again
    assert t.availability()[1] == 2


def test_a_chunk_reported_bad_by_enough_nodes_is_unlisted_and_its_holder_told() -> None:
    t = swarm(["p", "a", "b", "c", "d", "e"])
    seed(t, "p", range(8), now=1.0)
    for fetcher in ("c", "d", "e"):  # p serves good chunks to many ...
        t.heartbeat(node=fetcher, now=1.5, chunks=[(1, None, "p")])
    for reporter in ("a", "b"):  # ... but its chunk 3 is corrupt at rest
        t.report(reporter=reporter, peer="p", chunk=3, now=2.0)
    t.purge(now=2.0)
    assert t.penalised == frozenset() and "p" not in t.holders_of(3)
    assert t.availability()[3] == 0
    assert t.heartbeat(node="p", now=2.1).suspect == [3]
    assert t.heartbeat(node="p", now=2.2).suspect == [3]  # told until it acts
    assert t.heartbeat(node="p", now=2.3, dropped=[3]).suspect == []
    t.heartbeat(node="p", now=2.4, chunks=[(3, None, "c")])  # repaired from a peer
    assert "p" in t.holders_of(3)
    assert t.heartbeat(node="p", now=2.5).suspect == []


def test_problem_and_revision_are_kept_until_changed() -> None:
    t = swarm(["a", "b"])
    full = tracker.Problem(reason="DiskFull", message="staging has 0 bytes free")
    t.heartbeat(node="b", now=1.0, problem=full, revision="r1")
    t.heartbeat(node="b", now=1.1)  # leaves both out: unchanged
    status = t.status(now=1.1)
    entry = status["nodes"]["b"]
    assert (entry["reason"], entry["message"], entry["revision"]) == ("DiskFull", "staging has 0 bytes free", "r1")
    assert status["nodes_problem"] == 1 and status["nodes"]["a"]["reason"] is None
    # The swarm's revision is the published one (test_tracker_revisions.py), not what nodes report.
    assert status["revision"] == t.revision and t.revision is not None and t.revision != "r1"
    t.heartbeat(node="b", now=1.3, problem=None)
    assert t.status(now=1.3)["nodes_problem"] == 0


# -- the scenarios, round by round ----------------------------------------------------


@dataclass
class Node:
    name: str
    bad_ram: bool = False  # every chunk it receives fails verification
    lies: bool = False  # every chunk it serves is corrupt
    have: set[int] = field(default_factory=set)
    news: list[tracker.Announcement] = field(default_factory=list)


@dataclass
class Rounds:
    """A swarm played in rounds against the real tracker: each round every node heartbeats,
    the duty holders pull what they were assigned, and every other node fetches one chunk."""

    t: tracker.Tracker
    nodes: dict[str, Node]
    chunks: int
    rng: random.Random = field(default_factory=lambda: random.Random(3))
    pulls: dict[int, int] = field(default_factory=dict)
    now: float = 1.0

    def join(self, node: Node) -> None:
        self.nodes[node.name] = node
        self.t.register(node=node.name, url=f"http://{node.name}", session="s", now=self.now)

    def play(self, rounds: int) -> None:
        for _ in range(rounds):
            self.now += 1.0
            for node in self.nodes.values():
                self.t.heartbeat(node=node.name, now=self.now, chunks=node.news)
                node.news = []
            for name in list(self.t.duty):
                self._pull(self.nodes[name])
            for node in self.nodes.values():
                self._fetch(node)
            self.t.purge(now=self.now)

    def _pull(self, node: Node) -> None:
        for index in self.t.claim_origin(node=node.name, count=2, now=self.now):
            self.pulls[index] = self.pulls.get(index, 0) + 1
            node.have.add(index)
            node.news.append((index, digest(index)))

    def _fetch(self, node: Node) -> None:
        wanted = [i for i in range(self.chunks) if i not in node.have and self.t.hashes[i] is not None]
        for index in self.rng.sample(wanted, len(wanted)):
            peers = self.t.peers(chunk=index, node=node.name, now=self.now, rng=self.rng)
            if not peers:
                continue
            source = self.nodes[peers[0].name]
            if node.bad_ram or source.lies:
                self.t.report(reporter=node.name, peer=source.name, chunk=index, now=self.now)
            else:
                node.have.add(index)
                node.news.append((index, None, source.name))
            return

    def complete(self, name: str) -> bool:
        return len(self.nodes[name].have) == self.chunks


def test_a_faulty_receiver_stalls_nobody_late_joiners_included() -> None:
    names = ["h0", "h1", "bad", "h3", "h4", "h5"]
    nodes = {n: Node(n, bad_ram=n == "bad") for n in names}
    rounds = Rounds(swarm(names, chunks=24), nodes, chunks=24)
    rounds.play(12)
    for late in ("late1", "late2"):
        rounds.join(Node(late))
    rounds.play(60)
    honest = [n for n in rounds.nodes if n != "bad"]
    assert [n for n in honest if not rounds.complete(n)] == []
    assert rounds.t.penalised == frozenset() and rounds.t.discredited == {"bad"}
    assert "bad" not in rounds.t.duty
    assert max(rounds.pulls.values()) == 1  # every chunk left the origin once


def test_a_lying_duty_holder_is_caught_and_its_chunks_pulled_by_someone_else() -> None:
    names = ["liar", "h1", "h2", "h3", "h4"]
    nodes = {n: Node(n, lies=n == "liar") for n in names}
    rounds = Rounds(swarm(names, chunks=24), nodes, chunks=24)
    rounds.play(80)
    honest = [n for n in names if n != "liar"]
    assert [n for n in honest if not rounds.complete(n)] == []
    assert rounds.t.penalised == {"liar"} and "liar" not in rounds.t.duty
    assert max(rounds.pulls.values()) <= 2  # pulled again only what the liar held


def test_availability_stays_equal_to_a_recount_through_trust_changes() -> None:
    rng = random.Random(11)
    names = [f"n{i}" for i in range(6)]
    t = swarm(names, window=30.0)
    now = 1.0
    for step in range(600):
        now += 0.1
        name = rng.choice(names)
        if name not in t.nodes:
            t.register(node=name, url="u", session=f"s{step}", now=now)
        action = rng.random()
        index = rng.randrange(8)
        if action < 0.5:
            source = rng.choice(names)
            t.heartbeat(node=name, now=now, chunks=[(index, digest(index) if name in t.duty else None, source)])
        elif action < 0.6:
            t.heartbeat(node=name, now=now, dropped=[index])
        elif action < 0.75:
            peer = rng.choice(names)
            if peer != name and (peer in t.nodes or peer in t.departed):
                t.report(reporter=name, peer=peer, chunk=index, now=now)
        else:
            t.purge(now=now)
        recount = [sum(1 for n in t.holders_of(i) if n not in t.penalised) for i in range(8)]
        assert t.availability() == recount
        assert all(n in t.duty for n in t.assigned.values())
        assert not set(t.duty) & t.penalised


def test_the_tracker_keeps_a_bounded_number_of_node_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracker, "MAX_NODES", 3)
    t = swarm(["a", "b"])
    t.heartbeat(node="a", now=11.0)
    t.purge(now=11.0)  # b departs, and is still a name the tracker keeps
    t.register(node="c", url="http://c", session="s", now=11.1)
    with pytest.raises(tracker.TrackerError, match="refusing a new name"):
        t.register(node="d", url="http://d", session="s", now=11.2)
    t.register(node="b", url="http://b", session="s2", now=11.3)  # a known name comes back
    assert sorted(t.nodes) == ["a", "b", "c"]


def test_one_batch_vouches_for_a_bounded_number_of_sources_and_later_ones_for_the_rest() -> None:
    holders = [f"h{i}" for i in range(20)]
    t = swarm(["s", *holders, "f"], chunks=20)
    seed(t, "s", range(20), now=1.0)
    for i, name in enumerate(holders):
        t.heartbeat(node=name, now=1.5, chunks=[(i, None, "s")])
    batch = [(i, None, name) for i, name in enumerate(holders)]  # f got chunk i from h_i
    t.heartbeat(node="f", now=2.0, chunks=batch)
    assert sum(t.trust.vouchers(h) for h in holders) == tracker.VOUCHES_PER_BATCH
    t.heartbeat(node="f", now=3.0, dropped=range(20))
    t.heartbeat(node="f", now=3.0, chunks=batch)  # the same batch again: the sources not vouched for yet
    t.heartbeat(node="f", now=4.0, dropped=range(20))
    t.heartbeat(node="f", now=4.0, chunks=batch)
    assert all(t.trust.vouchers(h) == 1 for h in holders)
