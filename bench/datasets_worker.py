"""The reader side of ``bench/datasets.py``: one node reads every file of a dataset for some epochs.

    python -m bench.datasets_worker URL --epochs 2 [--gate FILE] [--s3-endpoint URL] [--cache-dir DIR]

``URL`` is any fsspec URL: ``ringseed://data/NAME`` (through the node cache), ``s3://bucket/prefix``
(fsspec's s3fs, directly), ``simplecache::s3://bucket/prefix`` (fsspec's local file caching) or a
local directory. Files are listed once, then read whole in listing order each epoch (what a
sequential data loader does). Prints one JSON line: ``{files, bytes, epochs: [seconds], list_s}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def filesystem(url: str, *, endpoint: str | None, cache_dir: str | None) -> tuple[Any, str]:
    import fsspec

    options: dict[str, Any] = {}
    s3 = {"client_kwargs": {"endpoint_url": endpoint}, "key": "bench", "secret": "bench"} if endpoint else {}
    if url.startswith("simplecache::"):
        options = {"s3": s3, "simplecache": {"cache_storage": cache_dir or "/tmp/simplecache"}}
    elif url.startswith("s3://"):
        options = s3
    fs, root = fsspec.core.url_to_fs(url, **options)
    return fs, root


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--gate", default=None, help="wait for this file to exist before the first epoch")
    parser.add_argument("--s3-endpoint", default=None)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    fs, root = filesystem(args.url, endpoint=args.s3_endpoint, cache_dir=args.cache_dir)
    if args.gate:
        while not Path(args.gate).exists():
            time.sleep(0.01)
    started = time.perf_counter()
    files = sorted(fs.find(root))
    list_s = time.perf_counter() - started
    total, epochs = 0, []
    for _ in range(args.epochs):
        started = time.perf_counter()
        total = 0
        for path in files:
            with fs.open(path, "rb") as f:
                total += len(f.read())
        epochs.append(time.perf_counter() - started)
    print(json.dumps({"files": len(files), "bytes": total, "epochs": epochs, "list_s": list_s, "pid": os.getpid()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
