"""Source revisions without I/O: ids, validation, what survives a change, what may be proven."""

from __future__ import annotations

import random

import pytest

from ringseed.protocol import manifest, revision

MiB = 1 << 20


def listing(**changes: tuple[int, str]) -> revision.Revision:
    files = {"a.bin": (3 * MiB + 5, "1:10"), "b.bin": (2 * MiB, "2:11"), "c/d.bin": (MiB // 2, "3:12")}
    files.update(changes)
    return revision.Revision.of_listing([(p, s, 0o644, t) for p, (s, t) in files.items()], chunk_size=MiB)


def test_a_listing_id_changes_with_any_file_size_or_tag() -> None:
    base = listing()
    assert listing().id == base.id and len(base.id) == 64
    assert listing(**{"b.bin": (2 * MiB, "2:99")}).id != base.id  # rewritten in place: new mtime
    assert listing(**{"b.bin": (2 * MiB + 1, "2:11")}).id != base.id  # new size
    untagged = revision.Revision(layout=base.layout)
    assert untagged.tags == ("", "", "") and untagged.id != base.id


def test_a_manifest_revision_is_named_by_its_digest_and_pins_nothing() -> None:
    layout = listing().layout
    published = manifest.Manifest(layout=layout, chunk_hashes=tuple("ab" * 32 for _ in range(layout.chunk_count)))
    rev = revision.Revision.of_manifest(published)
    assert rev.id == published.digest and rev.pins() == {}
    assert revision.Revision.from_dict(rev.to_dict()) == rev


def test_from_dict_round_trips_and_refuses_a_wrong_id_or_bad_tags() -> None:
    rev = listing()
    assert revision.Revision.from_dict(rev.to_dict()) == rev
    assert rev.pins()["a.bin"] == (3 * MiB + 5, "1:10")
    with pytest.raises(manifest.ManifestError, match="does not match its content"):
        revision.Revision.from_dict(dict(rev.to_dict(), id="0" * 64))
    with pytest.raises(manifest.ManifestError, match="3 files"):
        revision.Revision.from_dict(dict(rev.to_dict(), tags=["x"], id=None) | {"id": rev.id})
    with pytest.raises(manifest.ManifestError, match="unusable tag"):
        revision.Revision(layout=rev.layout, tags=("a", "b\n", "c"))
    with pytest.raises(manifest.ManifestError, match="layout must be"):
        revision.Revision.from_dict({"layout": None})
    with pytest.raises(manifest.ManifestError, match="not a revision id"):
        revision.check_id("ABC")


def test_reuse_candidates_are_chunks_inside_bytes_verified_at_the_same_path() -> None:
    old = listing()
    # Chunks 0-3 of the old layout cover a.bin [0, 3Mi+5) and b.bin [0, 1Mi-5): a.bin whole, b.bin in part.
    ranges = revision.verified_ranges(old.layout, [0, 1, 2, 3])
    assert ranges == {"a.bin": [(0, 3 * MiB + 5)], "b.bin": [(0, MiB - 5)]}
    # a.bin grew by one MiB at its end: b.bin's bytes now start one MiB later in the stream.
    new = listing(**{"a.bin": (4 * MiB + 5, "1:77")}).layout
    candidates = revision.reuse_candidates(new, ranges)
    assert candidates == {0, 1, 2}  # chunk 3 reaches a.bin's new bytes; later ones need more of b.bin


def test_only_candidates_in_unchanged_files_are_provable() -> None:
    old = listing()
    new = listing(**{"a.bin": (3 * MiB + 5, "1:77")})  # a.bin rewritten, same size
    unchanged = revision.unchanged_files(old, new)
    assert unchanged == {"b.bin", "c/d.bin"}
    candidates = revision.reuse_candidates(new.layout, revision.verified_ranges(old.layout, range(6)))
    assert candidates == set(range(6))
    provable = {i for i in range(6) if revision.provable(new.layout, i, candidates=candidates, unchanged=unchanged)}
    assert provable == {4, 5}  # chunk 3 holds the end of a.bin
    assert revision.unchanged_files(revision.Revision(layout=old.layout), revision.Revision(layout=old.layout)) == set()


def test_prior_chunks_map_new_chunk_bytes_to_the_old_chunks_that_held_them() -> None:
    old = listing().layout
    new = listing(**{"a.bin": (3 * MiB + MiB // 2 + 5, "1:77")}).layout  # a.bin grew by half a MiB
    # New chunk 4 is b.bin [Mi/2 - 5, 3Mi/2 - 5): old stream [7Mi/2, 9Mi/2), old chunks 3 and 4.
    assert revision.prior_chunks(old, new, 4) == {3, 4}
    assert revision.prior_chunks(old, new, 3) is None  # a.bin's new bytes lie beyond its old end


def test_source_checks_come_every_interval_and_back_off_while_they_fail() -> None:
    checks = revision.SourceChecks(interval=300.0, cap=1200.0, rng=random.Random(7))
    assert not checks.due(1000.0)  # the first call starts the clock
    assert not checks.due(1299.9) and checks.due(1300.0)
    checks.read(1300.0)  # a check (or a take) read the source: the next one an interval later
    assert not checks.due(1599.9) and checks.due(1600.0)
    waits = [checks.failed(1600.0) for _ in range(5)]
    bounds = [(150.0, 300.0), (300.0, 600.0), (600.0, 1200.0), (600.0, 1200.0), (600.0, 1200.0)]
    assert all(low <= wait <= high for wait, (low, high) in zip(waits, bounds, strict=True)), waits
    assert checks.failures == 5 and not checks.due(1600.0 + waits[-1] - 0.1) and checks.due(1600.0 + waits[-1])
    checks.read(5000.0)  # a check that read the source forgets the failures
    assert checks.failures == 0 and not checks.due(5299.9) and checks.due(5300.0)
    with pytest.raises(ValueError, match="0 < interval <= cap"):
        revision.SourceChecks(interval=0.0, cap=10.0)
