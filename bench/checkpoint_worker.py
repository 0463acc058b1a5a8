"""The training-process side of ``bench/checkpoint.py``: runs inside one testbed node and prints one JSON line.

    python -m bench.checkpoint_worker save --size 1Gi --local-dir DIR --dcp s3://bucket/dcp --path step-1/model.pt
    python -m bench.checkpoint_worker restore --size 1Gi --path step-1/model.pt
    python -m bench.checkpoint_worker dcp-load --size 1Gi --dcp s3://bucket/dcp

The state dict is generated from a fixed seed (so a restore on another node is compared tensor by
tensor with a fresh copy of the same values). ``save`` measures, on one state dict:
- ``copy_fresh_s``: cloning every tensor into new memory (the snapshot any async checkpoint makes);
- ``copy_reused_s``: copying every tensor into buffers allocated and touched before (a warm snapshot);
- ``torch_save_s``: ``torch.save`` to a local file, and ``torch_save_fsync_s`` with ``os.fsync`` after;
- ``ringseed_first_stall_s`` / ``ringseed_stall_s``: ``ringseed.fs.checkpoint.save`` until it
  returns (the training loop's stall: the snapshot), for the first save (staging allocated) and a
  later one (staging reused); ``ringseed_ack_s`` until the later save is held on ``replicas`` nodes;
- ``ringseed_sync_s``: ``torch.save(sd, fs.open(path, "wb"))`` with its close (the synchronous path);
- ``dcp_s3_s``: ``torch.distributed.checkpoint.save`` with fsspec's S3 writer (the baseline to the
  sink), run before ringseed's saves so that their persisting does not share the sink's link.
``restore`` reads the object's bytes through the SDK (the transfer into this node, verified:
``restore_s``), then ``torch.load``s it (``load_s``) and compares every tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch


def state_dict(size: int, *, seed: int = 7) -> dict[str, torch.Tensor]:
    """About ``size`` bytes of float32 tensors of transformer-like shapes, from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    left, i = size // 4, 0
    while left > 0:
        n = min(left, 4096 * 4096)
        rows = max(1, n // 4096)
        out[f"layers.{i}.weight"] = torch.randn(rows, n // rows, generator=g)
        left -= rows * (n // rows)
        i += 1
    return out


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _copy_into_warm(sd: dict[str, torch.Tensor]) -> float:
    warm = {k: torch.empty_like(v).fill_(0) for k, v in sd.items()}
    return timed(lambda: [warm[k].copy_(v) for k, v in sd.items()])


def _save(args: argparse.Namespace) -> dict[str, Any]:
    from ringseed.fs import checkpoint, spec

    sd = state_dict(args.size)
    result: dict[str, Any] = {"bytes": sum(t.numel() * t.element_size() for t in sd.values())}
    result["copy_fresh_s"] = timed(lambda: {k: v.clone() for k, v in sd.items()})
    result["copy_reused_s"] = _copy_into_warm(sd)
    local = os.path.join(args.local_dir, "model.pt")
    result["torch_save_s"] = timed(lambda: torch.save(sd, local))

    def save_fsync() -> None:
        with open(local, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())

    result["torch_save_fsync_s"] = timed(save_fsync)
    os.unlink(local)
    if args.dcp:  # before ringseed's saves: the sink's link is idle for the baseline
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        # a long read timeout: completing a 1 GiB multipart upload takes moto (the stand-in) a while
        writer = FsspecWriter(args.dcp, config_kwargs={"read_timeout": 1800})
        result["dcp_s3_s"] = timed(lambda: dcp.save(sd, storage_writer=writer))
    fs = spec.RingseedFileSystem()
    started = time.perf_counter()
    cold = checkpoint.save(sd, "warmup/model.pt")  # the first save: staging buffers are allocated
    result["ringseed_first_stall_s"] = time.perf_counter() - started
    cold.wait(timeout=600)
    fs.rm("warmup", recursive=True)  # measured; not worth persisting
    started = time.perf_counter()
    handle = checkpoint.save(sd, args.path)  # a later save: staging buffers are warm
    result["ringseed_stall_s"] = time.perf_counter() - started
    ack = handle.wait(timeout=600)
    result["ringseed_ack_s"] = time.perf_counter() - started
    result["copies"] = ack["copies"]

    def sync_save() -> None:
        with fs.open(args.path + ".sync", "wb") as f:
            torch.save(sd, f)

    result["ringseed_sync_s"] = timed(sync_save)
    fs.rm(args.path + ".sync")  # measured; not worth persisting
    return result


def _compare(loaded: dict[str, torch.Tensor], size: int) -> bool:
    expected = state_dict(size)
    return loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)


def _restore(args: argparse.Namespace) -> dict[str, Any]:
    """Read the checkpoint's bytes through the SDK (the transfer: peers or sink into this node's
    cache, verified), then ``torch.load`` it from the now-local copy and compare the tensors."""
    from ringseed.fs import checkpoint

    block = bytearray(64 << 20)
    started = time.perf_counter()
    with checkpoint.open_read(args.path) as f:
        size = f.size
        while f.readinto(block):
            pass
    transfer = time.perf_counter() - started
    started = time.perf_counter()
    with checkpoint.open_read(args.path) as f:
        loaded = torch.load(f, weights_only=True)
    load = time.perf_counter() - started
    return {"restore_s": transfer, "load_s": load, "bytes": size, "ok": _compare(loaded, args.size)}


def _dcp_load(args: argparse.Namespace) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    target = {k: torch.empty_like(v) for k, v in state_dict(args.size).items()}
    reader = FsspecReader(args.dcp, config_kwargs={"read_timeout": 1800})
    seconds = timed(lambda: dcp.load(target, storage_reader=reader))
    return {"dcp_load_s": seconds, "ok": _compare(target, args.size)}


def main() -> int:
    import warnings

    from ringseed.protocol import units

    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=("save", "restore", "dcp-load"))
    parser.add_argument("--size", type=units.parse_size, default=1 << 30)
    parser.add_argument("--path", default="step-1/model.pt")
    parser.add_argument("--local-dir", default="/tmp")
    parser.add_argument("--dcp", default=None, help="s3://bucket/prefix for the DCP baseline")
    args = parser.parse_args()
    steps = {"save": _save, "restore": _restore, "dcp-load": _dcp_load}
    print(json.dumps(steps[args.step](args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
