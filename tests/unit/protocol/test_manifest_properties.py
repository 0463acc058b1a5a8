"""Property tests of the manifest and revision parsers (hypothesis): any input is either a valid,
self-consistent value or a ``ManifestError`` naming the problem; nothing else escapes, no path
that leaves the model tree or takes the marker's name gets through, and what parses round-trips."""

from __future__ import annotations

import json
import posixpath
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ringseed.protocol import manifest, revision

MiB = 1 << 20
SEGMENTS = st.sampled_from(["a", "b.bin", ".", "..", "", ".ringseed-complete", ".ringseed-x", "ü", "x\\y", "n\x00"])
PATHS = st.one_of(
    st.lists(SEGMENTS, min_size=1, max_size=4).map("/".join),
    st.lists(SEGMENTS, min_size=1, max_size=3).map(lambda p: "/" + "/".join(p)),
    st.text(max_size=20),
)
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _escapes(path: str) -> bool:
    normal = posixpath.normpath(path)
    return path.startswith("/") or normal == ".." or normal.startswith("../") or normal != path


@settings(max_examples=400)
@given(path=PATHS)
def test_validate_relpath_accepts_only_clean_relative_paths(path: str) -> None:
    try:
        assert manifest.validate_relpath(path) == path
    except manifest.ManifestError as exc:
        assert repr(path) in str(exc) or "non-empty string" in str(exc)
        return
    assert not _escapes(path) and "\\" not in path and "\x00" not in path and path


def _entry(path: Any, size: Any, mode: Any) -> dict[str, Any]:
    return {"path": path, "size": size, "mode": mode}


ENTRIES = st.lists(
    st.builds(
        _entry,
        PATHS,
        st.one_of(st.integers(-1, 3 * MiB), JUNK),
        st.one_of(st.sampled_from([0o644, 0o755, 0o7777, 0o10000, -1]), JUNK),
    ),
    max_size=5,
)
LAYOUTS = st.fixed_dictionaries(
    {"files": st.one_of(ENTRIES, JUNK)},
    optional={"chunk_size": st.one_of(st.sampled_from([MiB, 2 * MiB, MiB - 1, 1 << 31]), JUNK), "version": JUNK},
)


@settings(max_examples=400)
@given(doc=LAYOUTS)
def test_layout_from_dict_is_a_valid_layout_or_a_manifest_error(doc: dict[str, Any]) -> None:
    doc.setdefault("chunk_size", MiB)
    try:
        layout = manifest.Layout.from_dict(doc)
    except manifest.ManifestError:
        return
    paths = [f.path for f in layout.files]
    assert paths == sorted(set(paths)) and layout.total_size > 0
    assert not any(_escapes(p) or p.split("/")[0].startswith(manifest.RESERVED_PREFIX) for p in paths)
    assert sum(layout.chunk_length(i) for i in range(layout.chunk_count)) == layout.total_size
    assert manifest.Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout


@settings(max_examples=300)
@given(doc=LAYOUTS, hashes=st.one_of(st.lists(st.sampled_from(["ab" * 32, "AB" * 32, "x"]), max_size=6), JUNK))
def test_manifest_from_dict_checks_hashes_counts_and_digest(doc: dict[str, Any], hashes: Any) -> None:
    doc = dict(doc, chunk_size=MiB, chunk_hashes=hashes)
    try:
        parsed = manifest.Manifest.from_dict(doc)
    except manifest.ManifestError:
        return
    assert len(parsed.chunk_hashes) == parsed.layout.chunk_count
    round_trip = manifest.Manifest.from_dict(parsed.to_dict())
    assert round_trip == parsed and round_trip.digest == parsed.digest
    tampered = dict(parsed.to_dict(), digest="0" * 64)
    try:
        manifest.Manifest.from_dict(tampered)
    except manifest.ManifestError as exc:
        assert "digest" in str(exc)
    else:
        raise AssertionError("a wrong digest was accepted")


@settings(max_examples=300)
@given(doc=st.one_of(JUNK, st.fixed_dictionaries({"layout": LAYOUTS}, optional={"tags": JUNK, "id": JUNK})))
def test_revision_from_dict_is_a_consistent_revision_or_a_manifest_error(doc: Any) -> None:
    if isinstance(doc, dict) and isinstance(doc.get("layout"), dict):
        doc["layout"].setdefault("chunk_size", MiB)
    try:
        parsed = revision.Revision.from_dict(doc)
    except manifest.ManifestError:
        return
    assert len(parsed.tags) == len(parsed.layout.files) and len(parsed.id) == 64
    assert revision.Revision.from_dict(json.loads(json.dumps(parsed.to_dict()))) == parsed
