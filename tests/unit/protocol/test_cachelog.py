"""Cache metadata as a replicated log: commits, renames, deletes, persisted marks, retention, snapshots."""

from __future__ import annotations

import pytest

from ringseed.protocol import cachelog
from ringseed.protocol import cacheobjects as objects

A = "aa" * 32
B = "bb" * 32
C = "cc" * 32


def commit(
    meta: cachelog.Metadata, *files: tuple[str, list[list[object]]], write_id: str = "w", t: float = 1.0
) -> dict:
    entry = meta.prepare_commit(
        write_id=write_id,
        writer="n0",
        time=t,
        files=[{"path": p, "size": sum(int(c[1]) for c in ch), "chunks": ch} for p, ch in files],  # type: ignore[call-overload]
    )
    return meta.apply(meta.seq + 1, entry)


def test_commit_makes_objects_visible_with_the_entry_seq_as_version() -> None:
    meta = cachelog.Metadata()
    result = commit(meta, ("step-1/a.pt", [[A, 10], [B, 4]]), ("step-1/b.pt", []))
    assert result == {"versions": [1, 1], "duplicate": False}
    obj = meta.get("step-1/a.pt")
    assert obj.size == 14 and obj.version == 1 and [c.sha256 for c in obj.chunks] == [A, B]
    assert meta.get("step-1/b.pt").size == 0
    assert obj.chunk_spans() == [(0, 10), (10, 14)]


def test_a_retried_write_id_commits_nothing_twice() -> None:
    meta = cachelog.Metadata()
    commit(meta, ("x", [[A, 1]]), write_id="same")
    again = commit(meta, ("x", [[B, 1]]), write_id="same")
    assert again["duplicate"] and again["versions"] == [1]
    assert meta.get("x").chunks[0].sha256 == A


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../etc/passwd", "'..'"),
        ("a/../../b", "'..'"),
        ("data/x", "read-only"),
        ("a//b", "empty part"),
        ("a\\b", "backslash"),
        ("", "non-empty"),
    ],
)
def test_paths_that_leave_the_tree_or_touch_data_are_refused(path: str, problem: str) -> None:
    meta = cachelog.Metadata()
    with pytest.raises(cachelog.MetaError, match=problem):
        meta.prepare_commit(write_id="w", writer="n0", time=0, files=[{"path": path, "size": 1, "chunks": [[A, 1]]}])
    assert meta.objects == {} and meta.seq == 0


def test_size_must_match_chunks_and_hashes_must_be_hex() -> None:
    meta = cachelog.Metadata()
    with pytest.raises(cachelog.MetaError, match="size says 5"):
        meta.prepare_commit(write_id="w", writer="n", time=0, files=[{"path": "a", "size": 5, "chunks": [[A, 4]]}])
    with pytest.raises(cachelog.MetaError, match="SHA-256"):
        meta.prepare_commit(write_id="w", writer="n", time=0, files=[{"path": "a", "size": 4, "chunks": [["XY", 4]]}])


def test_file_and_directory_cannot_share_a_name() -> None:
    meta = cachelog.Metadata()
    commit(meta, ("ck/a", [[A, 1]]))
    with pytest.raises(cachelog.Conflict, match="directory"):
        meta.prepare_commit(write_id="w2", writer="n", time=0, files=[{"path": "ck", "size": 1, "chunks": [[A, 1]]}])
    with pytest.raises(cachelog.Conflict, match="parent"):
        meta.prepare_commit(
            write_id="w3", writer="n", time=0, files=[{"path": "ck/a/b", "size": 1, "chunks": [[A, 1]]}]
        )


