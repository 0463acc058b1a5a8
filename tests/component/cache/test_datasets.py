"""Datasets through the node cache: read-through once per chunk, peers first, changes, budgets, bad reads."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from ringseed.agent import origins
from ringseed.cache import chunks
from ringseed.master import cachedata
from tests.component.cache.cluster import Cluster, MiB

CHUNK = 8 * MiB


def make_dataset(root: Path, *, big: int = 2, small: int = 300, seed: int = 3) -> dict[str, bytes]:
    rng = __import__("random").Random(seed)
    files = {f"shards/big-{i}.bin": rng.randbytes(5 * MiB + 1234 * i) for i in range(big)}
    files.update({f"images/{i:05d}.jpg": rng.randbytes(20_000 + (i * 37) % 5000) for i in range(small)})
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


async def nodes_with(cluster: Cluster, source: Path, count: int = 3, **overrides: Any) -> None:
    await cluster.start_master(replicas=1, heartbeat_interval=0.2)
    for i in range(count):
        settings = {"chunk_size": CHUNK, "data_sources": {"train": f"file://{source}"}, "list_ttl": 60.0, **overrides}
        await cluster.start_node(f"n{i}", **settings)


def read_all(fs: Any, files: dict[str, bytes]) -> dict[str, bytes]:
    return {rel: fs.cat(f"ringseed://data/train/{rel}") for rel in sorted(files)}


def from_source(cluster: Cluster) -> int:
    return sum(n.agent.datasets.counters().get("bytes_from_source", 0) for n in cluster.nodes.values())


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    root.mkdir()
    return root


async def test_every_node_reads_the_same_bytes_and_the_source_is_read_once(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source)
    total = sum(len(d) for d in files.values())
    await nodes_with(cluster, source)
    fs = {name: node.fs(cluster.token) for name, node in cluster.nodes.items()}
    assert await asyncio.to_thread(lambda: fs["n0"].ls("ringseed://data", detail=False)) == ["data/train"]
    listing = await asyncio.to_thread(lambda: fs["n0"].ls("ringseed://data/train/images", detail=False))
    assert len(listing) == 300 and listing[0] == "data/train/images/00000.jpg"
    assert (await asyncio.to_thread(fs["n1"].info, "data/train/shards/big-1.bin"))["size"] == 5 * MiB + 1234
    for name in ("n0", "n1", "n2"):  # one after the other: later nodes find every chunk on a peer
        got = await asyncio.to_thread(read_all, fs[name], files)
        assert got == files, name
    assert from_source(cluster) == total  # each chunk once from the source, whatever the node count
    peers = sum(n.agent.datasets.counters()["bytes_from_peers"] for n in cluster.nodes.values())
    assert peers == 2 * total


async def test_nodes_that_start_together_list_the_source_once(
    cluster: Cluster, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = make_dataset(source, big=0, small=50)
    await nodes_with(cluster, source)
    listed: list[str] = []
    waited: set[str] = set()
    for name, node in cluster.nodes.items():
        dataset = node.agent.datasets.get("train")

        async def listing(real: Any = dataset.origin.listing, name: str = name) -> Any:
            listed.append(name)  # the lister holds on until the others wait for its revision
            await cluster.wait_until(lambda: len(waited) == 2, what="the other nodes waiting for the listing")
            return await real()

        async def may_list(real: Any = dataset._may_list, name: str = name) -> float | None:
            wait: float | None = await real()
            if wait is not None:
                waited.add(name)
            return wait

        monkeypatch.setattr(dataset.origin, "listing", listing)
        monkeypatch.setattr(dataset, "_may_list", may_list)
    fs = [node.fs(cluster.token) for node in cluster.nodes.values()]
    got = await asyncio.gather(*(asyncio.to_thread(read_all, f, files) for f in fs))
    assert got == [files] * 3
    assert len(listed) == 1  # one listing of the source served the three nodes


async def test_a_node_that_missed_a_listing_published_meanwhile_takes_it(
    cluster: Cluster, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = make_dataset(source, big=0, small=5)
    await nodes_with(cluster, source, count=2)
    assert await asyncio.to_thread(read_all, cluster.nodes["n0"].fs(cluster.token), files) == files  # n0 lists
    late = cluster.nodes["n1"].agent.datasets.get("train")
    real_published = late._published
    asked: list[bool] = []

    async def published() -> Any:
        asked.append(True)  # the first answer predates n0's listing (a 404 then): n1 asks to list
        return None if len(asked) == 1 else await real_published()

    async def listing() -> Any:
        raise AssertionError("n1 listed the source although n0's listing was current")

    monkeypatch.setattr(late, "_published", published)
    monkeypatch.setattr(late.origin, "listing", listing)
    assert await asyncio.to_thread(read_all, cluster.nodes["n1"].fs(cluster.token), files) == files
    assert len(asked) == 2


async def test_a_lister_that_fails_lets_another_node_list(
    cluster: Cluster, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = make_dataset(source, big=0, small=5)
    await nodes_with(cluster, source, count=2)

    async def down() -> Any:
        raise origins.OriginError("the source is down")

    monkeypatch.setattr(cluster.nodes["n0"].agent.datasets.get("train").origin, "listing", down)
    with pytest.raises(OSError, match="source is down"):
        await asyncio.to_thread(read_all, cluster.nodes["n0"].fs(cluster.token), files)
    assert cluster.leader().app[cachedata.DATA_KEY].listings == {}  # n0 gave its listing claim up
    assert await asyncio.to_thread(read_all, cluster.nodes["n1"].fs(cluster.token), files) == files


async def test_many_small_files_cost_one_request_per_chunk_not_per_file(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source, big=0, small=600)
    await nodes_with(cluster, source, count=1)
    node = cluster.nodes["n0"]
    await asyncio.to_thread(read_all, node.fs(cluster.token), files)
    counters = node.agent.datasets.counters()
    chunk_count = -(-sum(len(d) for d in files.values()) // CHUNK)
    assert counters["hits"] + counters["misses"] <= 2 * chunk_count  # not 600


async def test_concurrent_readers_of_a_chunk_wait_for_one_fetch(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source, big=1, small=0)
    await nodes_with(cluster, source, count=1)
    fs = cluster.nodes["n0"].fs(cluster.token)
    start = threading.Barrier(4)
    results: list[bytes] = []

    def reader() -> None:
        start.wait()
        results.append(fs.cat("data/train/shards/big-0.bin"))

    await asyncio.gather(*(asyncio.to_thread(reader) for _ in range(4)))
    assert results == [files["shards/big-0.bin"]] * 4
    assert from_source(cluster) == len(files["shards/big-0.bin"])


async def test_a_peer_that_dies_mid_read_is_replaced_by_another_source(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source, big=2, small=0)
    await nodes_with(cluster, source, count=2)
    await asyncio.to_thread(read_all, cluster.nodes["n0"].fs(cluster.token), files)  # n0 holds everything
    fs1 = cluster.nodes["n1"].fs(cluster.token)
    path = "data/train/shards/big-1.bin"
    expected = files["shards/big-1.bin"]
    handle = await asyncio.to_thread(fs1.open, path, "rb")
    first = await asyncio.to_thread(handle.read, 2 * MiB)
    await cluster.stop_node("n0")  # the only holder goes away while n1 reads
    rest = await asyncio.to_thread(handle.read)
    assert first + rest == expected
    counters = cluster.nodes["n1"].agent.datasets.counters()
    assert counters["bytes_from_source"] > 0  # the chunks n0 did not deliver came from the source


async def test_a_busy_holder_is_asked_again_and_the_source_is_not_read_twice(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source, big=2, small=0)
    await nodes_with(cluster, source, count=2)
    await asyncio.to_thread(read_all, cluster.nodes["n0"].fs(cluster.token), files)  # n0 holds everything
    holder = cluster.nodes["n0"].agent.peer_server
    holder.upload_slots = 0  # every upload slot taken: n0 answers 429
    reading = asyncio.ensure_future(asyncio.to_thread(read_all, cluster.nodes["n1"].fs(cluster.token), files))
    await cluster.wait_until(lambda: holder.refused_busy >= 3, what="n1 turned away by busy n0")
    holder.upload_slots = 8
    assert await reading == files
    assert from_source(cluster) == sum(len(d) for d in files.values())  # n1 waited for n0, not the source
    assert cluster.nodes["n1"].agent.datasets.counters()["bytes_from_peers"] == from_source(cluster)


async def test_a_source_that_changes_is_detected_refetched_and_never_mixed(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source, big=1, small=0)
    await nodes_with(cluster, source, count=2, list_ttl=0.3)
    path = "data/train/shards/big-0.bin"
    old = files["shards/big-0.bin"]
    fs0, fs1 = cluster.nodes["n0"].fs(cluster.token), cluster.nodes["n1"].fs(cluster.token)
    assert await asyncio.to_thread(fs0.cat, path) == old
    opened = await asyncio.to_thread(fs1.open, path, "rb")  # pinned to the old revision
    head = await asyncio.to_thread(opened.read, MiB)  # chunk 0 (old) is now on n1
    new = os.urandom(len(old))
    (source / "shards/big-0.bin").write_bytes(new)  # same size, new content and mtime
    await asyncio.sleep(0.5)  # past the listing's staleness period (0.3 s)
    fresh = cluster.nodes["n2"].fs(cluster.token) if "n2" in cluster.nodes else fs0
    assert await asyncio.to_thread(fresh.cat, path) == new  # a new open sees the new revision
    try:
        rest = await asyncio.to_thread(opened.read)
    except OSError as exc:
        assert exc.errno == errno.ESTALE  # the old revision cannot be completed: never a mix
    else:
        assert head + rest == old  # or it completes from copies of the old revision
    assert await asyncio.to_thread(fs1.cat, path) == new


async def test_memory_only_with_a_budget_smaller_than_the_dataset(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source, big=4, small=0)  # ~20 MiB in 3 chunks of 8 MiB
    await nodes_with(cluster, source, count=1, memory_bytes=16 * MiB, ssd_dir=None, ssd_bytes=0)
    node = cluster.nodes["n0"]
    for _ in range(2):
        assert await asyncio.to_thread(read_all, node.fs(cluster.token), files) == files
        assert node.agent.store.book.used(chunks.MEMORY) <= 16 * MiB


async def test_bad_reads_fail_clearly(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source, big=0, small=3)
    await nodes_with(cluster, source, count=1)
    fs = cluster.nodes["n0"].fs(cluster.token)

    def bad() -> None:
        with fs.open("data/train/images/00001.jpg", "rb") as f:
            f.seek(len(files["images/00001.jpg"]) + 10)
            assert f.read(100) == b""  # past the end: nothing, no error
        with pytest.raises(FileNotFoundError, match=r"missing\.jpg"):
            fs.open("data/train/images/missing.jpg", "rb")
        with pytest.raises(PermissionError):
            fs.open("data/train/../../etc/passwd", "rb")
        with pytest.raises(FileNotFoundError):
            fs.open("data/nosuch/x", "rb")
        with pytest.raises(PermissionError, match="read-only"):
            fs.open("data/train/new.bin", "wb")

    await asyncio.to_thread(bad)


async def test_warm_up_fills_every_node_reading_the_source_about_once(cluster: Cluster, source: Path) -> None:
    files = make_dataset(source, big=3, small=100)
    total = sum(len(d) for d in files.values())
    await nodes_with(cluster, source, count=3, warmup=True)

    def warmed() -> bool:
        return all(
            n.agent.datasets.get("train").warm_total and
            n.agent.datasets.get("train").warm_done == n.agent.datasets.get("train").warm_total
            for n in cluster.nodes.values()
        )  # fmt: skip

    await cluster.wait_until(warmed, within=60, what="warm-up on every node")
    assert from_source(cluster) <= 1.05 * total + CHUNK  # about once (a claim that expired may repeat one chunk)
    leader = cluster.leader()

    def report() -> dict[str, Any]:  # the master's view, as the operator shows it
        sources: dict[str, Any] = leader.app[cachedata.DATA_KEY].status(leader.state)["sources"]
        return sources["train"]

    await cluster.wait_until(lambda: report()["nodes_complete"] == 3, what="every node reported complete")
    assert report()["percent"] == 100 and report()["cached_bytes"] == total
