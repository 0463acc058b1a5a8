"""The origin host's web server for testbed benchmarks: a directory over HTTP with Range, behind a gate.

Serves ``DIR`` as a ringseed ``http://`` file set (``index.json`` lists the files) and every file
with Range support (aiohttp ``FileResponse``). Every request waits until the file ``--gate``
exists, so that all clients start when the benchmark says go and their start-up is not timed.
Run inside the origin's namespace: ``python -m bench.baselines.http_origin DIR --port 8000 --gate FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from aiohttp import web


def index_of(root: Path) -> dict[str, list[dict[str, object]]]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {
        "files": [
            {"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "mode": p.stat().st_mode & 0o777}
            for p in files
        ]
    }


def wait_file(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)


def make_app(*, root: Path, gate: Path | None) -> web.Application:
    listing = index_of(root)
    index = json.dumps(listing).encode()
    files = {str(entry["path"]): root / str(entry["path"]) for entry in listing["files"]}
    opened = asyncio.Event()

    async def watch_gate(app: web.Application) -> None:
        if gate is not None:
            await asyncio.to_thread(wait_file, gate)
        opened.set()

    async def start_watch(app: web.Application) -> None:
        app["gate_task"] = asyncio.create_task(watch_gate(app))

    async def serve(request: web.Request) -> web.StreamResponse:
        await opened.wait()
        rel = request.match_info["path"]
        if rel in ("", "index.json"):
            return web.Response(body=index, content_type="application/json")
        if rel not in files:
            raise web.HTTPNotFound()
        return web.FileResponse(files[rel])

    app = web.Application()
    app.on_startup.append(start_watch)
    app.router.add_get("/{path:.*}", serve)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--gate", type=Path, default=None)
    args = parser.parse_args()
    print(f"serving {args.root} on {args.host}:{args.port} pid {os.getpid()}", flush=True)
    web.run_app(make_app(root=args.root, gate=args.gate), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
