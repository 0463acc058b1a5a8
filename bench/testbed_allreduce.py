"""All-reduce on the netns testbed: ringseed vs Gloo vs star, busbw against the link rate.

    sudo .venv/bin/python -m bench.testbed_allreduce --nodes 2,4,8 --sizes 16,64,256 \
        --node-rate 1gbit [--backends ringseed,gloo,star] [--iters 3] [--json OUT]

Each rank runs in its own host of :class:`ringseed.testbed.netns.Testbed` with its link shaped
to ``--node-rate`` in both directions; the ranks and their timing are ``bench/allreduce.py``'s
(float32 SUM, the slowest rank's median over ``--iters`` after a warm-up, every rank checks
the sum). busbw = size / time x 2(N-1)/N; "of link" = busbw / (node rate / 8), the nominal
rate (MTU 9000: TCP can use 99.3% of it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench import allreduce
from ringseed.testbed import links, netns

MiB = 1 << 20


def table_row(backend: str, *, world: int, size: int, seconds: float, link: float) -> dict[str, Any]:
    busbw = size * MiB / seconds * 2 * (world - 1) / world
    return {"backend": backend, "nodes": world, "mib": size, "seconds": seconds, "busbw": busbw,
            "of_link": busbw / link}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,4,8")
    parser.add_argument("--sizes", default="16,64,256", help="MiB per rank, comma-separated")
    parser.add_argument("--node-rate", default="1gbit")
    parser.add_argument("--backends", default="ringseed,gloo,star")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    reason = netns.can_run()
    if reason:
        print(f"testbed_allreduce: {reason}")
        return 1
    rate = links.parse_rate(args.node_rate)
    link = rate / 8
    rows: list[dict[str, Any]] = []
    print(f"float32 SUM all-reduce, testbed links {args.node_rate} both directions, MTU {links.DEFAULT_MTU}")
    print(f"{'backend':<9} {'N':>2} {'MiB':>5} {'time s':>8} {'busbw MB/s':>11} {'of link':>8}")
    try:
        for world in [int(n) for n in args.nodes.split(",")]:
            with netns.Testbed(nodes=world, origin_rate=None, node_rate=rate) as testbed:
                for size in [int(s) for s in args.sizes.split(",")]:
                    for backend in args.backends.split(","):
                        seconds = allreduce.measure(
                            backend, world=world, nbytes=size * MiB, iters=args.iters, testbed=testbed
                        )
                        row = table_row(backend, world=world, size=size, seconds=seconds, link=link)
                        rows.append(row)
                        print(f"{backend:<9} {world:>2} {size:>5} {seconds:>8.3f} {row['busbw'] / 1e6:>11.1f} "
                              f"{row['of_link']:>8.3f}", flush=True)  # fmt: skip
        _ratios(rows)
    finally:
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _ratios(rows: list[dict[str, Any]]) -> None:
    by = {(r["backend"], r["nodes"], r["mib"]): r["busbw"] for r in rows}
    print(f"\n{'N':>2} {'MiB':>5} {'ringseed/gloo':>14} {'ringseed/star':>14}")
    for (backend, world, size), busbw in by.items():
        if backend != "ringseed":
            continue
        gloo, star = by.get(("gloo", world, size)), by.get(("star", world, size))
        gloo_text = f"{busbw / gloo:>14.3f}" if gloo else f"{'-':>14}"
        star_text = f"{busbw / star:>14.3f}" if star else f"{'-':>14}"
        print(f"{world:>2} {size:>5} {gloo_text} {star_text}")


if __name__ == "__main__":
    raise SystemExit(main())
