"""Staging and publishing in process, on real files: revisions kept by path, copy before writing
through a link, drops in the journal, the disk budget, the marker, fingerprints and leftovers."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from ringseed.agent import publish, store
from ringseed.protocol import manifest, revision
from tests.waiting import wait_for

MiB = 1 << 20


def _rev(sizes: dict[str, int], tag: str = "t") -> revision.Revision:
    return revision.Revision.of_listing([(p, s, 0o644, f"{tag}-{p}") for p, s in sizes.items()], chunk_size=MiB)


def _fill(staging: store.Store, data: dict[str, bytes]) -> dict[int, str]:
    """Write every chunk of ``data`` (path -> bytes, in the staging's layout) and journal it."""
    layout = staging.layout
    assert layout is not None
    stream = b"".join(data[f.path] for f in layout.files)
    held = {}
    for index in range(layout.chunk_count):
        start, end = layout.chunk_span(index)
        staging.write_chunk(index, stream[start:end])
        held[index] = manifest.chunk_sha256(stream[start:end])
    staging.commit(held.items())
    return held


def test_moving_to_another_revision_keeps_files_by_path_and_names_the_verified_bytes(tmp_path: Path) -> None:
    old = _rev({"a.bin": 2 * MiB, "b.bin": MiB + 10, "gone.bin": 5})
    data = {"a.bin": os.urandom(2 * MiB), "b.bin": os.urandom(MiB + 10), "gone.bin": b"12345"}
    staging = store.Store(tmp_path / "cache")
    staging.open(old)
    held = _fill(staging, data)
    staging.close()
    new = _rev({"a.bin": 2 * MiB, "b.bin": MiB + 20, "c.bin": 7}, tag="u")  # b grew, gone.bin went, c.bin came
    again = store.Store(tmp_path / "cache")
    opened = again.open(new)
    assert opened.verified == {}  # the journal belongs to the old revision
    assert opened.prior is not None and opened.prior.held == held and opened.prior.revision == old
    assert opened.kept == {"a.bin": [(0, 2 * MiB)], "b.bin": [(0, MiB + 10)]}
    assert not (tmp_path / "cache" / "files" / "gone.bin").exists()
    assert (tmp_path / "cache" / "files" / "b.bin").read_bytes()[: MiB + 10] == data["b.bin"]
    assert again.saved_revision() == new
    assert revision.reuse_candidates(new.layout, opened.kept) == {0, 1, 2}  # chunk 3 has b.bin's new end
    again.close()


def test_bytes_kept_from_the_previous_revision_stay_candidates_after_a_restart(tmp_path: Path) -> None:
    """An agent killed after moving to a new revision (a master restart, a new origin-duty node, a
    changed file) restarts on the same revision: the journal has what it verified since, and the
    previous revision's kept bytes it had not checked yet are named again (not fetched again)."""
    old = _rev({"a.bin": 2 * MiB, "b.bin": MiB + 10})
    data = {"a.bin": os.urandom(2 * MiB), "b.bin": os.urandom(MiB + 10)}
    staging = store.Store(tmp_path / "cache")
    staging.open(old)
    _fill(staging, data)
    staging.close()
    new = _rev({"a.bin": 2 * MiB, "b.bin": MiB + 10}, tag="u")  # the same bytes, listed with other tags
    moved = store.Store(tmp_path / "cache")
    first = moved.open(new)
    assert revision.reuse_candidates(new.layout, first.kept) == {0, 1, 2, 3}
    moved.write_chunk(0, data["a.bin"][:MiB])  # checked by hash and journaled, then the agent dies
    moved.commit([(0, manifest.chunk_sha256(data["a.bin"][:MiB]))])
    moved.close()
    restarted = store.Store(tmp_path / "cache")
    again = restarted.open(new)
    assert set(again.verified) == {0}
    assert again.prior == first.prior and again.kept == first.kept
    assert revision.reuse_candidates(new.layout, again.kept) - set(again.verified) == {1, 2, 3}
    restarted.close()


def test_a_write_never_goes_through_a_link_into_a_published_model(tmp_path: Path) -> None:
    rev = _rev({"a.bin": 2 * MiB})
    staging = store.Store(tmp_path / "cache")
    staging.open(rev)
    held = _fill(staging, {"a.bin": bytes(2 * MiB)})
    model = tmp_path / "data" / "ns" / "m"
    digest = manifest.Manifest(layout=rev.layout, chunk_hashes=tuple(held[i] for i in range(2))).digest
    assert publish.materialise(staging, model_dir=model, digest=digest, revision_id=rev.id)
    assert os.stat(model / "a.bin").st_ino == os.stat(tmp_path / "cache" / "files" / "a.bin").st_ino
    staging.write_chunk(1, b"\x01" * MiB)  # a repair or a new revision writes into staging
    assert (model / "a.bin").read_bytes() == bytes(2 * MiB)  # the published copy kept its bytes
    assert staging.read_chunk(1) == b"\x01" * MiB and staging.read_chunk(0) == bytes(MiB)
    assert os.stat(model / "a.bin").st_nlink == 1  # staging now has its own copy
    staging.close()


def test_the_marker_is_a_new_file_and_dropped_chunks_are_not_trusted_after_a_restart(tmp_path: Path) -> None:
    rev = _rev({"a.bin": 3 * MiB})
    staging = store.Store(tmp_path / "cache")
    staging.open(rev)
    held = _fill(staging, {"a.bin": os.urandom(3 * MiB)})
    model = tmp_path / "data" / "ns" / "m"
    digest = manifest.Manifest(layout=rev.layout, chunk_hashes=tuple(held[i] for i in range(3))).digest
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    model.mkdir(parents=True)
    os.link(victim, model / publish.MARKER)  # whatever sits at the marker's name is replaced, never written
    assert not publish.materialise(staging, model_dir=model, digest=digest, revision_id="0" * 64)
    assert publish.read_marker(model) is None  # staging holds another revision: nothing published
    publish.materialise(staging, model_dir=model, digest=digest, revision_id=rev.id, force=True)
    assert victim.read_text() == "keep me" and publish.read_marker(model) == digest
    assert publish.changed_files(staging, model) == []
    staging.drop([1])
    staging.close()
    again = store.Store(tmp_path / "cache")
    assert again.open(rev).verified == {0: held[0], 2: held[2]}
    again.close()


def test_fingerprints_name_files_changed_after_publishing(tmp_path: Path) -> None:
    rev = _rev({"a.bin": MiB, "b.bin": MiB})
    staging = store.Store(tmp_path / "cache")
    staging.open(rev)
    held = _fill(staging, {"a.bin": os.urandom(MiB), "b.bin": os.urandom(MiB)})
    model = tmp_path / "data" / "ns" / "m"
    digest = manifest.Manifest(rev.layout, (held[0], held[1])).digest
    publish.materialise(staging, model_dir=model, digest=digest, revision_id=rev.id)
    with open(model / "b.bin", "r+b") as f:  # a byte flipped at rest (the write also moves the mtime)
        f.seek(100)
        f.write(b"\xff")
    assert publish.changed_files(staging, model) == ["b.bin"]
    publish.withdraw(model)
    assert publish.read_marker(model) is None
    staging.close()


def test_leftovers_of_killed_publishes_are_removed_but_nothing_else(tmp_path: Path) -> None:
    parent = tmp_path / "data" / "ns"
    for name in (".m.tmp-123", ".m.old-456", ".other.tmp-1", "m", "mm"):
        (parent / name).mkdir(parents=True)
    removed = publish.remove_leftovers(parent / "m")
    assert sorted(p.name for p in removed) == [".m.old-456", ".m.tmp-123"]
    assert sorted(p.name for p in parent.iterdir()) == [".other.tmp-1", "m", "mm"]


def test_the_budget_refuses_a_write_before_any_byte_lands(tmp_path: Path) -> None:
    rev = _rev({"a.bin": 3 * MiB})
    staging = store.Store(tmp_path / "cache", budget=2 * MiB + 4096)
    staging.open(rev)
    staging.write_chunk(0, bytes(MiB))
    staging.write_chunk(1, bytes(MiB))
    with pytest.raises(store.DiskFull) as full:
        staging.write_chunk(2, bytes(MiB))
    assert full.value.errno == errno.ENOSPC and "--ssd-bytes" in str(full.value)
    assert staging.room_for(MiB) is not None and staging.room_for(1) is None
    staging.close()


def test_one_agent_per_staging_directory(tmp_path: Path) -> None:
    first = store.Store(tmp_path / "cache")
    first.acquire()
    with pytest.raises(store.Busy, match="in use by another agent"):
        store.Store(tmp_path / "cache").acquire()
    first.close()
    second = store.Store(tmp_path / "cache")
    second.acquire()  # released with the first one
    second.close()


def test_a_revision_change_waits_for_reads_and_publishes_in_progress(tmp_path: Path) -> None:
    old, new = _rev({"a.bin": 2 * MiB}), _rev({"a.bin": 2 * MiB, "b.bin": 5}, tag="u")
    staging = store.Store(tmp_path / "cache")
    staging.open(old)
    _fill(staging, {"a.bin": os.urandom(2 * MiB)})
    events: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def publishing() -> None:
        with staging.in_use():  # as publish.materialise holds the staged files
            inside.set()
            release.wait(30)
            events.append(f"published {staging.saved_revision() == old}")

    reader = threading.Thread(target=publishing)
    reader.start()
    assert inside.wait(30)
    mover = threading.Thread(target=lambda: events.append(f"moved {staging.open(new).prior is not None}"))
    mover.start()
    wait_for(lambda: staging._gate._owned, within=30, what="the move waiting for the gate")
    assert events == []
    release.set()
    reader.join(30)
    mover.join(30)
    assert events == ["published True", "moved True"]
    staging.close()


def _land(landing: store.Landing, data: bytes) -> None:
    """Write ``data`` into a claimed region through a mapping, as a receive in place does."""
    start = landing.offset - landing.offset % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(landing.fd, landing.offset + landing.length - start, offset=start) as area:
        area[landing.offset - start : landing.offset - start + landing.length] = data


def test_a_region_is_claimed_only_for_a_chunk_no_journal_line_names(tmp_path: Path) -> None:
    rev = _rev({"a.bin": 3 * MiB + 10, "b.bin": MiB})  # chunk 3 spans a.bin's end and b.bin
    data = {"a.bin": os.urandom(3 * MiB + 10), "b.bin": os.urandom(MiB)}
    staging = store.Store(tmp_path / "cache", writes="in-place")
    staging.open(rev)
    staging.write_chunk(0, data["a.bin"][:MiB])
    staging.commit([(0, manifest.chunk_sha256(data["a.bin"][:MiB]))])
    staging.close()
    again = store.Store(tmp_path / "cache", writes="in-place")
    again.open(rev)
    assert again.claim(0) is None  # the journal names it: a crash mid-receive would leave it "verified"
    assert again.claim(1, unclaimable={1}) is None  # held once under this revision (the agent's set)
    assert again.claim(3) is None  # spread over two files: received into a buffer
    landing = again.claim(1)
    assert landing is not None and again.claim(1) is None  # one claim per region
    assert landing.prepare()
    _land(landing, b"\xff" * MiB)  # what a lying peer sent
    landing.release()
    again.close()
    restarted = store.Store(tmp_path / "cache", writes="in-place")
    assert set(restarted.open(rev).verified) == {0}  # the unverified bytes are not counted
    restarted.close()


def test_verified_bytes_land_after_a_claim_ends(tmp_path: Path) -> None:
    rev = _rev({"a.bin": 2 * MiB})
    good = os.urandom(MiB)
    staging = store.Store(tmp_path / "cache", writes="in-place")
    staging.open(rev)
    landing = staging.claim(1)
    assert landing is not None and landing.prepare()
    writer = threading.Thread(target=staging.write_chunk, args=(1, good))  # another job's verified copy
    writer.start()
    _land(landing, b"\x00" * MiB)  # the claim's receive goes on meanwhile
    landing.release()
    writer.join()
    assert (tmp_path / "cache" / "files" / "a.bin").read_bytes()[MiB:] == good
    again = staging.claim(1)  # a write no longer runs: claimable again (the agent's rules decide)
    assert again is not None
    again.release(landed=True)  # verified: synced with the next commit
    staging.commit([(1, manifest.chunk_sha256(good))])
    staging.close()
    assert store.read_journal(tmp_path / "cache" / store.JOURNAL) == {1: manifest.chunk_sha256(good)}


def test_moving_to_another_revision_breaks_off_claims_first(tmp_path: Path) -> None:
    staging = store.Store(tmp_path / "cache", writes="in-place")
    staging.open(_rev({"a.bin": 2 * MiB}))
    receiving = staging.claim(0)
    assert receiving is not None and receiving.prepare() and receiving.begin()
    idle = staging.claim(1)  # received, waiting for its hash: nothing writes into it
    assert idle is not None and idle.prepare()
    aborted = threading.Event()

    def receive_ends() -> None:  # the receive's socket is shut down: its thread returns
        aborted.set()
        threading.Thread(target=receiving.end).start()

    receiving.on_abort(receive_ends)
    staging.open(_rev({"a.bin": MiB}, tag="u"))  # shrinks the file: no mapping of it may remain
    assert aborted.is_set() and receiving.released and idle.released and idle.aborted
    again = staging.claim(0)
    assert again is not None
    staging.close()  # an idle claim does not hold the store open
    assert again.released


def test_staging_on_tmpfs_receives_into_buffers(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if store.fs_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    root = Path(tempfile.mkdtemp(prefix="ringseed-test-", dir=shm))
    try:
        staging = store.Store(root / "cache")
        staging.open(_rev({"a.bin": MiB}))
        assert not staging.in_place and not staging.direct and staging.claim(0) is None
        staging.close()
    finally:
        shutil.rmtree(root)
    disk = store.Store(tmp_path / "cache")
    disk.open(_rev({"a.bin": MiB}))
    on_disk = store.fs_type(tmp_path) not in store.NO_IN_PLACE
    assert disk.direct or disk.in_place or not on_disk  # direct where O_DIRECT opens, else in place
    assert not (disk.direct and disk.in_place) and (disk.claim(0) is None) == (not disk.in_place)
    disk.close()
    with pytest.raises(ValueError, match="staging writes"):
        store.Store(tmp_path / "other", writes="fast")


@pytest.mark.parametrize("writes", ["direct", "buffered"])
def test_direct_writes_land_every_byte_of_unaligned_pieces(tmp_path: Path, writes: str) -> None:
    """O_DIRECT takes the 4 KiB-aligned middle of each piece, the page cache the rest: chunks spread
    over files of odd sizes, bytes given as ``bytes`` (any address) and as a page-aligned map."""
    sizes = {"a.bin": 3 * MiB + 10, "b.bin": 5000, "c/d.bin": 2 * MiB + 4097}
    data = {p: os.urandom(n) for p, n in sizes.items()}
    staging = store.Store(tmp_path / "cache", writes=writes)
    rev = _rev(sizes)
    staging.open(rev)
    assert staging.direct == (writes == "direct") or store.fs_type(tmp_path) in store.NO_IN_PLACE
    layout = rev.layout
    stream = b"".join(data[f.path] for f in layout.files)
    for index in reversed(range(layout.chunk_count)):  # neighbours land after each other, both ways
        start, end = layout.chunk_span(index)
        if index % 2:
            staging.write_chunk(index, stream[start:end])
        else:
            with mmap.mmap(-1, end - start) as area:
                area[:] = stream[start:end]
                staging.write_chunk(index, memoryview(area))
        assert staging.read_chunk(index) == stream[start:end]  # read back at once: the page cache is coherent
    staging.commit((i, manifest.chunk_sha256(staging.read_chunk(i))) for i in range(layout.chunk_count))
    staging.close()
    for path, expected in data.items():
        assert (tmp_path / "cache" / "files" / path).read_bytes() == expected


def test_a_direct_write_to_a_published_file_copies_it_first(tmp_path: Path) -> None:
    rev = _rev({"a.bin": 2 * MiB})
    staging = store.Store(tmp_path / "cache", writes="direct")
    staging.open(rev)
    staging.write_chunk(0, b"\x01" * MiB)
    staging.write_chunk(1, b"\x02" * MiB)
    published = tmp_path / "published.bin"
    os.link(tmp_path / "cache" / "files" / "a.bin", published)
    staging.shared()
    staging.write_chunk(1, b"\x03" * MiB)  # a repair after publishing: never through the link
    assert published.read_bytes() == b"\x01" * MiB + b"\x02" * MiB
    assert staging.read_chunk(1) == b"\x03" * MiB
    staging.close()


def test_a_claim_without_room_is_not_prepared(tmp_path: Path) -> None:
    """No room (the budget here; ENOSPC from fallocate alike): the chunk goes the buffer's way, where a
    full disk is a clear error, never a write through a mapping (SIGBUS)."""
    staging = store.Store(tmp_path / "cache", budget=MiB // 2, writes="in-place")
    staging.open(_rev({"a.bin": MiB}))
    landing = staging.claim(0)
    if landing is None:
        assert not staging.in_place
    else:
        assert not landing.prepare()
        landing.release()
    assert os.stat(tmp_path / "cache" / "files" / "a.bin").st_blocks == 0  # nothing allocated
    staging.close()


def test_a_full_disk_under_a_direct_write_is_disk_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from the O_DIRECT write is DiskFull (not taken for a misaligned buffer and retried)."""
    staging = store.Store(tmp_path / "cache", writes="direct")
    staging.open(_rev({"a.bin": MiB}))
    real = os.pwrite
    calls: list[int] = []

    def full(fd: int, data: bytes | memoryview, offset: int) -> int:
        calls.append(fd)
        if fd in staging._direct_fds.values():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    monkeypatch.setattr(store.os, "pwrite", full)
    with mmap.mmap(-1, MiB) as area, pytest.raises(store.DiskFull):
        staging.write_chunk(0, memoryview(area))
    assert calls and all(fd in staging._direct_fds.values() for fd in calls)  # nothing went the page cache's way
    staging.close()
