"""torch through ``ringseed://``, unchanged: torch.save/torch.load, DCP's fsspec writer and reader, async save."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.component.cache.cluster import Cluster

torch = pytest.importorskip("torch", reason="torch is not installed (RINGSEED_NO_TORCH=1)")


@pytest.fixture
async def nodes(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    await cluster.start_master(replicas=2)
    for name in ("n0", "n1"):
        await cluster.start_node(name)
    monkeypatch.setenv("RINGSEED_CACHE_SOCKET", str(cluster.nodes["n0"].socket))
    monkeypatch.setenv("RINGSEED_TOKEN", cluster.token)
    return cluster


def state_dict(seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": torch.randn(1024, 2048, generator=g),
        "layer.bias": torch.randn(2048, generator=g),
        "emb": torch.randint(0, 1000, (3000, 700), generator=g, dtype=torch.int32),
        "step": 7,
    }


def same(a: dict[str, object], b: dict[str, object]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]  # type: ignore[arg-type]
        for k in a
    )


async def test_torch_save_and_load_through_fsspec_open(nodes: Cluster) -> None:
    import fsspec

    sd = state_dict()

    def roundtrip() -> object:
        with fsspec.open("ringseed://step-7/model.pt", "wb") as f:
            torch.save(sd, f)
        with fsspec.open("ringseed://step-7/model.pt", "rb") as f:
            return torch.load(f, weights_only=True)

    assert same(sd, await asyncio.to_thread(roundtrip))  # type: ignore[arg-type]


async def test_distributed_checkpoint_fsspec_writer_and_reader(nodes: Cluster) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    sd = {k: v for k, v in state_dict(1).items() if isinstance(v, torch.Tensor)}

    def save_and_load() -> dict[str, object]:
        dcp.save(sd, storage_writer=FsspecWriter("ringseed://dcp-step-1"))
        target = {k: torch.zeros_like(v) for k, v in sd.items()}
        dcp.load(target, storage_reader=FsspecReader("ringseed://dcp-step-1"))
        return target

    assert same(sd, await asyncio.to_thread(save_and_load))  # type: ignore[arg-type]
    names = sorted(nodes.leader().state.meta.objects)
    assert "dcp-step-1/.metadata" in names and not any(n.endswith(".tmp") for n in names)


async def test_async_save_returns_before_the_acknowledgement_and_wait_gives_it(nodes: Cluster) -> None:
    from ringseed.fs import checkpoint

    sd = state_dict(2)

    def save() -> tuple[dict[str, object], object]:
        handle = checkpoint.save(sd, "async/model.pt")
        result = handle.wait(timeout=60)
        return result, torch.load(checkpoint.open_read("async/model.pt"), weights_only=True)

    result, back = await asyncio.to_thread(save)
    assert result["copies"] == ["n0", "n1"]  # type: ignore[index]
    assert same(sd, back)  # type: ignore[arg-type]


def test_the_filesystem_is_registered_through_the_entry_point(tmp_path: Path) -> None:
    import fsspec

    from ringseed.fs import spec

    assert fsspec.get_filesystem_class("ringseed") is spec.RingseedFileSystem


async def test_async_save_takes_a_snapshot_so_training_may_change_the_tensors_at_once(nodes: Cluster) -> None:
    from ringseed.fs import checkpoint

    sd = state_dict(3)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sd.items()}

    def save_then_train() -> tuple[object, object]:
        first = checkpoint.save(sd, "snap/1.pt")
        for value in sd.values():  # the next training step overwrites the weights in place
            if isinstance(value, torch.Tensor):
                value.add_(1)
        first.wait(timeout=60)
        second = checkpoint.save(sd, "snap/2.pt")  # same shapes: reuses the staging buffers
        second.wait(timeout=60)
        return (
            torch.load(checkpoint.open_read("snap/1.pt"), weights_only=True),
            torch.load(checkpoint.open_read("snap/2.pt"), weights_only=True),
        )

    one, two = await asyncio.to_thread(save_then_train)
    assert same(before, one)  # type: ignore[arg-type]
    assert same(sd, two)  # type: ignore[arg-type]
    checkpoint.release_staging()


async def test_a_failed_async_save_raises_on_wait_is_logged_and_the_next_save_goes_on(
    nodes: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    from ringseed.fs import checkpoint

    sd = state_dict(5)

    def save_twice() -> tuple[BaseException | None, dict[str, object]]:
        bad = checkpoint.save(sd, "../outside/model.pt")  # refused by the cache, behind the caller
        good = checkpoint.save(sd, "after/model.pt")
        error = None
        try:
            bad.wait(timeout=60)
        except Exception as exc:
            error = exc
        return error, good.wait(timeout=60)

    with caplog.at_level("ERROR", logger="ringseed.fs.checkpoint"):
        error, acked = await asyncio.to_thread(save_twice)
    assert isinstance(error, PermissionError)
    assert acked["path"] == "after/model.pt" and len(acked["copies"]) == 2
    assert [r.args[0] for r in caplog.records if r.levelname == "ERROR"] == ["../outside/model.pt"]  # type: ignore[index]
    assert sorted(nodes.leader().state.meta.objects) == ["after/model.pt"]
    checkpoint.release_staging()
