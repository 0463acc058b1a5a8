"""Reads pinned to a listed revision: a file that changed is reported, never read as a mix.

Every origin: the listing carries each file's identity (tag); a pinned read of a file that was
rewritten in place (same size), replaced (write + rename), resized, or rewritten while it was
being read raises ``SourceChanged`` naming the file; an unpinned read (building a manifest)
is unaffected. (File tags are ``mtime_ns``, the same for every node's copy made with its
times; the inode is checked on the reading node only. An in-place write within one clock tick of
the listing is seen because Linux >= 6.13 gives fine-grained mtimes to files whose times were
read; on older kernels such a write can go unseen without a manifest.)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ringseed.agent import origins
from ringseed.protocol import revision
from tests.component.origins import servers

MI = 1 << 20


def _tree(root: Path) -> Path:
    return servers.write_tree(root, {"a.bin": os.urandom(MI + 17), "d/b.bin": os.urandom(3 * MI)})


def _pins(listing: list[tuple[str, int, int, str]]) -> dict[str, tuple[int, str]]:
    return {path: (size, tag) for path, size, _, tag in listing}


def _rewrite_in_place(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(5)
        f.write(b"\xff")


def _replace(path: Path) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(os.urandom(path.stat().st_size))
    os.replace(tmp, path)


@pytest.mark.parametrize("change", [_rewrite_in_place, _replace, lambda p: os.truncate(p, MI)])
async def test_file_origin_refuses_a_file_changed_since_the_listing(tmp_path: Path, change: object) -> None:
    root = _tree(tmp_path / "src")
    origin = origins.open_origin(root.as_uri())
    listing = await origin.listing()
    assert {p for p, *_ in listing} == {"a.bin", "d/b.bin"} and all(tag for *_, tag in listing)
    origin.pin(_pins(listing))
    assert await origin.read("d/b.bin", MI, 10) == (root / "d/b.bin").read_bytes()[MI : MI + 10]
    change(root / "d/b.bin")  # type: ignore[operator]
    with pytest.raises(origins.SourceChanged, match=r"'d/b.bin' changed since it was listed") as caught:
        await origin.read("d/b.bin", 0, 10)
    assert caught.value.path == "d/b.bin"
    assert len(await origin.read("a.bin", 0, 10)) == 10  # other files still read fine
    origin.pin({})
    assert len(await origin.read("d/b.bin", 0, 10)) == 10  # unpinned: no check


async def test_file_copies_with_their_times_list_the_same_revision(tmp_path: Path) -> None:
    """Two nodes' copies (other inodes, same times: ``cp -p``, ``rsync -a``, a bucket's FUSE mount) are
    one revision, so a new origin-duty node confirms the revision another node listed."""
    root = _tree(tmp_path / "src")
    copy = shutil.copytree(root, tmp_path / "copy")
    assert (copy / "a.bin").stat().st_ino != (root / "a.bin").stat().st_ino
    ours = await origins.open_origin(root.as_uri()).listing()
    theirs = await origins.open_origin(copy.as_uri()).listing()
    assert sorted(ours) == sorted(theirs)
    of_listing = revision.Revision.of_listing
    assert of_listing(ours, chunk_size=MI).id == of_listing(theirs, chunk_size=MI).id
    reader = origins.open_origin(copy.as_uri())
    reader.pin(_pins(ours))  # pinned to the revision the other node listed: reads here pass
    assert await reader.read("d/b.bin", 0, 10) == (root / "d/b.bin").read_bytes()[:10]


@pytest.mark.parametrize("listed_here", [True, False], ids=["listed-here", "first-read"])
async def test_file_origin_refuses_a_replacement_that_kept_the_mtime(tmp_path: Path, listed_here: bool) -> None:
    root = _tree(tmp_path / "src")
    origin = origins.open_origin(root.as_uri())
    pins = _pins(await origins.open_origin(root.as_uri()).listing())
    if listed_here:
        await origin.listing()
    origin.pin(pins)
    assert len(await origin.read("d/b.bin", 0, 10)) == 10
    before = (root / "d/b.bin").stat()
    _replace(root / "d/b.bin")
    os.utime(root / "d/b.bin", ns=(before.st_atime_ns, before.st_mtime_ns))  # as ``cp -p`` of other bytes would
    with pytest.raises(origins.SourceChanged, match=r"'d/b.bin' was replaced since it was listed"):
        await origin.read("d/b.bin", 0, 10)


async def test_file_origin_notices_a_write_during_the_read(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    origin = origins.open_origin(root.as_uri())
    origin.pin(_pins(await origin.listing()))
    out = bytearray(3 * MI)
    seen: list[int] = []

    def progress(done: int) -> None:
        seen.append(done)
        if len(seen) == 1:
            _rewrite_in_place(root / "d/b.bin")  # lands while the rest of the range is being read

    reads = origin
    assert isinstance(reads, origins.base.ReadsInto)
    with pytest.raises(origins.SourceChanged):
        await reads.read_into("d/b.bin", 0, memoryview(out), progress=progress)


async def test_http_origin_pins_etags_and_refuses_changed_files(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    async with servers.FlakyHTTPOrigin(root) as server:
        origin = origins.open_origin(server.url, retry_base_delay=0.001)
        try:
            listing = await origin.listing()
            assert all(tag.startswith('etag:"') for *_, tag in listing)  # from a HEAD per file
            origin.pin(_pins(listing))
            assert await origin.read("a.bin", 0, 4) == (root / "a.bin").read_bytes()[:4]
            _rewrite_in_place(root / "a.bin")
            with pytest.raises(origins.SourceChanged, match="412"):
                await origin.read("a.bin", 0, 4)
            assert any(r[0] == "HEAD" for r in server.requests)
        finally:
            await origin.close()


async def test_http_origin_catches_a_change_a_server_ignores_or_one_during_the_body(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    async with servers.FlakyHTTPOrigin(root, conditional=False) as server:
        origin = origins.open_origin(server.url, retry_base_delay=0.001)
        try:
            origin.pin(_pins(await origin.listing()))
            _replace(root / "d/b.bin")  # this server ignores If-Match: the response's ETag tells
            with pytest.raises(origins.SourceChanged, match="changed since it was listed"):
                await origin.read("d/b.bin", 0, 4)
            origin.pin(_pins(await origin.listing()))
            server.after_get = lambda path: _rewrite_in_place(root / path)  # changes while served
            with pytest.raises(origins.SourceChanged, match="changed while it was read"):
                await origin.read("d/b.bin", 0, 4)
        finally:
            await origin.close()


async def test_http_origin_without_validators_still_checks_the_size(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    async with servers.FlakyHTTPOrigin(root, etags=False) as server:
        origin = origins.open_origin(server.url, retry_base_delay=0.001)
        try:
            listing = await origin.listing()
            assert all(tag == "" for *_, tag in listing)
            origin.pin(_pins(listing))
            (root / "a.bin").write_bytes(os.urandom(MI + 18))
            with pytest.raises(origins.SourceChanged, match="bytes now"):
                await origin.read("a.bin", 0, 4)
        finally:
            await origin.close()


async def test_s3_origin_pins_object_etags(s3_env: dict[str, str], s3_bucket: str) -> None:
    endpoint = s3_env["AWS_ENDPOINT_URL"]
    servers.put_objects(endpoint, s3_bucket, {"m/a.bin": os.urandom(MI), "m/b.bin": os.urandom(MI)})
    origin = origins.open_origin(f"s3://{s3_bucket}/m/", retry_base_delay=0.001)
    try:
        listing = await origin.listing()
        assert all(tag.startswith('etag:"') for *_, tag in listing)
        origin.pin(_pins(listing))
        assert len(await origin.read("a.bin", 0, 8)) == 8
        servers.put_objects(endpoint, s3_bucket, {"m/a.bin": os.urandom(MI)})  # same size, new object
        with pytest.raises(origins.SourceChanged):
            await origin.read("a.bin", 0, 8)
        assert len(await origin.read("b.bin", 0, 8)) == 8
    finally:
        await origin.close()