def test_rename_file_and_directory_atomically() -> None:
    meta = cachelog.Metadata()
    commit(meta, ("ck/.metadata.tmp", [[A, 3]]), ("ck/0.distcp", [[B, 2]]))
    meta.apply(meta.seq + 1, meta.prepare_rename(src="ck/.metadata.tmp", dst="ck/.metadata"))
    assert "ck/.metadata" in meta.objects and "ck/.metadata.tmp" not in meta.objects
    meta.apply(meta.seq + 1, meta.prepare_rename(src="ck", dst="final"))
    assert sorted(meta.objects) == ["final/.metadata", "final/0.distcp"]
    with pytest.raises(cachelog.NotFound):
        meta.prepare_rename(src="nothing", dst="x")
    with pytest.raises(cachelog.MetaError, match="into itself"):
        meta.prepare_rename(src="final", dst="final/sub")


def test_delete_file_and_directory() -> None:
    meta = cachelog.Metadata()
    commit(meta, ("a/1", [[A, 1]]), ("a/2", [[B, 1]]), ("b", [[C, 1]]))
    with pytest.raises(cachelog.MetaError, match="recursively"):
        meta.prepare_delete(path="a", recursive=False)
    assert meta.apply(meta.seq + 1, meta.prepare_delete(path="a", recursive=True)) == {"deleted": 2}
    assert sorted(meta.objects) == ["b"]
    assert meta.referenced() == {C}


def test_persisted_mark_applies_to_its_version_only() -> None:
    meta = cachelog.Metadata()
    commit(meta, ("x", [[A, 1]]), write_id="1")
    old = meta.get("x").version
    commit(meta, ("x", [[B, 1]]), write_id="2")
    assert meta.prepare_persisted(path="x", version=old) is None
    entry = meta.prepare_persisted(path="x", version=meta.get("x").version)
    assert entry is not None
    meta.apply(meta.seq + 1, entry)
    assert meta.get("x").persisted
    assert meta.prepare_persisted(path="x", version=meta.get("x").version) is None


def test_follower_replaying_the_entries_ends_identical_and_snapshots_round_trip() -> None:
    leader, follower = cachelog.Metadata(), cachelog.Metadata()
    entries = []
    for i in range(5):
        entry = leader.prepare_commit(
            write_id=f"w{i}", writer="n0", time=float(i), files=[{"path": f"s{i}/m", "size": 2, "chunks": [[A, 2]]}]
        )
        leader.apply(leader.seq + 1, entry)
        entries.append((leader.seq, entry))
    rename = leader.prepare_rename(src="s0", dst="t0")
    leader.apply(leader.seq + 1, rename)
    entries.append((leader.seq, rename))
    for seq, entry in entries:
        follower.apply(seq, entry)
    assert follower.snapshot() == leader.snapshot()
    assert cachelog.Metadata.from_snapshot(leader.snapshot()).snapshot() == leader.snapshot()
    with pytest.raises(ValueError, match="does not follow"):
        follower.apply(follower.seq + 2, rename)


def test_retention_keeps_the_newest_and_never_drops_unpersisted_with_a_sink() -> None:
    meta = cachelog.Metadata()
    for i in range(4):
        commit(meta, (f"step-{i}/m", [[A, 1]]), write_id=f"w{i}")
    assert cachelog.retention(meta, keep=2, sink=False) == ["step-1", "step-0"]
    assert cachelog.retention(meta, keep=2, sink=True) == []
    entry = meta.prepare_persisted(path="step-0/m", version=meta.get("step-0/m").version)
    assert entry is not None
    meta.apply(meta.seq + 1, entry)
    assert cachelog.retention(meta, keep=2, sink=True) == ["step-0"]
    assert cachelog.retention(meta, keep=0, sink=False) == []


def test_listing_and_chunk_ranges() -> None:
    files, dirs = objects.listing(["a/b/c", "a/d", "e"], "a")
    assert files == ["a/d"] and dirs == ["a/b"]
    assert objects.listing(["a/b/c", "e"], "") == (["e"], ["a"])
    spans = [(0, 10), (10, 20), (20, 25)]
    assert list(objects.chunk_range(spans, 5, 15)) == [0, 1]
    assert list(objects.chunk_range(spans, 20, 25)) == [2]
    assert list(objects.chunk_range(spans, 3, 3)) == []
    assert objects.checkpoint_of("step-1/x/y") == "step-1"
