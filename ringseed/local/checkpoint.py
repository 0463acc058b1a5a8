"""``ringseed local checkpoint``: save a checkpoint into N local cache agents, kill the writer's node, restore.

Owns the command: it starts two cache master replicas and N cache agents on 127.0.0.1 as
processes (:class:`ringseed.local.cacheswarm.CacheSwarm`), then acts as a training process on
``node-0``: it saves a checkpoint of ``--size`` random bytes with the async API (the *stall* is
the time until the save call returns; the *acknowledgement* is when ``replicas`` nodes hold it),
SIGKILLs ``node-0``'s agent and wipes its tiers (the node is lost), and restores the checkpoint
on the last node, which never held it, from the surviving copy (the *restore*). With
``--sink`` it also waits until the checkpoint is persisted. Every byte read back is compared
with what was written (SHA-256). ``--json`` prints one object: ``ok``, ``bytes``,
``stall_seconds``, ``ack_seconds``, ``restore_seconds``, ``restore_gbps``, ``copies``,
``restored_from`` (chunks per source), ``persisted`` and ``persist_seconds`` (with a sink).
Exit status 0 only when the restored bytes are identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ringseed import cmdline


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=cmdline.positive_int, default=3, help="cache agents (at least 2)")
    parser.add_argument("--size", type=cmdline.positive_size, default="256Mi", help="checkpoint size, e.g. 1Gi")
    parser.add_argument(
        "--replicas", type=cmdline.positive_int, default=2, help="copies of each write held before it is acknowledged"
    )
    parser.add_argument(
        "--chunk-size", type=cmdline.positive_size, default="32Mi", help="chunk size of written objects (5Mi to 1Gi)"
    )
    parser.add_argument(
        "--memory-bytes", type=cmdline.positive_size, default="2Gi", help="memory tier budget per agent"
    )
    parser.add_argument("--ssd-bytes", type=cmdline.size, default="4Gi", help="SSD tier budget per agent")
    parser.add_argument("--sink", default=None, help="file:// or s3:// to persist to")
    parser.add_argument("--persist-rate-limit", type=cmdline.positive_size, default=None, help="bytes/s to the sink")
    parser.add_argument("--workdir", help="directory for logs and SSD tiers (default: a temp dir)")
    parser.add_argument(
        "--timeout", type=cmdline.positive_seconds, default=600.0, help="give up after this many seconds"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _payload(size: int) -> bytes:
    import numpy as np

    return np.random.default_rng(12345).integers(0, 256, size=size, dtype=np.uint8).tobytes()


def run(args: argparse.Namespace) -> int:
    from ringseed.local import cacheswarm
    from ringseed.protocol import units

    if args.nodes < 2 or args.replicas > args.nodes - 1:
        print("ringseed local checkpoint: need --nodes >= 2 and --replicas <= nodes - 1", file=sys.stderr)
        return 2
    size = units.parse_size(args.size)
    rate = units.parse_size(args.persist_rate_limit) if args.persist_rate_limit else None
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ringseed-checkpoint-"))
    with cacheswarm.CacheSwarm(
        nodes=args.nodes,
        workdir=workdir,
        replicas=args.replicas,
        memory_bytes=units.parse_size(args.memory_bytes),
        ssd_bytes=units.parse_size(args.ssd_bytes),
        chunk_size=units.parse_size(args.chunk_size),
        sink=args.sink,
        persist_rate_limit=rate,
    ) as local:
        local.start()
        local.wait_ready(timeout=args.timeout)
        local.wait_follower(timeout=args.timeout)
        result = _scenario(local, payload=_payload(size), timeout=args.timeout)
    result["workdir"] = str(workdir)
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0 if result["ok"] else 1


def _scenario(local: Any, *, payload: bytes, timeout: float) -> dict[str, Any]:
    from ringseed.fs import checkpoint, spec

    writer, reader = local.names[0], local.names[-1]
    path = "step-000100/model.bin"
    env = local.env_for(writer)
    started = time.perf_counter()
    writer_fs = spec.RingseedFileSystem(socket=env["RINGSEED_CACHE_SOCKET"], token=env["RINGSEED_TOKEN"])
    handle = checkpoint.save_bytes(payload, path, fs=writer_fs)
    stall = time.perf_counter() - started
    ack = handle.wait(timeout=timeout)
    ack_seconds = time.perf_counter() - started
    local.kill(writer)
    shutil.rmtree(local.shm_dir / writer, ignore_errors=True)
    shutil.rmtree(local.node_dir(writer) / "ssd", ignore_errors=True)
    env = local.env_for(reader)
    fs = spec.RingseedFileSystem(socket=env["RINGSEED_CACHE_SOCKET"], token=env["RINGSEED_TOKEN"])
    digest = hashlib.sha256()
    started = time.perf_counter()
    with fs.open(path, "rb") as f:
        while block := f.read(64 << 20):
            digest.update(block)
    restore = time.perf_counter() - started
    agent = local.agent_status(reader) or {}
    result: dict[str, Any] = {
        "ok": digest.digest() == hashlib.sha256(payload).digest(),
        "bytes": len(payload),
        "stall_seconds": round(stall, 4),
        "ack_seconds": round(ack_seconds, 4),
        "restore_seconds": round(restore, 4),
        "restore_gbps": round(len(payload) * 8 / restore / 1e9, 3),
        "copies": ack.get("copies"),
        "restored_from": agent.get("sources"),
        "persisted": None,
    }
    if local.sink:
        result.update(_wait_persisted(local, path, timeout=timeout, since=started - ack_seconds))
    return result


def _wait_persisted(local: Any, path: str, *, timeout: float, since: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = local.status() or {}
        last = status.get("last_checkpoint") or {}
        if last.get("persisted"):
            return {"persisted": True, "persist_seconds": round(time.perf_counter() - since, 3)}
        time.sleep(0.2)
    return {"persisted": False, "persist_seconds": None}


def _print(result: dict[str, Any]) -> None:
    mib = result["bytes"] / (1 << 20)
    print(f"checkpoint {mib:.0f} MiB: stall {result['stall_seconds']:.3f} s, acknowledged with copies on "
          f"{result['copies']} after {result['ack_seconds']:.3f} s")  # fmt: skip
    print(f"writer's node killed; restored on another node in {result['restore_seconds']:.3f} s "
          f"({result['restore_gbps']:.2f} Gbit/s) from {result['restored_from']}")  # fmt: skip
    if result.get("persisted") is not None:
        print(f"persisted to the sink: {result['persisted']} ({result.get('persist_seconds')} s after the save)")
    print("OK: restored bytes identical" if result["ok"] else "FAILED: restored bytes differ", file=sys.stderr)
