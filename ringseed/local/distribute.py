"""``ringseed local distribute``: deliver a model to N local agents and show live progress.

Owns the command: it starts a master and N agents on 127.0.0.1 as separate processes
(:class:`ringseed.local.swarm.LocalSwarm`), prints a progress line (nodes done, bytes,
throughput, ETA) to stderr until every node holds a verified copy, checks each node's final
copy against the manifest, and prints a summary (or, with ``--json``, one JSON object on
stdout: ``ok``, ``seconds``, ``lower_bound_seconds``, ``model_bytes``, ``origin_bytes``,
``nodes: {name: {complete, verified, bytes_fetched}}``). Exit code 0 only when every node holds
a verified copy. Every child process is cleaned up on exit, error and Ctrl-C.

``--demo`` writes a 256 MiB model of several odd-sized files into the work directory first.
``lower_bound_seconds`` is size / origin rate plus one chunk time per doubling of the swarm
(null without ``--origin-rate-limit``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEMO_FILES = {
    "config.json": 1_337,
    "model-00001-of-00003.safetensors": 100 * (1 << 20) + 12_345,
    "model-00002-of-00003.safetensors": 100 * (1 << 20) - 4_321,
    "model-00003-of-00003.safetensors": 56 * (1 << 20) - 9_024 - 1_337 - 77,
    "tokenizer/vocab.txt": 77,
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="file://DIR, http(s):// or s3:// URI (or a local path)")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--workdir", help="directory for node data, caches and logs (default: a temp dir)")
    parser.add_argument("--chunk-size", default="4Mi")
    parser.add_argument("--origin-rate-limit", default=None, help="bytes/s from the origin, e.g. 32Mi")
    parser.add_argument("--memory-bytes", default="64Mi", help="memory tier budget per agent")
    parser.add_argument("--seeders", type=int, default=1)
    parser.add_argument("--manifest-uri")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--demo", action="store_true", help="generate a 256 MiB demo model in the workdir")


def write_demo_model(root: Path, files: dict[str, int] = DEMO_FILES) -> Path:
    """Random files of odd sizes under ``root`` (kept if already there with the right sizes)."""
    for rel, size in files.items():
        path = root / rel
        if path.exists() and path.stat().st_size == size:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            left = size
            while left:
                block = os.urandom(min(left, 8 << 20))
                f.write(block)
                left -= len(block)
    return root


def lower_bound(*, size: int, rate: float | None, chunk_size: int, nodes: int) -> float | None:
    """T* = size / origin rate + one chunk time per doubling of the swarm."""
    if not rate:
        return None
    return size / rate + (chunk_size / rate) * math.ceil(math.log2(max(nodes, 1)) or 0)


def _progress(status: dict[str, Any], started: float, nodes: int) -> str:
    entries = status.get("nodes", {}).values()
    done = sum(1 for e in entries if e.get("verified"))
    have = sum(int(e.get("bytes", 0)) for e in entries)
    want = int(status.get("total_bytes", 0)) * nodes
    rate = float(status.get("throughput_bps") or 0) / (1 << 20)
    eta = status.get("eta_seconds")
    eta_text = "?" if eta is None else f"{eta:.0f}s"
    pct = 100.0 * have / want if want else 0.0
    return (
        f"\r{time.monotonic() - started:6.1f}s  nodes {done}/{nodes}  {have / (1 << 20):8.1f}/"
        f"{want / (1 << 20):.1f} MiB ({pct:5.1f}%)  {rate:7.1f} MiB/s  ETA {eta_text}   "
    )


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through LocalSwarm.close like Ctrl-C does


def run(args: argparse.Namespace) -> int:
    from ringseed.local import swarm
    from ringseed.protocol import units

    signal.signal(signal.SIGTERM, _exit_on_sigterm)

    with tempfile.TemporaryDirectory(prefix="ringseed-local-") as tmp:
        workdir = Path(args.workdir or tmp).resolve()
        source = args.source
        if args.demo:
            source = source or (write_demo_model(workdir / "demo-model")).as_uri()
        if not source:
            print("ringseed local distribute: give a SOURCE or --demo", file=sys.stderr)
            return 2
        if "://" not in source:
            source = Path(source).resolve().as_uri()
        rate = units.parse_size(args.origin_rate_limit) if args.origin_rate_limit else None
        chunk_size = units.parse_size(args.chunk_size)
        with swarm.LocalSwarm(
            source=source,
            nodes=args.nodes,
            workdir=workdir / "swarm",
            chunk_size=chunk_size,
            origin_rate_limit=rate,
            memory_bytes=units.parse_size(args.memory_bytes),
            seeders=args.seeders,
            manifest_uri=args.manifest_uri,
        ) as local:
            result = _drive(local, timeout=args.timeout, rate=rate, chunk_size=chunk_size)
        _report(result, as_json=args.json)
        return 0 if result["ok"] else 1


def _drive(local: Any, *, timeout: float, rate: float | None, chunk_size: int) -> dict[str, Any]:
    from ringseed.local import swarm

    started = time.monotonic()
    local.start()
    status: dict[str, Any] = {}
    error = None
    try:
        while time.monotonic() - started < timeout:
            status = local.status() or status
            if status:
                print(_progress(status, started, len(local.names)), end="", file=sys.stderr, flush=True)
            if status and local.all_verified(status):
                break
            local.check_alive()
            time.sleep(0.5)
        else:
            error = f"timed out after {timeout:.0f}s"
    except RuntimeError as exc:
        error = str(exc)
    seconds = time.monotonic() - started
    print(file=sys.stderr)
    expected = local.manifest()
    nodes: dict[str, Any] = {}
    missing = {"complete": False, "verified": False}
    for name in local.names:
        check = swarm.verify_copy(local.model_dir(name), expected) if expected else missing
        entry = status.get("nodes", {}).get(name, {})
        nodes[name] = dict(check, bytes_fetched=entry.get("bytes_fetched", 0))
    size = int(status.get("total_bytes", 0))
    return {
        "ok": error is None and bool(nodes) and all(n["verified"] for n in nodes.values()),
        "error": error,
        "seconds": round(seconds, 3),
        "lower_bound_seconds": lower_bound(size=size, rate=rate, chunk_size=chunk_size, nodes=len(local.names)),
        "model_bytes": size,
        "origin_bytes": int(status.get("bytes_from_origin", 0)),
        "manifest_digest": status.get("manifest_digest"),
        "nodes": nodes,
    }


def _report(result: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return
    verified = sum(1 for n in result["nodes"].values() if n["verified"])
    size = result["model_bytes"] or 1
    print(f"{'OK' if result['ok'] else 'FAILED'}: {verified}/{len(result['nodes'])} nodes hold a verified copy")
    print(f"  model {result['model_bytes'] / (1 << 20):.1f} MiB in {result['seconds']:.1f}s", end="")
    if result["lower_bound_seconds"]:
        print(f" (lower bound {result['lower_bound_seconds']:.1f}s)", end="")
    print(f"; origin read {result['origin_bytes'] / size:.2f}x the model")
    if result["error"]:
        print(f"  error: {result['error']}")
