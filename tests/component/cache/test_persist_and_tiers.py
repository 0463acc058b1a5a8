"""Persist behind to a file:// sink, restore from the sink, budgets (spill to SSD, back-pressure), corrupt copies."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest

from ringseed.cache import chunks
from tests.component.cache.cluster import Cluster, MiB
from tests.component.cache.test_checkpoints import write


def persisted(cluster: Cluster, path: str) -> bool:
    obj = cluster.leader().state.meta.objects.get(path)
    return obj is not None and obj.persisted


async def test_checkpoints_are_persisted_behind_and_restored_from_the_sink(cluster: Cluster, tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    await cluster.start_master(replicas=2, sink=True)
    for name in ("n0", "n1"):
        await cluster.start_node(name, sink=f"file://{sink}", persist_rate_limit=64 * MiB)
    data = os.urandom(19 * MiB + 5)
    await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "step-3/model.pt", data)
    await cluster.wait_until(lambda: persisted(cluster, "step-3/model.pt"), what="persisted")
    assert (sink / "step-3/model.pt").read_bytes() == data
    sidecar = json.loads((sink / ".ringseed-objects/step-3/model.pt.json").read_text())
    assert sidecar["size"] == len(data) and len(sidecar["chunks"]) == 3
    # both holders go away; a new node restores from the sink, every chunk verified
    await cluster.stop_node("n0")
    await cluster.stop_node("n1")
    await cluster.start_node("n2", sink=f"file://{sink}")
    fs = cluster.nodes["n2"].fs(cluster.token)
    back = await asyncio.to_thread(lambda: fs.open("step-3/model.pt", "rb").read())
    assert back == data and cluster.nodes["n2"].agent.reads.sources["sink"] == 3


async def test_a_sink_that_is_down_keeps_checkpoints_cached_and_they_go_out_when_it_returns(
    cluster: Cluster, tmp_path: Path
) -> None:
    sink = tmp_path / "sink"
    sink.mkdir()
    os.chmod(sink, 0o500)  # unwritable: every upload fails (as root too: see below)
    blocked = sink / "step-1"
    blocked.write_text("a file where the checkpoint directory must go")  # makes the write fail even for root
    await cluster.start_master(replicas=1, sink=True)
    await cluster.start_node("n0", sink=f"file://{sink}")
    data = os.urandom(3 * MiB)
    await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "step-1/m.pt", data)
    persister = cluster.nodes["n0"].agent.persister
    await cluster.wait_until(lambda: persister.failures, what="a failed upload")
    assert not persisted(cluster, "step-1/m.pt")
    assert cluster.leader().state.status()["last_checkpoint"]["persisted"] is False
    blocked.unlink()
    os.chmod(sink, 0o700)
    await cluster.wait_until(lambda: persisted(cluster, "step-1/m.pt"), within=60.0, what="persisted after recovery")
    assert (sink / "step-1/m.pt").read_bytes() == data


async def test_a_memory_budget_smaller_than_the_checkpoint_spills_to_ssd(cluster: Cluster) -> None:
    await cluster.start_master(replicas=1)
    await cluster.start_node("n0", memory_bytes=16 * MiB, ssd_bytes=128 * MiB)
    node = cluster.nodes["n0"].agent
    data = os.urandom(60 * MiB)
    await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "big/model.pt", data)
    book = node.store.book
    assert book.used(chunks.MEMORY) <= 16 * MiB and book.used(chunks.SSD) >= 44 * MiB
    back = await asyncio.to_thread(lambda: cluster.nodes["n0"].fs(cluster.token).cat("big/model.pt"))
    assert back == data


async def test_when_ssd_is_full_too_the_writer_gets_a_clear_error(cluster: Cluster) -> None:
    await cluster.start_master(replicas=1)
    await cluster.start_node("n0", memory_bytes=16 * MiB, ssd_bytes=16 * MiB, write_deadline=1.0)
    with pytest.raises(OSError, match=r"memory tier full.*not yet persisted") as caught:
        await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "big/model.pt", os.urandom(40 * MiB))
    assert caught.value.errno == 28  # ENOSPC
    assert cluster.leader().state.meta.objects == {}
    book = cluster.nodes["n0"].agent.store.book
    assert book.used(chunks.MEMORY) <= 16 * MiB and book.used(chunks.SSD) <= 16 * MiB


class _HolderFirst:
    """Stands in for the reader's shuffle: ``name``'s copy is tried first."""

    def __init__(self, name: str) -> None:
        self.name = name

    def shuffle(self, items: list[list[str]]) -> None:
        items.sort(key=lambda holder: holder[0] != self.name)


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


async def test_a_corrupted_replica_is_detected_and_another_copy_is_used(cluster: Cluster) -> None:
    await cluster.start_master(replicas=3)
    for name in ("n0", "n1", "n2"):
        await cluster.start_node(name)
    data = os.urandom(17 * MiB)
    await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "ck/m.pt", data)
    first, second, _ = [c.sha256 for c in cluster.leader().state.meta.get("ck/m.pt").chunks]
    n1, n2 = cluster.nodes["n1"].agent, cluster.nodes["n2"].agent
    # chunk 0 rots on n1's disk while n1 is down: n1 checks it on first use, drops it, answers 404
    _flip(n1.store.path(first))
    n1.store.unverified.add(first)
    # chunk 1 rots on n1 after n1 checked it: only the receiver's hash can catch it
    _flip(n1.store.path(second))
    n2.store.drop(first)
    n2.store.drop(second)
    n2.reads.rng = _HolderFirst("n1")  # type: ignore[assignment]
    back = await asyncio.to_thread(lambda: cluster.nodes["n2"].fs(cluster.token).cat("ck/m.pt"))
    assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
    # dropped by its holder on first use (its copy duty may bring good bytes back at once)
    assert not n1.store.has(first) or chunks.file_sha256(n1.store.path(first)) == first
    assert n2.reads.rejected == 1  # chunk 1's bad bytes were refused by n2, then taken from n0
    assert n2.reads.sources["peer"] == 2
