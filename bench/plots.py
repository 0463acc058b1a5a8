"""Figures for BENCHMARKS.md, drawn from the JSON the benchmark scripts write (``--json``).

    .venv/bin/python -m bench.plots --distribution bench/out/distribution.json \
        --allreduce bench/out/allreduce.json --out docs/figures

Draws ``distribution.png`` (T against N: ringseed, libtorrent, direct download and the bound
T*) and ``allreduce.png`` (busbw as a fraction of the link against size, per backend and N).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def distribution(rows: list[dict[str, Any]], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, style in (("ringseed", "o-"), ("libtorrent", "s-"), ("direct", "^-")):
        points = sorted((r["nodes"], r["seconds"]) for r in rows if r["method"] == method and "seconds" in r)
        if points:
            ax.plot(*zip(*points, strict=True), style, label=method)
    bound = sorted({(r["nodes"], r["bound"]) for r in rows})
    ax.plot(*zip(*bound, strict=True), "k--", label="T* = S/B_o + ceil(log2 N) chunk/B_l")
    ax.set_xlabel("nodes N")
    ax.set_ylabel("T (s) until every node holds the model")
    ax.set_yscale("log")
    ax.set_xticks(sorted({r["nodes"] for r in rows}))
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "distribution.png", dpi=110)


def allreduce(rows: list[dict[str, Any]], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"ringseed": "-", "gloo": "--", "star": ":"}
    for backend, line in styles.items():
        for world, marker in ((2, "o"), (4, "s"), (8, "^")):
            points = sorted((r["mib"], r["of_link"]) for r in rows if r["backend"] == backend and r["nodes"] == world)
            if points:
                ax.plot(*zip(*points, strict=True), line + marker, label=f"{backend} N={world}")
    ax.axhline(0.85, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer per rank (MiB)")
    ax.set_ylabel("busbw / link rate")
    ax.legend(fontsize=7, ncol=3)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "allreduce.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distribution", type=Path, default=None)
    parser.add_argument("--allreduce", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("docs/figures"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.distribution:
        distribution(json.loads(args.distribution.read_text()), args.out)
    if args.allreduce:
        allreduce(json.loads(args.allreduce.read_text()), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
