"""``ringseed manifest SOURCE``: stream a source once through its origin and print its manifest.

Rules:
- SOURCE is any origin URI (``file://``, a bare path, ``http(s)://``, ``s3://``); S3 settings
  come from the environment as for the agent.
- Prints a human summary by default, the manifest JSON with ``--json``; ``--output FILE``
  writes the JSON (to publish beside the model as ``source.manifestUri``).
- Errors (bad source, unreadable origin, rejected names) print one line naming the problem
  and exit 1; a bad flag exits 2 (argparse).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from ringseed import cmdline
from ringseed.protocol import manifest, units


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="file:// path, bare path, http(s):// URL or s3://bucket/prefix")
    parser.add_argument(
        "--chunk-size",
        type=cmdline.chunk_size,
        default=manifest.DEFAULT_CHUNK_SIZE,
        help="chunk size, 1Mi to 1Gi, like 64Mi or 1048576",
    )
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    parser.add_argument("--output", type=Path, help="also write the manifest JSON to this file")
    parser.add_argument(
        "--rate-limit", type=cmdline.positive_size, default=None, help="cap on bytes/s read from the source (64Mi)"
    )


def summary(source: str, m: manifest.Manifest) -> str:
    """The human form: what a user checks before publishing."""
    layout = m.layout
    lines = [
        f"source:     {source}",
        f"files:      {len(layout.files)}",
        f"total:      {layout.total_size} bytes ({units.format_size(layout.total_size)})",
        f"chunk size: {layout.chunk_size} bytes ({units.format_size(layout.chunk_size)})",
        f"chunks:     {layout.chunk_count}",
        f"digest:     {m.digest}",
    ]
    return "\n".join(lines)


async def _build(args: argparse.Namespace) -> manifest.Manifest:
    from ringseed.agent import origins

    origin = origins.open_origin(args.source, rate_limit=args.rate_limit)
    try:
        return await origins.build_manifest(origin, chunk_size=args.chunk_size)
    finally:
        await origin.close()


def run(args: argparse.Namespace) -> int:
    from ringseed.agent import origins

    try:
        built = asyncio.run(_build(args))
    except (origins.OriginError, manifest.ManifestError) as exc:
        print(f"ringseed manifest: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(built.to_dict(), indent=2, ensure_ascii=False)
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
    print(text if args.json else summary(args.source, built))
    return 0
