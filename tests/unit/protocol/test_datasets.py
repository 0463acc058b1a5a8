"""Datasets: files as chunk slices (small files packed), cluster-wide single flight per chunk, read-ahead."""

from __future__ import annotations

import pytest

from ringseed.protocol import datasets, manifest

MiB = 1 << 20


def layout() -> manifest.Layout:
    files = [(f"train/{i:05d}.jpg", 300_000 + i, 0o644) for i in range(10)] + [("big.bin", 3 * MiB + 5, 0o644)]
    return manifest.Layout.build(files, chunk_size=MiB)


def test_small_files_are_slices_of_shared_chunks_in_listing_order() -> None:
    lay = layout()
    first = datasets.segments(lay, "train/00000.jpg")
    second = datasets.segments(lay, "train/00001.jpg")
    assert [(s.chunk, s.offset, s.length) for s in first] == [(3, 5, 300_000)]  # right after big.bin
    assert sum(s.length for s in second) == 300_001
    # consecutive files continue in the same chunk where the previous one stopped
    assert second[0].chunk == first[-1].chunk and second[0].offset == first[-1].offset + first[-1].length
    big = datasets.segments(lay, "big.bin")
    assert [s.chunk for s in big] == [0, 1, 2, 3] and big[0].offset == 0 and sum(s.length for s in big) == 3 * MiB + 5
    with pytest.raises(KeyError):
        datasets.segments(lay, "missing")
    assert datasets.files_under(lay, "") == (["big.bin"], ["train"])
    train = {s.chunk for f in lay.files[1:] for s in datasets.segments(lay, f.path)}
    assert datasets.chunks_of(lay, ["train"]) == sorted(train)


def test_one_node_reads_a_chunk_from_the_source_the_others_wait_then_fetch_from_it() -> None:
    flights = datasets.Flights(claim_seconds=10.0)
    ask = dict(source="imagenet", revision="r1", chunk=3, chunk_count=8)
    assert flights.ask(**ask, node="a", holders=set(), online={"a", "b"}, now=0.0)[0] is datasets.Answer.FETCH
    answer, _, wait = flights.ask(**ask, node="b", holders=set(), online={"a", "b"}, now=1.0)
    assert answer is datasets.Answer.WAIT and 0 < wait <= datasets.POLL_SECONDS
    assert flights.learned(source="imagenet", revision="r1", chunk=3, chunk_count=8, sha="ab" * 32, node="a")
    assert flights.ask(**ask, node="b", holders={"a"}, online={"a", "b"}, now=2.0) == (
        datasets.Answer.PEERS,
        "ab" * 32,
        0.0,
    )
    # a different hash for the same chunk is refused (the first learned one stands)
    assert not flights.learned(source="imagenet", revision="r1", chunk=3, chunk_count=8, sha="cd" * 32, node="b")
    assert flights.referenced() == {"ab" * 32}


def test_a_claim_stands_while_its_node_is_online_and_passes_on_when_it_is_not() -> None:
    flights = datasets.Flights(claim_seconds=600.0)
    ask = dict(source="s", revision="r", chunk=0, chunk_count=1)
    everyone = {"a", "b", "c"}
    flights.ask(**ask, node="a", holders=set(), online=everyone, now=0.0)
    # a slow source read: a's claim stands as long as a is online (nobody reads the chunk twice)
    assert flights.ask(**ask, node="b", holders=set(), online=everyone, now=300.0)[0] is datasets.Answer.WAIT
    assert flights.ask(**ask, node="b", holders=set(), online={"b", "c"}, now=301.0)[0] is datasets.Answer.FETCH
    flights.release(source="s", revision="r", chunk=0, node="b")  # the source failed b
    assert flights.ask(**ask, node="c", holders=set(), online=everyone, now=302.0)[0] is datasets.Answer.FETCH
    flights.drop_claims("c")  # c's agent restarted and registered again: its claim is void
    assert flights.ask(**ask, node="a", holders=set(), online=everyone, now=303.0)[0] is datasets.Answer.FETCH
    # the cap: a claim that outlives claim_seconds passes on even though its node is online
    assert flights.ask(**ask, node="b", holders=set(), online=everyone, now=904.0)[0] is datasets.Answer.FETCH
    # the only holder being the asker itself is no source
    flights.learned(source="s", revision="r", chunk=0, chunk_count=1, sha="ab" * 32, node="b")
    assert flights.ask(**ask, node="b", holders={"b"}, online=everyone, now=905.0)[0] is datasets.Answer.FETCH
    with pytest.raises(IndexError):
        flights.ask(source="s", revision="r", chunk=5, chunk_count=1, node="a", holders=set(), online=everyone, now=0.0)


def test_old_revisions_are_forgotten_beyond_the_limit() -> None:
    flights = datasets.Flights()
    for i in range(datasets.MAX_REVISIONS_KEPT + 2):
        flights.learned(source="s", revision=f"r{i}", chunk=0, chunk_count=1, sha=f"{i:064x}", node="a")
    assert len(flights.revisions) == datasets.MAX_REVISIONS_KEPT
    assert flights.hashes("s", "r0") == {}


def test_read_ahead_starts_on_a_sequential_run_and_never_repeats() -> None:
    ahead = datasets.ReadAhead(depth=3, trigger=2)
    assert ahead.saw("f", 0, count=10) == []
    assert ahead.saw("f", 1, count=10) == [2, 3, 4]
    assert ahead.saw("f", 2, count=10) == [5]
    assert ahead.saw("f", 7, count=10) == []  # a jump: not sequential any more
    assert ahead.saw("f", 8, count=10) == [9]  # clipped at the end
