"""Trust rules without a tracker: distinct reporters, vouches, decay, credibility, suspect copies."""

from __future__ import annotations

import pytest

from ringseed.protocol import trust


def vouch_all(t: trust.Trust, peer: str, fetchers: list[str], now: float) -> None:
    for fetcher in fetchers:
        t.vouch(fetcher=fetcher, peer=peer, now=now)


def test_one_reporter_never_penalises_however_often_it_reports() -> None:
    t = trust.Trust()
    for i in range(50):
        t.report(reporter="r", peer="p", chunk=i % 3, now=float(i))
    verdict = t.judge(now=50.0)
    assert verdict.penalised == frozenset() and verdict.suspect == frozenset()
    assert set(t.reported_by("r")) == {"p"}  # but r itself is never offered p again


def test_two_distinct_reporters_penalise_a_peer_nobody_vouches_for() -> None:
    t = trust.Trust()
    t.report(reporter="a", peer="liar", chunk=0, now=1.0)
    assert t.judge(now=1.0).penalised == frozenset()
    t.report(reporter="b", peer="liar", chunk=5, now=2.0)
    assert t.judge(now=2.0).penalised == {"liar"}


def test_more_witnesses_can_be_required() -> None:
    t = trust.Trust(witnesses=3)
    for reporter in ("a", "b"):
        t.report(reporter=reporter, peer="p", chunk=0, now=1.0)
    assert t.judge(now=1.0).penalised == frozenset()
    t.report(reporter="c", peer="p", chunk=0, now=1.0)
    assert t.judge(now=1.0).penalised == {"p"}
    with pytest.raises(ValueError, match="at least 2"):
        trust.Trust(witnesses=1)


def test_serving_verified_chunks_to_others_clears_a_penalty() -> None:
    t = trust.Trust()
    for reporter in ("a", "b"):
        t.report(reporter=reporter, peer="p", chunk=0, now=1.0)
    assert t.judge(now=1.0).penalised == {"p"}
    t.vouch(fetcher="c", peer="p", now=2.0)  # fewer vouchers than reporters: still penalised
    assert t.judge(now=2.0).penalised == {"p"}
    t.vouch(fetcher="d", peer="p", now=3.0)  # as many: the benefit of the doubt goes to the peer
    assert t.judge(now=3.0).penalised == frozenset()


def test_evidence_decays_after_the_window() -> None:
    t = trust.Trust(window=100.0)
    t.report(reporter="a", peer="p", chunk=0, now=0.0)
    t.report(reporter="b", peer="p", chunk=0, now=50.0)
    assert t.judge(now=99.0).penalised == {"p"}
    assert t.judge(now=100.5).penalised == frozenset()  # a's report is older than the window
    assert set(t.reported_by("a")) == set()
    t.report(reporter="a", peer="p", chunk=1, now=120.0)  # lies again: caught again
    assert t.judge(now=120.0).penalised == {"p"}
    assert t.judge(now=220.5).penalised == frozenset()


def test_a_repeated_report_refreshes_its_age() -> None:
    t = trust.Trust(window=100.0)
    for now in (0.0, 80.0):
        t.report(reporter="a", peer="p", chunk=0, now=now)
    t.report(reporter="b", peer="p", chunk=0, now=90.0)
    assert t.judge(now=150.0).penalised == {"p"}


def test_a_receiver_that_always_fails_verification_is_discredited() -> None:
    t = trust.Trust()
    honest = ["h1", "h2", "h3", "h4"]
    # bad RAM: every chunk it receives fails, so it reports every holder it tries
    t.report(reporter="bad", peer="h1", chunk=0, now=1.0)
    t.report(reporter="bad", peer="h2", chunk=1, now=1.0)
    assert t.judge(now=1.0).discredited == frozenset()  # nothing contradicts it yet
    for fetcher in honest:  # the others verify chunks from h1 and h2
        t.vouch(fetcher=fetcher, peer="h1", now=2.0)
        t.vouch(fetcher=fetcher, peer="h2", now=2.0)
    assert t.judge(now=2.0).discredited == {"bad"}
    # its reports no longer count: with one more reporter h1 would otherwise be penalised
    t.report(reporter="h3", peer="h2", chunk=4, now=3.0)
    t.report(reporter="h4", peer="h1", chunk=4, now=3.0)
    assert t.judge(now=3.0).penalised == frozenset()


def test_two_faulty_receivers_cannot_remove_an_honest_peer_others_verify() -> None:
    t = trust.Trust()
    for bad in ("bad1", "bad2"):
        for peer in ("h1", "h2"):
            t.report(reporter=bad, peer=peer, chunk=0, now=1.0)
    assert t.judge(now=1.0).penalised == {"h1", "h2"}  # before anyone contradicts them
    for fetcher in ("h3", "h4", "h5"):
        t.vouch(fetcher=fetcher, peer="h1", now=2.0)
        t.vouch(fetcher=fetcher, peer="h2", now=2.0)
    verdict = t.judge(now=2.0)
    assert verdict.penalised == frozenset() and verdict.discredited == {"bad1", "bad2"}


