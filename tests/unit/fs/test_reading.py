"""The SDK's shared read path: chunk files kept open between threads, and reads that copy once."""

from __future__ import annotations

import contextlib
import errno
import os
import random
from pathlib import Path

import pytest

from ringseed.fs import reading
from ringseed.protocol import cacheobjects


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False
    return True


def test_a_file_let_go_while_in_use_is_closed_after_its_last_use(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    files: reading.ChunkFiles[str] = reading.ChunkFiles()
    fd = os.open(tmp_path / "a", os.O_RDONLY)
    with files.use("a", now=0.0, fd=fd) as held:
        assert held == fd
        with files.use("a", now=0.0) as again:
            assert again == fd
            assert files.let_go(limit=0) == ["a"]
            assert "a" not in files and _is_open(fd)
        assert _is_open(fd)  # the outer use still reads it
        assert os.pread(fd, 3, 0) == b"abc"
    assert not _is_open(fd)


def test_least_recently_used_files_go_first_and_expired_ones_are_not_lent(tmp_path: Path) -> None:
    files: reading.ChunkFiles[int] = reading.ChunkFiles()
    fds = {}
    for key in range(3):
        (tmp_path / str(key)).write_bytes(b"x")
        fds[key] = os.open(tmp_path / str(key), os.O_RDONLY)
        with files.use(key, now=0.0, fd=fds[key], until=10.0 + key):
            pass
    with files.use(0, now=1.0) as fd:  # 0 is now the most recently used
        assert fd == fds[0]
    assert files.let_go(limit=1) == [1, 2]
    assert not _is_open(fds[1]) and not _is_open(fds[2])
    with files.use(0, now=10.0) as fd:  # its holding ran out
        assert fd is None
    assert len(files) == 0 and not _is_open(fds[0])


def test_a_second_descriptor_for_a_held_key_is_closed_and_the_held_one_lent(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    files: reading.ChunkFiles[str] = reading.ChunkFiles()
    first, second = (os.open(tmp_path / "a", os.O_RDONLY) for _ in range(2))
    with files.use("a", now=0.0, fd=first):
        pass
    with files.use("a", now=0.0, fd=second) as fd:
        assert fd == first
    assert not _is_open(second)
    files.close()
    assert not _is_open(first)


class _Pieces(reading.ChunkedReader):
    """A file made of byte ranges of chunk files on disk (the shape of a dataset file)."""

    def __init__(self, chunk_files: list[Path], pieces: list[tuple[int, int, int]]) -> None:
        super().__init__()
        self.path = "test"
        self.identity = "test"
        self.pieces = pieces  # (chunk, offset in its file, length)
        self.spans = cacheobjects.spans(length for _, _, length in pieces)
        self.size = self.spans[-1][1]
        self.files: reading.ChunkFiles[int] = reading.ChunkFiles()
        self.chunk_files = chunk_files

    def _locate(self, index: int) -> tuple[int, int]:
        return self.pieces[index][0], self.pieces[index][1]

    @contextlib.contextmanager
    def _use(self, index: int):  # type: ignore[no-untyped-def]
        chunk = self.pieces[index][0]
        with self.files.use(chunk, now=0.0) as fd:
            if fd is not None:
                yield fd
                return
        opened = os.open(self.chunk_files[chunk], os.O_RDONLY)
        with self.files.use(chunk, now=0.0, fd=opened) as fd:
            yield fd


def _reader(tmp_path: Path) -> tuple[_Pieces, bytes]:
    rng = random.Random(3)
    chunks = [rng.randbytes(300_000) for _ in range(3)]
    paths = []
    for i, data in enumerate(chunks):
        paths.append(tmp_path / f"c{i}")
        paths[-1].write_bytes(data)
    pieces = [(0, 70_001, 229_999), (1, 0, 300_000), (2, 0, 12_345)]  # a file that starts mid-chunk
    expected = b"".join(chunks[c][o : o + n] for c, o, n in pieces)
    return _Pieces(paths, pieces), expected


def test_reads_across_pieces_return_the_files_bytes(tmp_path: Path) -> None:
    reader, expected = _reader(tmp_path)
    assert reader.read() == expected
    rng = random.Random(5)
    for _ in range(200):
        offset = rng.randrange(0, len(expected) + 10)
        count = rng.randrange(0, 400_000)
        assert reader.read_at(offset, count) == expected[offset : offset + count]
        buffer = bytearray(count)
        got = reader.pread(offset, memoryview(buffer))
        assert buffer[:got] == expected[offset : offset + count]
    reader.seek(229_990)
    assert reader.read(20) == expected[229_990:230_010]
    block = bytearray(1 << 20)
    reader.seek(-5, os.SEEK_END)
    assert reader.readinto(block) == 5 and reader.read() == b""


def test_a_chunk_file_shorter_than_the_cache_said_is_an_io_error(tmp_path: Path) -> None:
    reader, expected = _reader(tmp_path)
    os.truncate(tmp_path / "c1", 1000)
    with pytest.raises(OSError) as caught:
        reader.read()
    assert caught.value.errno == errno.EIO
    with pytest.raises(OSError) as caught:
        reader.read_at(229_999 + 500, 1000)
    assert caught.value.errno == errno.EIO
    assert reader.read_at(0, 1000) == expected[:1000]  # the other pieces still read
