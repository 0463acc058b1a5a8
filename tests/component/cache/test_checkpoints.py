"""The node cache end to end in one process: write through the SDK, replicas, reads, metadata ops, bad paths."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os

import pytest

from tests.component.cache.cluster import Cluster, MiB


async def three_nodes(cluster: Cluster, **settings: object) -> None:
    await cluster.start_master(**settings)
    for name in ("n0", "n1", "n2"):
        await cluster.start_node(name)


def write(fs: object, path: str, data: bytes, *, piece: int = 3 * MiB + 17) -> dict:
    with fs.open(path, "wb") as f:  # type: ignore[attr-defined]
        for start in range(0, len(data), piece):
            f.write(data[start : start + piece])
    return f.result  # type: ignore[no-any-return]


async def test_a_write_is_acknowledged_with_replicas_and_reads_back_identical(cluster: Cluster) -> None:
    await three_nodes(cluster, replicas=2)
    data = os.urandom(21 * MiB + 12345)  # three 8 MiB chunks, the last one short
    fs0 = cluster.nodes["n0"].fs(cluster.token)
    result = await asyncio.to_thread(write, fs0, "step-1/model.pt", data)
    assert result["copies"] == ["n0", "n1"] and result["size"] == len(data)
    # the replica holds every chunk already (acknowledged means held there)
    chunks = [c.sha256 for c in cluster.leader().state.meta.get("step-1/model.pt").chunks]
    assert len(chunks) == 3
    for sha in chunks:
        assert cluster.nodes["n1"].agent.store.has(sha)
        assert not cluster.nodes["n2"].agent.store.has(sha)
    # n2 holds nothing: it restores from a peer, verified, byte-identical
    fs2 = cluster.nodes["n2"].fs(cluster.token)
    back = await asyncio.to_thread(lambda: fs2.open("ringseed://step-1/model.pt", "rb").read())
    assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
    assert cluster.nodes["n2"].agent.reads.sources["peer"] == 3


async def test_a_checkpoint_whose_writer_node_is_lost_gets_its_second_copy_back(cluster: Cluster) -> None:
    await three_nodes(cluster, replicas=2, offline_after=1.0)
    data = os.urandom(17 * MiB + 3)
    result = await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "step-7/model.pt", data)
    assert result["copies"] == ["n0", "n1"]
    obj = cluster.leader().state.meta.get("step-7/model.pt")
    await cluster.stop_node("n0")  # lost before the checkpoint was persisted (there is no sink)
    await cluster.wait_until(lambda: "n0" not in cluster.leader().state.nodes.nodes, what="n0 purged")
    await cluster.wait_until(lambda: cluster.leader().state.nodes.copies(obj) == 2, what="two copies again")
    assert all(cluster.nodes["n2"].agent.store.has(c.sha256) for c in obj.chunks)
    assert cluster.nodes["n2"].agent.copies.copied_objects == 1
    await cluster.stop_node("n1")  # a second loss loses nothing either
    fs2 = cluster.nodes["n2"].fs(cluster.token)
    assert await asyncio.to_thread(lambda: fs2.open("step-7/model.pt", "rb").read()) == data


async def test_a_restore_waits_for_busy_holders_instead_of_failing(cluster: Cluster) -> None:
    await three_nodes(cluster, replicas=2)
    data = os.urandom(17 * MiB + 3)
    await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "step-9/model.pt", data)
    holders = [cluster.nodes[n].agent.peer_server for n in ("n0", "n1")]
    for server in holders:
        server.upload_slots = 0  # both copies busy serving others
    fs2 = cluster.nodes["n2"].fs(cluster.token)
    reading = asyncio.ensure_future(asyncio.to_thread(lambda: fs2.open("step-9/model.pt", "rb").read()))
    await cluster.wait_until(lambda: sum(s.refused_busy for s in holders) >= 4, what="n2 turned away by both")
    for server in holders:
        server.upload_slots = 8
    assert await reading == data  # there is no sink: giving up on busy holders would have failed the read
    assert cluster.nodes["n2"].agent.reads.sources["peer"] == 3


async def test_random_reads_and_seeks_match_the_bytes(cluster: Cluster) -> None:
    await three_nodes(cluster, replicas=1)
    data = os.urandom(17 * MiB + 3)
    fs = cluster.nodes["n1"].fs(cluster.token)
    await asyncio.to_thread(write, fs, "a/b.bin", data)

    def reads() -> None:
        with fs.open("a/b.bin", "rb") as f:
            for offset, length in [(0, 10), (8 * MiB - 5, 10), (17 * MiB - 2, 100), (5, 16 * MiB), (len(data), 4)]:
                f.seek(offset)
                assert f.read(length) == data[offset : offset + length]
            f.seek(-3, os.SEEK_END)
            assert f.read() == data[-3:]

    await asyncio.to_thread(reads)


async def test_empty_and_tiny_files_and_metadata_operations(cluster: Cluster) -> None:
    await three_nodes(cluster, replicas=2)
    fs = cluster.nodes["n0"].fs(cluster.token)

    def ops() -> None:
        write(fs, "ck/empty", b"")
        write(fs, "ck/tiny", b"x")
        fs.makedirs("ck/sub", exist_ok=True)
        write(fs, "ck/sub/deep.txt", b"hello")
        assert fs.cat("ck/empty") == b"" and fs.cat("ck/tiny") == b"x"
        assert sorted(fs.ls("ck", detail=False)) == ["ck/empty", "ck/sub", "ck/tiny"]
        assert fs.info("ck/sub")["type"] == "directory" and fs.info("ck/tiny")["size"] == 1
        fs.mv("ck/tiny", "ck/renamed")
        assert not fs.exists("ck/tiny") and fs.cat("ck/renamed") == b"x"
        fs.mv("ck", "moved")
        assert fs.cat("moved/sub/deep.txt") == b"hello"
        with pytest.raises(OSError, match="directory"):
            fs.rm("moved")
        fs.rm("moved", recursive=True)
        assert fs.ls("", detail=False) == []
        with pytest.raises(FileNotFoundError):
            fs.open("moved/renamed", "rb")

    await asyncio.to_thread(ops)


@pytest.mark.parametrize("path", ["../escape", "a/../../b", "data/x", "/../x"])
async def test_a_path_that_leaves_the_group_tree_is_refused(cluster: Cluster, path: str) -> None:
    await three_nodes(cluster, replicas=1)
    fs = cluster.nodes["n0"].fs(cluster.token)
    with pytest.raises(PermissionError, match=r"refused|read-only"):
        await asyncio.to_thread(write, fs, path, b"bad")
    assert cluster.leader().state.meta.objects == {}


async def test_an_exception_in_the_writer_leaves_nothing_visible(cluster: Cluster) -> None:
    await three_nodes(cluster, replicas=2)
    fs = cluster.nodes["n0"].fs(cluster.token)

    def failing() -> None:
        write(fs, "ck/model.pt", b"old")
        with pytest.raises(RuntimeError), fs.open("ck/model.pt", "wb") as f:
            f.write(os.urandom(9 * MiB))
            raise RuntimeError("training crashed mid-save")
        assert fs.cat("ck/model.pt") == b"old"

    await asyncio.to_thread(failing)
    assert cluster.nodes["n0"].agent.writes.sessions == {}


async def test_a_transaction_records_its_files_together(cluster: Cluster) -> None:
    await three_nodes(cluster, replicas=2)
    fs = cluster.nodes["n0"].fs(cluster.token)

    def transact() -> None:
        with fs.transaction:
            for i in range(3):
                with fs.open(f"tx/{i}.bin", "wb") as f:
                    f.write(bytes([i]) * 1000)
            assert not fs.exists("tx/0.bin")  # nothing visible before the end
        assert [fs.cat(f"tx/{i}.bin") for i in range(3)] == [bytes([i]) * 1000 for i in range(3)]

    await asyncio.to_thread(transact)
    versions = {m.version for m in cluster.leader().state.meta.objects.values()}
    assert len(versions) == 1  # one log entry


async def test_not_enough_nodes_for_the_replicas_is_a_clear_error(cluster: Cluster) -> None:
    await cluster.start_master(replicas=3)
    await cluster.start_node("n0")
    await cluster.start_node("n1")
    fs = cluster.nodes["n0"].fs(cluster.token)
    with pytest.raises(OSError, match="3 copies asked") as caught:
        await asyncio.to_thread(write, fs, "ck/x", b"data")
    assert caught.value.errno == errno.EAGAIN
