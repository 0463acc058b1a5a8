"""Manifest: layout, chunk pieces, hashes and digest, without sockets or files."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from ringseed.protocol import manifest

MI = 1 << 20


def _blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _manifest_of(files: dict[str, bytes], *, chunk_size: int) -> tuple[manifest.Manifest, bytes]:
    layout = manifest.Layout.build([(p, len(b), 0o644) for p, b in files.items()], chunk_size=chunk_size)
    stream = b"".join(files[f.path] for f in layout.files)
    hasher = manifest.ChunkHasher(chunk_size)
    hasher.update(stream)
    return manifest.Manifest(layout=layout, chunk_hashes=tuple(hasher.finish())), stream


def _assemble(layout: manifest.Layout, files: dict[str, bytes], index: int) -> bytes:
    out = bytearray(layout.chunk_length(index))
    for piece in layout.pieces(index):
        data = files[piece.path][piece.file_offset : piece.file_offset + piece.length]
        out[piece.chunk_offset : piece.chunk_offset + piece.length] = data
    return bytes(out)


def test_files_form_one_stream_in_sorted_path_order_cut_into_chunks() -> None:
    files = {"b/w.bin": _blob(1, MI + 100), "a.json": b"{}", "b/a.bin": _blob(2, 2 * MI)}
    m, stream = _manifest_of(files, chunk_size=MI)
    assert [f.path for f in m.layout.files] == ["a.json", "b/a.bin", "b/w.bin"]
    assert [f.offset for f in m.layout.files] == [0, 2, 2 + 2 * MI]
    assert m.layout.total_size == len(stream) == 3 * MI + 102
    assert m.layout.chunk_count == 4
    assert m.layout.chunk_length(3) == 102
    for i in range(m.layout.chunk_count):
        chunk = _assemble(m.layout, files, i)
        assert chunk == stream[i * MI : (i + 1) * MI]
        assert m.chunk_hashes[i] == hashlib.sha256(chunk).hexdigest()
        assert m.chunk_ok(i, chunk)
    assert not m.chunk_ok(0, b"x" * MI)


def test_empty_file_takes_no_bytes_and_appears_in_no_chunk() -> None:
    files = {"empty": b"", "weights": _blob(3, MI + 1), "z-empty": b""}
    m, _ = _manifest_of(files, chunk_size=MI)
    assert [(f.path, f.size, f.offset) for f in m.layout.files] == [
        ("empty", 0, 0),
        ("weights", MI + 1, 0),
        ("z-empty", 0, MI + 1),
    ]
    pieces = [p.path for i in range(m.layout.chunk_count) for p in m.layout.pieces(i)]
    assert pieces == ["weights", "weights"]


def test_exact_multiple_of_chunk_size_has_no_short_chunk() -> None:
    files = {"x": _blob(4, 2 * MI), "y": _blob(5, MI)}
    m, _ = _manifest_of(files, chunk_size=MI)
    assert m.layout.chunk_count == 3
    assert [m.layout.chunk_length(i) for i in range(3)] == [MI, MI, MI]
    assert m.layout.pieces(2) == [manifest.ChunkPiece(path="y", file_offset=0, length=MI, chunk_offset=0)]
    with pytest.raises(IndexError):
        m.layout.chunk_span(3)


def test_a_chunk_spanning_many_small_files_lists_each_slice() -> None:
    files = {f"shard-{i:02d}": _blob(i, 300_000) for i in range(5)}
    m, stream = _manifest_of(files, chunk_size=MI)
    pieces = m.layout.pieces(0)
    assert [p.path for p in pieces] == ["shard-00", "shard-01", "shard-02", "shard-03"]
    assert pieces[-1] == manifest.ChunkPiece(path="shard-03", file_offset=0, length=MI - 900_000, chunk_offset=900_000)
    assert _assemble(m.layout, files, 1) == stream[MI:]


def test_streaming_hasher_gives_the_same_hashes_for_any_feed_sizes() -> None:
    stream = _blob(6, 3 * MI + 7)
    whole = manifest.ChunkHasher(MI)
    whole.update(stream)
    pieces = manifest.ChunkHasher(MI)
    rng = random.Random(0)
    pos = 0
    while pos < len(stream):
        step = rng.randint(1, 400_000)
        pieces.update(memoryview(stream)[pos : pos + step])
        pos += step
    expected = [hashlib.sha256(stream[i : i + MI]).hexdigest() for i in range(0, len(stream), MI)]
    assert whole.finish() == pieces.finish() == expected


def test_unicode_and_nested_names_round_trip_through_json() -> None:
    files = {"模型/层 1/weights.bin": _blob(7, 1000), "é/ü/ß.txt": b"hello", "Zeta/a": b"1"}
    m, _ = _manifest_of(files, chunk_size=MI)
    assert [f.path for f in m.layout.files] == sorted(files)
    text = json.dumps(m.to_dict(), ensure_ascii=False)
    again = manifest.Manifest.from_dict(json.loads(text))
    assert again == m
    assert again.digest == m.digest


def test_digest_changes_with_any_content_and_is_checked_on_load() -> None:
    m, _ = _manifest_of({"a": _blob(8, 10), "b": _blob(9, 10)}, chunk_size=MI)
    d = m.to_dict()
    assert manifest.Manifest.from_dict(d).digest == d["digest"]
    for key, value in (("chunk_hashes", ["0" * 64]), ("files", [{"path": "a", "size": 20, "mode": 0o644}])):
        tampered = dict(d, **{key: value})
        with pytest.raises(manifest.ManifestError, match="digest"):
            manifest.Manifest.from_dict(dict(tampered, total_size=20))
    d2 = dict(d, files=[dict(f, mode=0o755) for f in d["files"]])
    with pytest.raises(manifest.ManifestError, match="digest"):
        manifest.Manifest.from_dict(d2)
    del d2["digest"]
    assert manifest.Manifest.from_dict(d2).digest != m.digest


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/etc/passwd", "absolute"),
        ("../secret", r"'\.\.'"),
        ("a/../../b", r"'\.\.'"),
        ("a//b", "empty part"),
        ("a/", "empty part"),
        ("", "non-empty"),
        ("a\\b", "backslash"),
        ("a\x00b", "NUL"),
        ("./a", "canonical"),
    ],
)
def test_bad_paths_are_rejected_naming_the_path(path: str, problem: str) -> None:
    with pytest.raises(manifest.ManifestError, match=problem) as info:
        manifest.Layout.build([(path, 10, 0o644), ("ok", 1, 0o644)], chunk_size=MI)
    assert repr(path) in str(info.value)


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(manifest.ManifestError, match=r"'w\.bin'.*duplicate"):
        manifest.Layout.build([("w.bin", 1, 0o644), ("a", 1, 0o644), ("w.bin", 2, 0o644)], chunk_size=MI)


def test_a_path_that_is_both_file_and_directory_is_rejected() -> None:
    with pytest.raises(manifest.ManifestError, match=r"'a/b'.*parent 'a'"):
        manifest.Layout.build([("a", 1, 0o644), ("a/b", 1, 0o644)], chunk_size=MI)


@pytest.mark.parametrize("entries", [[], [("empty", 0, 0o644)], [("a", 0, 0o644), ("b/c", 0, 0o644)]])
def test_empty_source_is_rejected(entries: list[tuple[str, int, int]]) -> None:
    with pytest.raises(manifest.ManifestError, match="source is empty"):
        manifest.Layout.build(entries, chunk_size=MI)


@pytest.mark.parametrize("chunk_size", [MI - 1, (1 << 30) + 1, 0, 4096])
def test_chunk_size_outside_1mi_to_1gi_is_rejected(chunk_size: int) -> None:
    with pytest.raises(manifest.ManifestError, match="chunk_size"):
        manifest.Layout.build([("a", 1, 0o644)], chunk_size=chunk_size)


def test_chunk_size_bounds_are_allowed_and_default_is_64mi() -> None:
    assert manifest.DEFAULT_CHUNK_SIZE == 64 * MI
    for size in (manifest.MIN_CHUNK_SIZE, manifest.MAX_CHUNK_SIZE):
        assert manifest.Layout.build([("a", 5 * size + 1, 0o644)], chunk_size=size).chunk_count == 6


@pytest.mark.parametrize(
    ("entry", "problem"),
    [(("a", -1, 0o644), "size"), (("a", 1, 0o17777), "mode"), (("a", 1.5, 0o644), "size"), (("a", 1, -1), "mode")],
)
def test_bad_size_or_mode_is_rejected(entry: tuple[str, int, int], problem: str) -> None:
    with pytest.raises(manifest.ManifestError, match=problem):
        manifest.Layout.build([entry], chunk_size=MI)


def test_modes_keep_permission_bits() -> None:
    layout = manifest.Layout.build([("run.sh", 3, 0o755), ("w", 3, 0o600)], chunk_size=MI)
    assert {f.path: f.mode for f in layout.files} == {"run.sh": 0o755, "w": 0o600}
    assert manifest.Layout.from_dict(layout.to_dict()) == layout


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.pop("chunk_hashes"), "chunk_hashes"),
        (lambda d: d.update(chunk_hashes=[]), "chunk_hashes: has 0 entries"),
        (lambda d: d.update(chunk_hashes=["ABC"]), r"chunk_hashes\[0\]"),
        (lambda d: d.update(files="nope"), "files"),
        (lambda d: d.update(files=[{"size": 3}]), r"files\[0\].*'path'"),
        (lambda d: d.update(version=99), "version"),
        (lambda d: d.update(total_size=5), "total_size"),
        (lambda d: d.pop("chunk_size"), "chunk_size"),
    ],
)
def test_malformed_manifest_names_the_problem(mutate: object, problem: str) -> None:
    m, _ = _manifest_of({"a": b"abc"}, chunk_size=MI)
    d = m.to_dict()
    del d["digest"]
    mutate(d)  # type: ignore[operator]
    with pytest.raises(manifest.ManifestError, match=problem):
        manifest.Manifest.from_dict(d)


def test_manifest_rejects_a_hash_list_of_the_wrong_length() -> None:
    layout = manifest.Layout.build([("a", 3 * MI, 0o644)], chunk_size=MI)
    with pytest.raises(manifest.ManifestError, match="3 chunks"):
        manifest.Manifest(layout=layout, chunk_hashes=("0" * 64,))
