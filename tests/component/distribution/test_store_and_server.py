"""The SSD tier and the peer server in process: journal resume, atomic publish, sendfile bytes, busy."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import cache, publish, server, store
from ringseed.protocol import manifest, revision

MiB = 1 << 20


@pytest.fixture
def layout() -> manifest.Layout:
    return manifest.Layout.build([("a.bin", MiB + 5, 0o644), ("d/b.bin", 2 * MiB - 3, 0o600)], chunk_size=MiB)


def _stream(layout: manifest.Layout) -> bytes:
    return bytes((i * 31 + 7) % 251 for i in range(layout.total_size))


def _chunk(data: bytes, layout: manifest.Layout, index: int) -> bytes:
    start, end = layout.chunk_span(index)
    return data[start:end]


def test_journal_survives_reopen_and_model_appears_whole(tmp_path: Path, layout: manifest.Layout) -> None:
    data = _stream(layout)
    staging = store.Store(tmp_path / "cache")
    assert staging.open(revision.Revision(layout=layout)).verified == {}
    hashes = [manifest.chunk_sha256(_chunk(data, layout, i)) for i in range(layout.chunk_count)]
    staging.write_chunk(1, _chunk(data, layout, 1))  # spans both files
    staging.commit([(1, hashes[1])])
    staging.write_chunk(2, _chunk(data, layout, 2))  # written, never committed: not trusted
    staging.close()
    again = store.Store(tmp_path / "cache")
    assert again.open(revision.Revision(layout=layout)).verified == {1: hashes[1]}
    for index in [i for i in range(layout.chunk_count) if i != 1]:
        again.write_chunk(index, _chunk(data, layout, index))
    model_dir = tmp_path / "data" / "ns" / "m"
    digest = manifest.Manifest(layout=layout, chunk_hashes=tuple(hashes)).digest
    publish.materialise(again, model_dir=model_dir, digest=digest, revision_id=revision.Revision(layout=layout).id)
    assert (model_dir / "a.bin").read_bytes() + (model_dir / "d" / "b.bin").read_bytes() == data
    assert publish.read_marker(model_dir) == digest
    assert os.stat(model_dir / "d" / "b.bin").st_mode & 0o777 == 0o600
    assert sorted(p.name for p in model_dir.parent.iterdir()) == ["m"]  # no temp dirs left behind


class _Source:
    def __init__(self, staging: store.Store, held: dict[int, str], budget: int) -> None:
        self.store = staging
        self.held = held
        self.memory = cache.MemoryTier(budget)
        self.active_uploads = 0
        self.uploaded_bytes = 0
        self.refused_uploads = 0


async def test_server_sends_verified_chunks_from_disk_and_memory(tmp_path: Path, layout: manifest.Layout) -> None:
    data = _stream(layout)
    staging = store.Store(tmp_path / "cache")
    staging.open(revision.Revision(layout=layout))
    held = {}
    for index in range(layout.chunk_count):
        staging.write_chunk(index, _chunk(data, layout, index))
        held[index] = manifest.chunk_sha256(_chunk(data, layout, index))
    source = _Source(staging, {i: h for i, h in held.items() if i != 2}, budget=MiB)
    source.memory.put(0, _chunk(data, layout, 0))
    metrics = web.Metrics()
    app = server.create_app(token="t", source=source, max_uploads=1, metrics=metrics, refresh_metrics=lambda: None)
    runner = aioweb.AppRunner(app)
    await runner.setup()
    site = aioweb.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer t"}) as http:
            for index in (0, 1):  # memory, then sendfile across the file boundary
                async with http.get(f"{base}/v1/chunks/{index}") as resp:
                    body = await resp.read()
                assert hashlib.sha256(body).hexdigest() == held[index]
            async with http.get(f"{base}/v1/chunks/2") as resp:
                assert resp.status == 404  # not verified here: never served
            source.memory.pinned.add(1)  # disk write in flight and (wrongly) not in memory: no sendfile
            async with http.get(f"{base}/v1/chunks/1") as resp:
                assert resp.status == 429
            source.memory.unpin(1)
            source.active_uploads = 1
            async with http.get(f"{base}/v1/chunks/1") as resp:
                assert resp.status == 429 and resp.headers["Retry-After"]
    finally:
        await runner.cleanup()
        staging.close()


def test_memory_tier_never_evicts_a_pinned_chunk() -> None:
    tier = cache.MemoryTier(2 * MiB)
    assert tier.put(0, bytes(MiB), pin=True)
    tier.put(1, bytes(MiB))
    tier.put(2, bytes(MiB))  # evicts 1, the oldest unpinned, not the older pinned 0
    assert tier.get(0) is not None and tier.get(1) is None and tier.used == 2 * MiB
    tier.unpin(0)
    tier.put(3, bytes(MiB))  # evicts 2
    tier.put(4, bytes(MiB))  # evicts 0, now an ordinary entry
    assert tier.get(0) is None and tier.pinned == set()
    assert not tier.put(5, bytes(3 * MiB))
