"""Benchmark: P2P model distribution on loopback against the origin-bound lower bound.

For each swarm size N it starts a master and N agents as separate processes
(:class:`ringseed.local.swarm.LocalSwarm`), delivers a model of random odd-sized files from a
``file://`` origin rate-limited to ``--origin-rate`` bytes/s, and prints one table row:

- ``T``: seconds from launching the processes until every node reported a verified copy;
  ``T_xfer``: the same from the moment the layout was published (process start-up excluded).
- ``T*``: size / origin rate + one chunk time per doubling of N (the pipe is the bottleneck).
- ``origin/S``: bytes the agents pulled from the origin over the model size.
- ``cpu s/GB``: agents' user+system CPU seconds per GB delivered (N x size).
- ``RSS MB``: the largest peak RSS (VmHWM) over the agents, against 200 MB + memory budget.

Usage: ``.venv/bin/python bench/distribution.py [--quick] [--nodes 4 8] [--size-mib 512]``.
Each node's copy is checked against the source's manifest at the end (a failed check is an
error, not a row).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

from ringseed.local import distribute, swarm
from ringseed.protocol import manifest

MiB = 1 << 20


def _proc_cpu_and_hwm(pid: int) -> tuple[float, int]:
    """(user+system CPU seconds, peak RSS bytes) of a live process from /proc."""
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return cpu, hwm


def _source_manifest(root: Path, chunk_size: int) -> manifest.Manifest:
    entries = [(p.relative_to(root).as_posix(), p.stat().st_size, 0o644) for p in root.rglob("*") if p.is_file()]
    layout = manifest.Layout.build(entries, chunk_size=chunk_size)
    hasher = manifest.ChunkHasher(chunk_size)
    for entry in layout.files:
        with open(root / entry.path, "rb") as f:
            while block := f.read(8 * MiB):
                hasher.update(block)
    return manifest.Manifest(layout=layout, chunk_hashes=tuple(hasher.finish()))


def run_one(*, root: Path, workdir: Path, nodes: int, rate: int, chunk_size: int, memory: int) -> dict[str, float]:
    expected = _source_manifest(root, chunk_size)
    size = expected.layout.total_size
    with swarm.LocalSwarm(
        source=root.as_uri(),
        nodes=nodes,
        workdir=workdir,
        chunk_size=chunk_size,
        origin_rate_limit=rate,
        memory_bytes=memory,
    ) as local:
        started = time.monotonic()
        local.start()
        local.wait_for(lambda s: s["total_chunks"] > 0, timeout=120, what="layout")
        layout_at = time.monotonic()
        status = local.wait_for(local.all_verified, timeout=size / rate * 10 + 120, what="all verified")
        finished = time.monotonic()
        usage = [_proc_cpu_and_hwm(local.procs[name].pid) for name in local.names]
        for name in local.names:
            if swarm.verify_copy(local.model_dir(name), expected) != {"complete": True, "verified": True}:
                raise SystemExit(f"{name}: final copy does not match the source")
    bound = distribute.lower_bound(size=size, rate=rate, chunk_size=chunk_size, nodes=nodes) or math.inf
    return {
        "N": nodes,
        "T": finished - started,
        "T_xfer": finished - layout_at,
        "T*": bound,
        "origin/S": status["bytes_from_origin"] / size,
        "cpu_s_per_GB": sum(cpu for cpu, _ in usage) / (nodes * size / 1e9),
        "rss_mb": max(hwm for _, hwm in usage) / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="64 MiB model, N = 4 only")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--origin-rate-mib", type=float, default=32.0)
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--memory-mib", type=int, default=64)
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.nodes = 64, [4]
    rate = int(args.origin_rate_mib * MiB)
    with tempfile.TemporaryDirectory(prefix="ringseed-bench-") as tmp:
        sizes = {name: size * args.size_mib // 256 for name, size in distribute.DEMO_FILES.items()}
        root = distribute.write_demo_model(Path(tmp) / "model", sizes)
        print(
            f"model {sum(sizes.values()) / MiB:.1f} MiB in {len(sizes)} files, origin {args.origin_rate_mib} MiB/s, "
            f"chunk {args.chunk_mib} MiB, memory tier {args.memory_mib} MiB"
        )
        columns = [("N", 3), ("T s", 7), ("T_xfer s", 9), ("T* s", 7), ("T/T*", 6)]
        columns += [("origin/S", 9), ("cpu s/GB", 9), ("RSS MB", 7)]
        print(" ".join(f"{name:>{width}}" for name, width in columns))
        for nodes in args.nodes:
            row = run_one(
                root=root,
                workdir=Path(tmp) / f"n{nodes}",
                nodes=nodes,
                rate=rate,
                chunk_size=args.chunk_mib * MiB,
                memory=args.memory_mib * MiB,
            )
            print(
                f"{row['N']:>3} {row['T']:>7.2f} {row['T_xfer']:>9.2f} {row['T*']:>7.2f} {row['T'] / row['T*']:>6.2f} "
                f"{row['origin/S']:>9.3f} {row['cpu_s_per_GB']:>9.2f} {row['rss_mb']:>7.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
