"""Cut-through from the origin-duty agent: prefix progress, the stream endpoint, and a real swarm.

The server parts run in process against a real aiohttp server; the swarm test runs real agent
processes behind a rate-limited origin and checks that peers stream chunks while they arrive,
and that every copy is still verified and identical.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web as aioweb

from ringseed import web
from ringseed.agent import cache, origins, server, store, stream
from ringseed.local import swarm
from ringseed.protocol import manifest, revision
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest


async def test_read_chunk_into_reports_a_growing_prefix_across_files(tmp_path: Path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    sizes = {"a.bin": 3 * MiB + 11, "b.bin": 5, "c.bin": 2 * MiB}
    for number, (name, size) in enumerate(sizes.items()):
        (root / name).write_bytes(bytes((i * 7 + number) % 256 for i in range(size)))
    origin = origins.open_origin(root.as_uri())
    layout = manifest.Layout.build(await origin.list_files(), chunk_size=4 * MiB)
    index = 0  # 4 MiB over all three files
    buf = bytearray(layout.chunk_length(index))
    seen: list[int] = []
    await origins.read_chunk_into(origin, layout, index, buf, progress=seen.append)
    assert bytes(buf) == await origins.read_chunk(origin, layout, index)
    assert seen == sorted(set(seen)) and seen[-1] == len(buf)
    with pytest.raises(ValueError, match="buffer is"):
        await origins.read_chunk_into(origin, layout, index, bytearray(3))


class _Source:
    def __init__(self, staging: store.Store) -> None:
        self.store = staging
        self.held: dict[int, str] = {}
        self.memory = cache.MemoryTier(8 * MiB)
        self.inflight: dict[int, stream.Inflight] = {}
        self.active_uploads = 0
        self.active_streams = 0
        self.uploaded_bytes = 0
        self.refused_uploads = 0


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[_Source, str, aiohttp.ClientSession]]:
    layout = manifest.Layout.build([("a.bin", 4 * MiB, 0o644)], chunk_size=2 * MiB)
    staging = store.Store(tmp_path / "cache")
    staging.open(revision.Revision(layout=layout))
    source = _Source(staging)
    app = server.create_app(
        token="t", source=source, max_uploads=1, max_streams=2, metrics=web.Metrics(), refresh_metrics=lambda: None
    )
    runner = aioweb.AppRunner(app)
    await runner.setup()
    site = aioweb.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer t"}) as http:
            yield source, f"http://127.0.0.1:{runner.addresses[0][1]}", http
    finally:
        await runner.cleanup()
        staging.close()


async def test_stream_sends_bytes_as_they_arrive(served: tuple[_Source, str, aiohttp.ClientSession]) -> None:
    source, base, http = served
    data = bytes(range(256)) * (8 * 1024)  # 2 MiB
    inflight = stream.Inflight(0, bytearray(len(data)))
    source.inflight[0] = inflight
    async with http.get(f"{base}/v1/chunks/0") as resp:
        assert resp.status == 404  # without ?stream=1 an unverified chunk is never sent
    async with http.get(f"{base}/v1/chunks/0", params={"stream": "1"}) as resp:
        assert resp.status == 200 and resp.content_length == len(data)
        inflight.buffer[: MiB // 2] = data[: MiB // 2]
        inflight.advance(MiB // 2)
        head = await asyncio.wait_for(resp.content.readexactly(MiB // 2), timeout=5)
        assert head == data[: MiB // 2]  # the prefix arrives while the rest is still missing
        assert source.active_streams == 1
        inflight.buffer[MiB // 2 :] = data[MiB // 2 :]
        inflight.advance(len(data))
        rest = await asyncio.wait_for(resp.content.read(), timeout=5)
    assert head + rest == data
    assert source.active_streams == 0 and inflight.sent == {}


async def test_a_failed_pull_cuts_its_streams_short(served: tuple[_Source, str, aiohttp.ClientSession]) -> None:
    source, base, http = served
    inflight = stream.Inflight(1, bytearray(2 * MiB))
    source.inflight[1] = inflight
    inflight.advance(MiB)
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.get(f"{base}/v1/chunks/1", params={"stream": "1"}) as resp:
            await asyncio.wait_for(resp.content.readexactly(MiB), timeout=5)
            inflight.fail()
            await asyncio.wait_for(resp.read(), timeout=5)
    assert source.active_streams == 0


async def test_streams_are_refused_when_slots_are_full_or_a_stream_lags(
    served: tuple[_Source, str, aiohttp.ClientSession],
) -> None:
    source, base, http = served
    inflight = stream.Inflight(0, bytearray(32 * MiB))
    source.inflight[0] = inflight
    source.active_streams = 2  # max_streams
    async with http.get(f"{base}/v1/chunks/0", params={"stream": "1"}) as resp:
        assert resp.status == 429 and (await resp.json())["error"] == "busy"
    source.active_streams = 0
    lagging = inflight.open_stream()
    inflight.advance(stream.STREAM_LAG + 1)  # that stream has sent nothing of it: the uplink is full
    assert not inflight.keeping_up()
    async with http.get(f"{base}/v1/chunks/0", params={"stream": "1"}) as resp:
        assert resp.status == 429
    inflight.close_stream(lagging)
    assert inflight.keeping_up()


def test_peers_stream_chunks_while_they_arrive_from_a_slow_origin(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(24, files=3))
    expected = source_manifest(root, chunk_size=4 * MiB)
    local = swarm_factory(source=root.as_uri(), nodes=4, chunk_size=4 * MiB, origin_rate_limit=8 * MiB)
    local.start()
    status = local.wait_for(local.all_verified, timeout=120, what="4 verified copies")
    assert status["manifest_digest"] == expected.digest
    assert_copies(local, expected)
    assert status["bytes_from_origin"] <= 1.05 * expected.layout.total_size
    metrics = {name: local.agent_metrics(name) for name in local.names}
    assert all(m is not None for m in metrics.values()), metrics
    streamed = sum(m["ringseed_agent_chunks_streamed"] for m in metrics.values() if m)
    rejected = sum(m["ringseed_agent_chunks_rejected"] for m in metrics.values() if m)
    # Each chunk takes 0.5 s to arrive from the origin: idle peers stream it meanwhile.
    assert streamed >= expected.layout.chunk_count // 2, streamed
    assert rejected == 0
