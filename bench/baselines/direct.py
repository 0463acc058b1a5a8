"""Direct-download baseline: one node fetches every file of the model straight from the origin.

What a user does without ringseed: each node downloads the model from the external source.
Waits for ``--gate``, downloads ``index.json`` then each file (SHA-256 over the bytes, written to
``--out`` when given), and prints one JSON line ``{"node", "bytes", "sha256", "start", "end"}``
(wall-clock seconds, the same clock for every namespace on the machine). A read that stalls for
30 s reconnects and resumes with Range, as ``curl --retry -C -`` would: with 16 flows on one
``tbf``-limited link a flow can starve in TCP retransmission back-off for minutes.
Run: ``python -m bench.baselines.direct http://10.77.0.1:8000/ --node n0 --gate FILE``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

READ_TIMEOUT_S = 30.0  # a read that stalls this long reconnects and resumes (curl --retry style)
RETRIES = 20


def fetch(base: str, *, out: Path | None) -> tuple[int, str]:
    with urllib.request.urlopen(base + "index.json", timeout=READ_TIMEOUT_S) as response:
        files = json.loads(response.read())["files"]
    digest, total = hashlib.sha256(), 0
    for entry in files:
        target = out / entry["path"] if out else None
        if target:
            target.parent.mkdir(parents=True, exist_ok=True)
        sink = target.open("wb") if target else None
        try:
            total += _fetch_file(base + entry["path"], int(entry["size"]), digest, sink)
        finally:
            if sink:
                sink.close()
    return total, digest.hexdigest()


def _fetch_file(url: str, size: int, digest: Any, sink: BinaryIO | None) -> int:
    """Download ``url`` into the digest (and ``sink``), resuming with Range after a stall or reset."""
    done = 0
    for attempt in range(RETRIES + 1):
        headers = {"Range": f"bytes={done}-"} if done else {}
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=READ_TIMEOUT_S) as response:
                if done and response.status != 206:
                    raise OSError(f"{url}: resume answered {response.status}, not 206")
                while block := response.read(1 << 20):
                    digest.update(block)
                    done += len(block)
                    if sink:
                        sink.write(block)
            if done >= size:
                return done
        except (TimeoutError, ConnectionError, OSError) as exc:
            if attempt == RETRIES:
                raise
            print(f"{url}: {type(exc).__name__} after {done} bytes; resuming", file=sys.stderr, flush=True)
    raise OSError(f"{url}: ended at {done} of {size} bytes")


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
