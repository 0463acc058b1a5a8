"""``ringseed agent``: run a node agent in the distribution role.

Owns the agent's command line (docs/contracts.md, "Command lines the operator builds") and its
environment fallbacks (``RINGSEED_MASTER_URL``, ``RINGSEED_NODE_NAME``, ``RINGSEED_ADVERTISE_HOST``,
``RINGSEED_TOKEN``); ``RINGSEED_EXPECTED_DIGEST`` (optional) is the manifest digest the model
must have to be published.
SIGTERM and SIGINT stop the agent cleanly (journal flushed).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from ringseed import cmdline


def configure(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--master-url", default=env("RINGSEED_MASTER_URL"), help="the tracker's URL (env RINGSEED_MASTER_URL)"
    )
    parser.add_argument(
        "--node-name",
        default=env("RINGSEED_NODE_NAME") or socket.gethostname(),
        help="this node's name in the swarm (env RINGSEED_NODE_NAME, else the host name)",
    )
    parser.add_argument(
        "--advertise-host",
        default=env("RINGSEED_ADVERTISE_HOST") or "127.0.0.1",
        help="address peers use to reach this agent (env RINGSEED_ADVERTISE_HOST)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address the peer server listens on")
    parser.add_argument("--port", type=cmdline.port, default=8471, help="peer server port (0: any free port)")
    parser.add_argument("--token-file", help="file holding the group's bearer token (else env RINGSEED_TOKEN)")
    parser.add_argument("--source", required=True, help="file://, http(s):// or s3:// URI of the model")
    parser.add_argument("--manifest-uri", help="URI of a published manifest (chunk hashes)")
    parser.add_argument("--chunk-size", type=cmdline.chunk_size, default="64Mi", help="chunk size, 1Mi to 1Gi")
    parser.add_argument("--data-dir", default="/var/lib/ringseed/models", help="root of the published models")
    parser.add_argument("--cache-dir", default="/var/lib/ringseed/cache", help="staging and journal root")
    parser.add_argument("--model-name", required=True, help="NAMESPACE/NAME")
    parser.add_argument("--memory-bytes", type=cmdline.positive_size, default="256Mi", help="memory tier budget")
    parser.add_argument(
        "--ssd-bytes", type=cmdline.positive_size, default=None, help="SSD tier budget (accepted; not enforced yet)"
    )
    parser.add_argument(
        "--origin-rate-limit",
        type=cmdline.positive_size,
        default=None,
        help="cap on bytes/s read from the origin, e.g. 32Mi (default: no cap)",
    )
    parser.add_argument("--download-slots", type=cmdline.positive_int, default=4, help="chunks fetched at once")
    parser.add_argument(
        "--upload-slots", type=cmdline.positive_int, default=4, help="peers served at once (as many as download slots)"
    )
    parser.add_argument(
        "--origin-depth", type=cmdline.positive_int, default=1, help="origin pulls at once on origin duty"
    )
    parser.add_argument(
        "--origin-upload-slots",
        type=cmdline.positive_int,
        default=1,
        help="peers served at once while pulling from the origin",
    )
    parser.add_argument(
        "--stream-slots",
        type=cmdline.non_negative_int,
        default=8,
        help="peers that may stream a chunk while it arrives from the origin (0: off)",
    )


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
        expected_digest=os.environ.get("RINGSEED_EXPECTED_DIGEST") or None,
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from ringseed.agent import agent

    try:
        token = cmdline.read_token(args.token_file)
    except ValueError as exc:
        print(f"ringseed agent: {exc}", file=sys.stderr)
        return 2
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
