"""HTTP origin against a flaky loopback server: faults are retried, reads resume, errors are clear."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from pathlib import Path

import pytest

from ringseed.agent import origins
from ringseed.protocol import manifest
from tests.component.origins import servers
from tests.component.origins.servers import Fault

MI = 1 << 20


def _open(uri: str, *, retries: int = 8, rate_limit: float | None = None) -> origins.Origin:
    """An origin with tiny retry delays, so fault tests run fast."""
    return origins.open_origin(
        uri, retries=retries, rate_limit=rate_limit, retry_base_delay=0.001, retry_max_delay=0.01
    )


def _blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture
def model(http_root: Path) -> dict[str, bytes]:
    files = {
        "config.json": b'{"layers": 2}',
        "weights/part-0.bin": _blob(1, 3 * MI + 123),
        "weights/é x.bin": _blob(2, MI),
    }
    servers.write_tree(http_root, files, modes={"config.json": 0o600})
    return files


async def test_directory_lists_by_index_and_reads_every_file(
    flaky_http: servers.FlakyHTTPOrigin, model: dict[str, bytes]
) -> None:
    origin = _open(flaky_http.url)
    try:
        listed = sorted(await origin.list_files())
        assert listed == sorted((p, len(b), 0o600 if p == "config.json" else 0o644) for p, b in model.items())
        for path, data in model.items():
            assert await origin.read(path, 0, len(data)) == data
        assert await origin.read("weights/part-0.bin", MI + 5, 1000) == model["weights/part-0.bin"][MI + 5 : MI + 1005]
        assert origin.bytes_read == sum(len(b) for b in model.values()) + 1000
    finally:
        await origin.close()


@pytest.mark.parametrize(
    "faults",
    [
        [Fault.ERROR_500, Fault.ERROR_500, Fault.ERROR_500],
        [Fault.RESET],
        [Fault.TRUNCATE],
        [Fault.TOO_MANY, Fault.ERROR_503],
        [Fault.SHORT_RANGE],
        [Fault.ERROR_500, Fault.RESET, Fault.TRUNCATE, Fault.TOO_MANY, Fault.RESET],
    ],
    ids=lambda faults: "+".join(f.name for f in faults),
)
async def test_faults_are_retried_to_identical_bytes_resuming_where_they_broke(
    flaky_http: servers.FlakyHTTPOrigin, model: dict[str, bytes], faults: list[Fault]
) -> None:
    data = model["weights/part-0.bin"]
    flaky_http.add_faults(*faults)
    origin = _open(flaky_http.url)
    try:
        got = await origin.read("weights/part-0.bin", 0, len(data))
    finally:
        await origin.close()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
    assert flaky_http.injected == faults
    assert origin.retries == len(faults)  # type: ignore[attr-defined]
    # Resume: nothing received is asked for twice, so exactly the file's bytes were pulled.
    assert origin.bytes_read == len(data)
    starts = [int(r[2].split("=")[1].split("-")[0]) for r in flaky_http.requests if r[0] == "GET" and r[2]]
    assert starts == sorted(starts)


async def test_a_stalled_body_times_out_and_resumes(http_root: Path, model: dict[str, bytes]) -> None:
    data = model["weights/part-0.bin"]
    async with servers.FlakyHTTPOrigin(http_root, faults=[Fault.STALL], stall_seconds=30) as srv:
        origin = origins.open_origin(srv.url, read_timeout=0.5, retry_base_delay=0.001)
        try:
            started = time.monotonic()
            assert await origin.read("weights/part-0.bin", 0, len(data)) == data
            assert time.monotonic() - started < 20, "the stall was waited out instead of timed out"
        finally:
            await origin.close()
    assert origin.retries == 1  # type: ignore[attr-defined]
    assert origin.bytes_read == len(data)


async def test_a_fault_on_the_index_is_retried_too(http_root: Path, model: dict[str, bytes]) -> None:
    async with servers.FlakyHTTPOrigin(http_root, faults=[Fault.RESET, Fault.ERROR_500], fault_index=True) as srv:
        origin = _open(srv.url)
        try:
            assert len(await origin.list_files()) == len(model)
        finally:
            await origin.close()


async def test_missing_file_is_a_permanent_error_naming_url_and_status(
    flaky_http: servers.FlakyHTTPOrigin, model: dict[str, bytes]
) -> None:
    origin = _open(flaky_http.url)
    try:
        with pytest.raises(origins.OriginError, match=r"missing\.bin: HTTP 404") as info:
            await origin.read("missing.bin", 0, 10)
    finally:
        await origin.close()
    assert flaky_http.url in str(info.value)
    assert origin.retries == 0  # type: ignore[attr-defined]


async def test_persistent_5xx_gives_up_after_the_retry_budget(
    flaky_http: servers.FlakyHTTPOrigin, model: dict[str, bytes]
) -> None:
    flaky_http.add_faults(*[Fault.ERROR_500] * 10)
    origin = _open(flaky_http.url, retries=2)
    try:
        with pytest.raises(origins.OriginError, match=r"gave up after 2 retries.*HTTP 500"):
            await origin.read("config.json", 0, 5)
    finally:
        await origin.close()
    assert len(flaky_http.injected) == 3


async def test_reading_past_the_end_of_a_file_is_a_permanent_error(
    flaky_http: servers.FlakyHTTPOrigin, model: dict[str, bytes]
) -> None:
    origin = _open(flaky_http.url)
    try:
        with pytest.raises(origins.OriginError, match=r"config\.json"):
            await origin.read("config.json", 0, 1000)
    finally:
        await origin.close()


async def test_single_file_url_is_a_one_file_source_sized_by_head(
    flaky_http: servers.FlakyHTTPOrigin, model: dict[str, bytes]
) -> None:
    data = model["weights/part-0.bin"]
    origin = _open(flaky_http.url + "weights/part-0.bin")
    try:
        assert await origin.list_files() == [("part-0.bin", len(data), 0o644)]
        assert await origin.read("part-0.bin", 10, 20) == data[10:30]
        with pytest.raises(origins.OriginError, match="one-file source"):
            await origin.read("other.bin", 0, 1)
    finally:
        await origin.close()


async def test_malformed_index_names_the_problem(http_root: Path) -> None:
    (http_root / "index.json").write_text('{"files": [{"path": "../etc/passwd", "size": 3}]}')
    async with servers.FlakyHTTPOrigin(http_root) as srv:
        origin = _open(srv.url)
        try:
            with pytest.raises(origins.OriginError, match=r"index.json: files\[0\].*'\.\.'"):
                await origin.list_files()
        finally:
            await origin.close()


async def test_rate_limit_caps_concurrent_reads_of_one_origin(
    flaky_http: servers.FlakyHTTPOrigin, model: dict[str, bytes]
) -> None:
    rate = 1 * MI
    origin = _open(flaky_http.url, rate_limit=rate)
    try:
        started = time.monotonic()
        parts = await asyncio.gather(
            origin.read("weights/part-0.bin", 0, MI // 2), origin.read("weights/part-0.bin", MI // 2, MI // 2)
        )
        elapsed = time.monotonic() - started
    finally:
        await origin.close()
    assert b"".join(parts) == model["weights/part-0.bin"][:MI]
    assert elapsed >= MI / rate * 0.9
    assert elapsed < 30, "rate limiter stalled far beyond its budget"


async def test_manifest_over_flaky_http_equals_manifest_of_the_same_files_on_disk(
    flaky_http: servers.FlakyHTTPOrigin, model: dict[str, bytes], http_root: Path
) -> None:
    flaky_http.add_faults(Fault.RESET, Fault.ERROR_500, Fault.TRUNCATE)
    remote = _open(flaky_http.url)
    local = origins.open_origin(str(http_root))
    try:
        over_http = await origins.build_manifest(remote, chunk_size=manifest.MIN_CHUNK_SIZE)
        on_disk = await origins.build_manifest(local, chunk_size=manifest.MIN_CHUNK_SIZE)
    finally:
        await remote.close()
        await local.close()
    # Modes differ only where the index says so; the index here is generated from the same tree.
    assert over_http.digest == on_disk.digest
    stream = b"".join(model[p] for p in sorted(model))
    assert list(over_http.chunk_hashes) == [
        hashlib.sha256(stream[i : i + MI]).hexdigest() for i in range(0, len(stream), MI)
    ]


def test_server_runs_in_a_background_thread_for_sync_callers(http_root: Path) -> None:
    servers.write_tree(http_root, {"a.bin": b"abc" * 1000})
    with servers.FlakyHTTPOrigin(http_root, faults=[Fault.RESET]).in_thread() as url:

        async def fetch() -> bytes:
            origin = _open(url + "a.bin")
            try:
                return await origin.read("a.bin", 0, 3000)
            finally:
                await origin.close()

        assert asyncio.run(fetch()) == b"abc" * 1000


async def test_a_server_without_range_is_streamed_whole_in_about_one_pass(tmp_path: Path) -> None:
    files = {"a.bin": _blob(5, 5 * MI + 7), "b.bin": _blob(6, 3 * MI), "c.json": b"{}"}
    root = servers.write_tree(tmp_path / "www", files)
    (root / "index.json").write_text(json.dumps({"files": [{"path": p, "size": len(b)} for p, b in files.items()]}))
    with servers.plain_http_server(root) as (url, requests):
        origin = _open(url, retries=2)
        try:
            layout = manifest.Layout.build(await origin.list_files(), chunk_size=MI)
            chunks = [await origins.read_chunk(origin, layout, i) for i in range(layout.chunk_count)]
            total = layout.total_size
            # A read behind the stream's position starts the object again and is still exact.
            assert await origin.read("a.bin", 10, 100) == files["a.bin"][10:110]
            assert await origin.read("a.bin", 4 * MI, 5) == files["a.bin"][4 * MI : 4 * MI + 5]
            read = origin.bytes_read
        finally:
            await origin.close()
    assert b"".join(chunks) == b"".join(files[f.path] for f in layout.files)
    gets = [r for r in requests if r.startswith("GET /a.bin") or r.startswith("GET /b.bin")]
    assert len(gets) <= 6, gets  # one ranged probe and one streaming GET per file, plus the two re-reads
    assert read <= total + 2 * MI + 4 * MI + 110, read  # about one pass, plus the probe's chunk and the re-reads


async def test_a_server_without_range_gives_a_clear_error_when_the_file_is_short(tmp_path: Path) -> None:
    root = servers.write_tree(tmp_path / "www", {"a.bin": _blob(7, 2 * MI)})
    with servers.plain_http_server(root) as (url, _):
        origin = _open(url + "a.bin", retries=1)
        try:
            assert await origin.read("a.bin", 0, 10) == (root / "a.bin").read_bytes()[:10]
            with pytest.raises(origins.OriginError, match="file has 2097152 bytes, the read needs 3145728"):
                await origin.read("a.bin", MI, 2 * MI)
        finally:
            await origin.close()


@pytest.mark.parametrize(
    "faults", [[], [Fault.RESET, Fault.TRUNCATE], [Fault.STALL]], ids=["clean", "reset+truncate", "stall"]
)
async def test_a_large_range_body_is_read_by_a_thread_into_the_buffer_and_resumes_after_faults(
    http_root: Path, faults: list[Fault]
) -> None:
    data = _blob(7, 24 * MI)  # far more than aiohttp buffers before the thread takes over
    servers.write_tree(http_root, {"big.bin": data})
    async with servers.FlakyHTTPOrigin(http_root, faults=faults, stall_seconds=30) as srv:
        origin = origins.open_origin(srv.url, read_timeout=0.5, retry_base_delay=0.001, retry_max_delay=0.01)
        view = memoryview(bytearray(len(data)))
        reported: list[int] = []
        try:
            await origin.read_into("big.bin", 0, view, progress=reported.append)  # type: ignore[attr-defined]
        finally:
            await origin.close()
    assert hashlib.sha256(view).hexdigest() == hashlib.sha256(data).hexdigest()
    assert origin.direct_reads == len(faults) + 1  # type: ignore[attr-defined]
    assert origin.retries == len(faults)  # type: ignore[attr-defined]
    assert origin.bytes_read == len(data)  # resumed where each body broke
    assert reported == sorted(reported) and reported[-1] == len(data) and len(reported) > 2


async def test_cancelling_a_threaded_body_read_ends_it_and_keeps_the_client_usable(http_root: Path) -> None:
    data = _blob(8, 24 * MI)
    servers.write_tree(http_root, {"big.bin": data})
    async with servers.FlakyHTTPOrigin(http_root, faults=[Fault.STALL], stall_seconds=30) as srv:
        origin = origins.open_origin(srv.url, read_timeout=20, retry_base_delay=0.001)
        try:
            view = memoryview(bytearray(len(data)))
            started = asyncio.Event()
            read = asyncio.ensure_future(
                origin.read_into("big.bin", 0, view, progress=lambda _: started.set())  # type: ignore[attr-defined]
            )
            await started.wait()  # the first half arrived; the server stalls on the rest
            read.cancel()
            with pytest.raises(asyncio.CancelledError):
                await read
            assert await origin.read("big.bin", MI, 3 * MI) == data[MI : 4 * MI]
            threaded = origin.direct_reads  # type: ignore[attr-defined]
            for offset in (0, 7 * MI, 20 * MI):  # bodies aiohttp buffers whole: no thread, the connection kept
                assert await origin.read("big.bin", offset, 64 << 10) == data[offset : offset + (64 << 10)]
            assert origin.direct_reads == threaded  # type: ignore[attr-defined]
        finally:
            await origin.close()


async def test_bodies_under_a_mebibyte_keep_the_connection(http_root: Path) -> None:
    """Small files (a dataset's) read over one kept-alive connection: a worker thread's read would
    close it after each body, a new TCP connection per file."""
    data = _blob(9, 8 * MI)
    servers.write_tree(http_root, {"many.bin": data})
    async with servers.FlakyHTTPOrigin(http_root) as srv:
        origin = origins.open_origin(srv.url)
        try:
            for offset in range(0, 4 * MI, 512 << 10):
                assert await origin.read("many.bin", offset, 512 << 10) == data[offset : offset + (512 << 10)]
        finally:
            await origin.close()
    assert origin.direct_reads == 0  # type: ignore[attr-defined]
    assert len(srv.connections) == 1, srv.connections
