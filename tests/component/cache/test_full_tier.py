"""A peer chunk received into a tier whose file system is full: a clear CacheFull, never a SIGBUS."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ringseed.cache import chunks, peers

MiB = 1024 * 1024


class NeverCalled:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def fetch_mapped(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))
        raise AssertionError("the chunk was mapped although the file system had no room for it")


async def test_a_chunk_that_does_not_fit_its_tier_is_cache_full_before_it_is_mapped(small_disk: Path) -> None:
    (small_disk / "other").write_bytes(b"\0" * (3 * MiB))  # someone else's files on the shared tmpfs
    client = NeverCalled()
    fd = os.open(small_disk / "chunk", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with pytest.raises(chunks.CacheFull, match="no space for a 4194304-byte chunk"):
            await peers.fetch_into(
                client,  # type: ignore[arg-type]  # a PeerClient that must not be reached
                url="http://peer.invalid",
                sha="0" * 64,
                length=4 * MiB,
                fd=fd,
            )
    finally:
        os.close(fd)
    assert client.calls == []
