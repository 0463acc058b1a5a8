"""file:// origin: directories, single files, symlink rules, modes, chunk assembly."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

from ringseed.agent import origins
from ringseed.protocol import manifest
from tests.component.origins import servers

MI = 1 << 20


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    rng = random.Random(7)
    files = {"a/x.bin": rng.randbytes(MI + 17), "b.bin": rng.randbytes(600_000), "run.sh": b"#!/bin/sh\n", "e": b""}
    return servers.write_tree(tmp_path / "model", files, modes={"run.sh": 0o755})


async def test_directory_lists_nested_files_with_modes(tree: Path) -> None:
    origin = origins.open_origin(f"file://{tree}")
    listed = sorted(await origin.list_files())
    assert listed == [("a/x.bin", MI + 17, 0o644), ("b.bin", 600_000, 0o644), ("e", 0, 0o644), ("run.sh", 10, 0o755)]
    assert sorted(await origins.open_origin(str(tree)).list_files()) == listed


async def test_single_file_is_a_one_file_source(tree: Path) -> None:
    origin = origins.open_origin(f"file://{tree}/b.bin")
    assert await origin.list_files() == [("b.bin", 600_000, 0o644)]
    assert await origin.read("b.bin", 100, 5) == (tree / "b.bin").read_bytes()[100:105]
    with pytest.raises(origins.OriginError, match="one-file source"):
        await origin.read("run.sh", 0, 1)


async def test_read_chunk_assembles_chunks_across_files(tree: Path) -> None:
    origin = origins.open_origin(str(tree))
    layout = manifest.Layout.build(await origin.list_files(), chunk_size=MI)
    stream = b"".join((tree / f.path).read_bytes() for f in layout.files)
    chunks = [await origins.read_chunk(origin, layout, i) for i in range(layout.chunk_count)]
    assert b"".join(chunks) == stream
    assert len(chunks) == 2
    assert origin.bytes_read == len(stream)


async def test_symlink_inside_root_is_followed_under_its_own_name(tree: Path) -> None:
    os.symlink("a/x.bin", tree / "alias.bin")
    origin = origins.open_origin(str(tree))
    listed = dict((p, s) for p, s, _ in await origin.list_files())
    assert listed["alias.bin"] == listed["a/x.bin"]
    assert await origin.read("alias.bin", 0, 64) == (tree / "a/x.bin").read_bytes()[:64]


@pytest.mark.parametrize("absolute", [True, False], ids=["absolute-target", "relative-target"])
async def test_symlink_leaving_the_root_is_rejected_naming_it(tree: Path, absolute: bool) -> None:
    outside = tree.parent / "outside.bin"
    outside.write_bytes(b"secret")
    os.symlink(outside if absolute else "../../outside.bin", tree / "a" / "escape.bin")
    origin = origins.open_origin(str(tree))
    with pytest.raises(origins.OriginError, match=r"'a/escape\.bin' is a symlink leaving the source root"):
        await origin.list_files()
    with pytest.raises(origins.OriginError, match="leaving the source root"):
        await origin.read("a/escape.bin", 0, 1)


async def test_directory_symlink_and_dangling_symlink_are_rejected(tree: Path) -> None:
    os.symlink("a", tree / "dirlink")
    with pytest.raises(origins.OriginError, match="'dirlink' is a symlink to a directory"):
        await origins.open_origin(str(tree)).list_files()
    os.unlink(tree / "dirlink")
    os.symlink("nowhere", tree / "dangling")
    with pytest.raises(origins.OriginError, match="'dangling' is a dangling symlink"):
        await origins.open_origin(str(tree)).list_files()


async def test_reads_outside_the_tree_or_past_the_end_fail_clearly(tree: Path) -> None:
    origin = origins.open_origin(str(tree))
    with pytest.raises(origins.OriginError, match=r"'\.\.'"):
        await origin.read("../model/b.bin", 0, 1)
    with pytest.raises(origins.OriginError, match=r"'b\.bin' ended at 600000 bytes"):
        await origin.read("b.bin", 599_990, 20)
    with pytest.raises(origins.OriginError, match="no such file"):
        await origins.open_origin(str(tree / "missing")).list_files()


async def test_build_manifest_matches_hashlib_over_the_stream(tree: Path) -> None:
    origin = origins.open_origin(str(tree))
    built = await origins.build_manifest(origin, chunk_size=MI)
    stream = b"".join((tree / f.path).read_bytes() for f in built.layout.files)
    assert [f.path for f in built.layout.files] == ["a/x.bin", "b.bin", "e", "run.sh"]
    assert list(built.chunk_hashes) == [hashlib.sha256(stream[i : i + MI]).hexdigest() for i in (0, MI)]


async def test_unsupported_scheme_is_rejected() -> None:
    with pytest.raises(origins.OriginError, match="unsupported scheme 'ftp'"):
        origins.open_origin("ftp://host/model/")


async def test_hugging_face_snapshot_follows_links_into_its_blobs(tmp_path: Path) -> None:
    files = {"config.json": b'{"a": 1}', "model.safetensors": os.urandom(MI + 5), "tok/vocab.txt": b"x y"}
    snapshot = servers.hub_cache(tmp_path, files)
    origin = origins.open_origin(str(snapshot))
    assert sorted(await origin.list_files()) == sorted((p, len(d), 0o644) for p, d in files.items())
    layout = manifest.Layout.build(await origin.list_files(), chunk_size=MI)
    stream = b"".join([await origins.read_chunk(origin, layout, i) for i in range(layout.chunk_count)])
    assert stream == b"".join(files[f.path] for f in layout.files)  # names from the snapshot, bytes from blobs


async def test_hugging_face_snapshot_still_refuses_links_leaving_the_model_folder(tmp_path: Path) -> None:
    snapshot = servers.hub_cache(tmp_path, {"config.json": b"{}"})
    other = servers.hub_cache(tmp_path / "elsewhere", {"secret.bin": b"other model"})
    (snapshot / "stolen.bin").symlink_to(other / "secret.bin")
    with pytest.raises(origins.OriginError, match=r"'stolen\.bin' is a symlink leaving the model's hub cache folder"):
        await origins.open_origin(str(snapshot)).list_files()


async def test_a_folder_that_only_looks_like_a_snapshot_keeps_the_plain_root_rule(tmp_path: Path) -> None:
    snapshot = servers.hub_cache(tmp_path, {"config.json": b"{}"})
    (snapshot.parent.parent / "blobs").rename(snapshot.parent.parent / "not-blobs")
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(snapshot.parent.parent / "refs" / "main")
    with pytest.raises(origins.OriginError, match=r"'config\.json' is a symlink leaving the source root"):
        await origins.open_origin(str(snapshot)).list_files()


async def test_a_symlink_loop_is_named(tree: Path) -> None:
    (tree / "loop").symlink_to(tree / "loop")
    with pytest.raises(origins.OriginError, match="'loop' is a symlink loop"):
        await origins.open_origin(str(tree)).list_files()