def test_an_honest_node_that_met_liars_stays_credible() -> None:
    t = trust.Trust()
    # h1 met two liars that serve good chunks to some nodes (so others vouch for them) ...
    for liar in ("l1", "l2"):
        t.report(reporter="h1", peer=liar, chunk=0, now=1.0)
        vouch_all(t, liar, ["x", "y"], now=1.0)
    # ... and verified chunks from three honest peers
    for peer in ("p1", "p2", "p3"):
        t.vouch(fetcher="h1", peer=peer, now=1.0)
    assert t.judge(now=1.0).discredited == frozenset()


def test_chunk_reported_by_enough_credible_reporters_is_suspect_until_spent() -> None:
    t = trust.Trust()
    vouch_all(t, "p", ["v1", "v2", "v3", "v4"], now=0.0)  # p serves most chunks well
    t.report(reporter="a", peer="p", chunk=7, now=1.0)
    t.report(reporter="b", peer="p", chunk=8, now=1.0)  # another chunk: no chunk has two reports
    assert t.judge(now=1.0).suspect == frozenset()
    t.report(reporter="b", peer="p", chunk=7, now=2.0)
    verdict = t.judge(now=2.0)
    assert verdict.suspect == {("p", 7)} and verdict.penalised == frozenset()  # one bad copy, an honest node
    t.spend(peer="p", chunk=7)
    assert t.judge(now=2.0).suspect == frozenset()
    t.report(reporter="c", peer="p", chunk=7, now=3.0)  # a re-announced copy starts afresh
    assert t.judge(now=3.0).suspect == frozenset()


def test_reports_of_discredited_reporters_make_no_chunk_suspect() -> None:
    t = trust.Trust()
    for peer in ("h1", "h2"):
        t.report(reporter="bad", peer=peer, chunk=3, now=1.0)
        vouch_all(t, peer, ["v1", "v2"], now=1.0)
    t.report(reporter="other", peer="h1", chunk=3, now=1.0)
    verdict = t.judge(now=1.0)
    assert verdict.discredited == {"bad"} and verdict.suspect == frozenset()


def test_nobody_reports_or_vouches_for_itself() -> None:
    t = trust.Trust()
    t.report(reporter="a", peer="a", chunk=0, now=0.0)
    t.vouch(fetcher="a", peer="a", now=0.0)
    assert t.reported_by("a") == {} and t.vouchers("a") == 0


def test_vouch_memory_is_bounded_per_node() -> None:
    t = trust.Trust(cap=4)
    for i in range(100):
        t.vouch(fetcher=f"f{i}", peer="p", now=float(i))
        t.vouch(fetcher="f", peer=f"p{i}", now=float(i))
    assert t.vouchers("p") == 4


def test_vouches_decay_too() -> None:
    t = trust.Trust(window=160.0)
    vouch_all(t, "p", ["v1", "v2", "v3"], now=0.0)
    for reporter in ("a", "b"):
        t.report(reporter=reporter, peer="p", chunk=0, now=100.0)
    assert t.judge(now=100.0).penalised == frozenset()
    assert t.judge(now=171.0).penalised == {"p"}  # the vouches are older than the window


def test_a_vouch_seen_again_outlives_later_ones_that_were_not() -> None:
    """Expiry walks each node's vouches oldest sight first and stops at the first live one: a
    vouch refreshed after others moves behind them, the ones before it go, it stays."""
    t = trust.Trust(window=640.0)
    vouch_all(t, "p", ["v1", "v2", "v3"], now=0.0)
    t.vouch(fetcher="v1", peer="p", now=100.0)  # v1 seen again: after v2 and v3
    t.expire(now=645.0)  # v2 and v3 (seen at 0) are older than the window, v1 (100) is not
    assert t.vouchers("p") == 1 and set(t._vouchers_of.of("p")) == {"v1"}
    assert set(t._vouched_by.of("v1")) == {"p"} and t._vouched_by.of("v2") == {}
    t.expire(now=745.0)
    assert t.vouchers("p") == 0 and t._vouched_by.by_subject == {}


def test_a_vouch_repeated_within_a_64th_of_the_window_is_not_recorded_again() -> None:
    t = trust.Trust(window=640.0)
    vouch_all(t, "p", ["v1", "v2", "v3"], now=0.0)
    vouch_all(t, "p", ["v1", "v2", "v3"], now=9.0)  # within 640 / 64: not written again
    for reporter in ("a", "b"):
        t.report(reporter=reporter, peer="p", chunk=0, now=600.0)
    assert t.judge(now=600.0).penalised == frozenset()
    assert t.judge(now=641.0).penalised == {"p"}  # aged from the first vouch: 9 s more would have held
    vouch_all(t, "p", ["v1", "v2", "v3"], now=651.0)  # past the 64th: recorded, and it clears p
    assert t.judge(now=651.0).penalised == frozenset()


def test_reported_copies_are_bounded_and_the_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trust, "MAX_CHUNK_REPORTS", 3)
    t = trust.Trust()
    vouch_all(t, "p", ["v1", "v2", "v3"], now=0.0)
    for chunk in range(5):  # chunks 0 and 1 fall out of the ledger
        t.report(reporter="a", peer="p", chunk=chunk, now=1.0)
    for chunk in (0, 4):
        t.report(reporter="b", peer="p", chunk=chunk, now=2.0)
    assert t.judge(now=2.0).suspect == {("p", 4)}
