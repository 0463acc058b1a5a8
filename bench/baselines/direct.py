"""Direct-download baseline: one node fetches every file of the model straight from the origin.

What a user does without ringseed: each node downloads the model from the external source.
Waits for ``--gate``, downloads ``index.json`` then each file (SHA-256 over the bytes, written to
``--out`` when given), and prints one JSON line ``{"node", "bytes", "sha256", "start", "end"}``
(wall-clock seconds, the same clock for every namespace on the machine).
Run: ``python -m bench.baselines.direct http://10.77.0.1:8000/ --node n0 --gate FILE``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import urllib.request
from pathlib import Path


def fetch(base: str, *, out: Path | None) -> tuple[int, str]:
    with urllib.request.urlopen(base + "index.json", timeout=600) as response:
        files = json.loads(response.read())["files"]
    digest, total = hashlib.sha256(), 0
    for entry in files:
        target = out / entry["path"] if out else None
        if target:
            target.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(base + entry["path"], timeout=600) as response:
            sink = target.open("wb") if target else None
            while block := response.read(1 << 20):
                digest.update(block)
                total += len(block)
                if sink:
                    sink.write(block)
            if sink:
                sink.close()
    return total, digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="origin URL ending in /")
    parser.add_argument("--node", default="node")
    parser.add_argument("--gate", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    while args.gate is not None and not args.gate.exists():
        time.sleep(0.01)
    start = time.time()
    total, sha = fetch(args.base, out=args.out)
    report = {"node": args.node, "bytes": total, "sha256": sha, "start": start, "end": time.time()}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
