"""Hashes on the wire as runs of binary digests: round trip, runs, size, and clear refusals."""

from __future__ import annotations

import hashlib
import json

import pytest

from ringseed.protocol import digests


def digest(index: int) -> str:
    return hashlib.sha256(b"%d" % index).hexdigest()


def test_runs_round_trip_and_cost_about_the_digest_itself() -> None:
    hashes = {i: digest(i) for i in [*range(100, 140), 7, 9, 10, 500]}
    runs = digests.pack(hashes)
    assert [run[0] for run in runs] == [7, 9, 100, 500]  # consecutive chunks share a run
    assert digests.unpack(json.loads(json.dumps(runs))) == hashes
    wire = len(json.dumps(runs, separators=(",", ":")))
    hex_map = len(json.dumps({str(i): h for i, h in hashes.items()}, separators=(",", ":")))
    assert wire < 0.62 * hex_map and wire < 46 * len(hashes)  # ~43 B a hash against ~72 B
    assert digests.pack({}) == [] and digests.unpack([]) == {}
    assert digests.pack({3: "", 4: digest(4)}) == [[4, digests.pack({0: digest(4)})[0][1]]]  # unknown: left out


@pytest.mark.parametrize(
    ("runs", "named"),
    [
        ({"0": "x"}, "must be a list"),
        ([[0]], r"hash_runs\[0\] must be"),
        ([["0", "AAAA"]], r"hash_runs\[0\] must be"),
        ([[True, "AAAA"]], r"hash_runs\[0\] must be"),
        ([[0, "not base64!"]], "not base64"),
        ([[0, "AAAA"]], "not a whole number of 32-byte digests"),
        ([[0, ""]], "not a whole number"),
        ([[-1, digests.pack({0: digest(0)})[0][1]]], "out of range"),
        ([[digests.MAX_INDEX, digests.pack({0: digest(0), 1: digest(1)})[0][1]]], "out of range"),
    ],
)
def test_bad_runs_are_refused_naming_the_problem(runs: object, named: str) -> None:
    with pytest.raises(digests.DigestError, match=named):
        digests.unpack(runs)


def test_learned_packs_from_the_binary_digests_as_pack_does_and_reads_as_a_mapping() -> None:
    hexes: list[str | None] = [format(i * 7919, "064x") for i in range(20)]
    hexes[4] = None
    raw = b"".join(bytes.fromhex(h) if h else bytes(32) for h in hexes)
    indices = [0, 1, 2, 5, 6, 9, 19]
    learned = digests.Learned(indices, hexes, raw)
    plain = {i: hexes[i] or "" for i in indices}
    assert learned == plain and dict(learned) == plain and len(learned) == 7
    assert learned.runs() == digests.pack(plain) == digests.packed(learned)
    assert digests.unpack(learned.runs()) == plain
    assert 4 not in learned and digests.Learned([], hexes, raw).runs() == []


def test_a_reply_with_hash_runs_spliced_in_is_the_json_of_the_whole() -> None:
    import json

    from ringseed.master import tracker as master

    out = {"epoch": "e", "version": 3, "avail": {"1": [4, 5]}, "hash_runs": digests.pack({7: "ab" * 32, 8: "cd" * 32})}
    assert json.loads(master._encode(dict(out))) == out
    assert json.loads(master._encode({"epoch": "e"})) == {"epoch": "e"}


def test_a_view_for_a_node_that_asked_for_index_runs_lists_chunks_as_runs() -> None:
    from ringseed.master import tracker as master
    from ringseed.protocol import tracker

    view = tracker.View(version=4, levels={1: [3, 4, 5, 9], 2: [7]}, pulling=[10, 11], pulling_stopped=[2])
    assert master._view(view, index_runs=True) == {
        "version": 4,
        "full": False,
        "index_runs": True,
        "avail": {"1": [[3, 3], [9, 1]], "2": [[7, 1]]},
        "pulling": [[10, 2]],
        "pulling_stopped": [[2, 1]],
    }
    assert master._view(view)["avail"] == {"1": [3, 4, 5, 9], "2": [7]}
