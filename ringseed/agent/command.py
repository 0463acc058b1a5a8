"""``ringseed agent``: run a node agent in the distribution role.

Owns the agent's command line (docs/contracts.md, "Command lines the operator builds") and its
environment fallbacks (``RINGSEED_MASTER_URL``, ``RINGSEED_NODE_NAME``, ``RINGSEED_ADVERTISE_HOST``,
``RINGSEED_TOKEN``); ``RINGSEED_EXPECTED_DIGEST`` (optional) is the manifest digest the model
must have to be published. Test-only: ``RINGSEED_FAULT_CORRUPT_UPLOADS=1`` makes the agent serve
corrupted chunks (a lying peer for the fault tests); never set it in production.
SIGTERM and SIGINT stop the agent cleanly (journal flushed).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--master-url", default=env("RINGSEED_MASTER_URL"))
    parser.add_argument("--node-name", default=env("RINGSEED_NODE_NAME") or socket.gethostname())
    parser.add_argument("--advertise-host", default=env("RINGSEED_ADVERTISE_HOST") or "127.0.0.1")
    parser.add_argument("--host", default="0.0.0.0", help="address the peer server listens on")
    parser.add_argument("--port", type=int, default=8471, help="peer server port (0: any free port)")
    parser.add_argument("--token-file")
    parser.add_argument("--source", required=True, help="file://, http(s):// or s3:// URI of the model")
    parser.add_argument("--manifest-uri", help="URI of a published manifest (chunk hashes)")
    parser.add_argument("--chunk-size", default="64Mi")
    parser.add_argument("--data-dir", default="/var/lib/ringseed/models")
    parser.add_argument("--cache-dir", default="/var/lib/ringseed/cache")
    parser.add_argument("--model-name", required=True, help="NAMESPACE/NAME")
    parser.add_argument("--memory-bytes", default="256Mi", help="memory tier budget")
    parser.add_argument("--ssd-bytes", default=None, help="SSD tier budget (accepted; not enforced yet)")
    parser.add_argument("--origin-rate-limit", default=None, help="bytes/s from the origin (e.g. 32Mi)")
    parser.add_argument("--download-slots", type=int, default=4)
    parser.add_argument("--upload-slots", type=int, default=4, help="peers served at once (as many as download slots)")
    parser.add_argument("--origin-depth", type=int, default=1, help="origin pulls at once on origin duty")
    parser.add_argument(
        "--origin-upload-slots", type=int, default=1, help="peers served at once while pulling from the origin"
    )
    parser.add_argument(
        "--stream-slots",
        type=int,
        default=8,
        help="peers that may stream a chunk while it arrives from the origin (0: off)",
    )


def read_token(token_file: str | None) -> str | None:
    """The group token from a file (stripped) or ``RINGSEED_TOKEN`` (the file wins)."""
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            return f.read().strip() or None
    return os.environ.get("RINGSEED_TOKEN") or None


def _config(args: argparse.Namespace, *, token: str, namespace: str, name: str) -> Any:
    from pathlib import Path

    from ringseed.agent import agent
    from ringseed.protocol import units

    rate = units.parse_size(args.origin_rate_limit) if args.origin_rate_limit else None
    return agent.Config(
        master_url=args.master_url,
        node_name=args.node_name,
        advertise_host=args.advertise_host,
        host=args.host,
        port=args.port,
        token=token,
        source=args.source,
        manifest_uri=args.manifest_uri,
        chunk_size=units.parse_size(args.chunk_size),
        data_dir=Path(args.data_dir),
        cache_dir=Path(args.cache_dir),
        namespace=namespace,
        name=name,
        memory_bytes=units.parse_size(args.memory_bytes),
        origin_rate_limit=float(rate) if rate else None,
        download_slots=args.download_slots,
        upload_slots=args.upload_slots,
        origin_depth=args.origin_depth,
        origin_upload_slots=args.origin_upload_slots,
        stream_slots=args.stream_slots,
        corrupt_uploads=os.environ.get("RINGSEED_FAULT_CORRUPT_UPLOADS") == "1",
        expected_digest=os.environ.get("RINGSEED_EXPECTED_DIGEST") or None,
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from ringseed.agent import agent

    token = read_token(args.token_file)
    namespace, _, name = str(args.model_name).partition("/")
    problems = [
        "no token (use --token-file or RINGSEED_TOKEN)" if token is None else "",
        "no master URL (use --master-url or RINGSEED_MASTER_URL)" if not args.master_url else "",
        "--model-name must be NAMESPACE/NAME" if not namespace or not name or "/" in name else "",
    ]
    for problem in filter(None, problems):
        print(f"ringseed agent: {problem}", file=sys.stderr)
    if any(problems) or token is None:
        return 2
    config = _config(args, token=token, namespace=namespace, name=name)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await agent.Agent(config).run(stop)

    asyncio.run(main())
    return 0
