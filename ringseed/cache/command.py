"""``ringseed agent --role cache``: run a node agent in the cache role (checkpoints and datasets).

Owns the cache agent's command line (docs/contracts.md, "Command lines the operator builds") and
its environment fallbacks: ``RINGSEED_MASTER_URL`` (comma-separated: every cache master replica
or one Service), ``RINGSEED_NODE_NAME``, ``RINGSEED_ADVERTISE_HOST``, ``RINGSEED_TOKEN``; the sink's
credentials come from the environment (``AWS_*``), as for origins. SIGTERM and SIGINT stop it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from ringseed import cmdline


def configure(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--role", choices=("cache",), default="cache", help="the agent's role on the node")
    parser.add_argument("--master-url", default=env("RINGSEED_MASTER_URL"), help="cache master URL(s), comma-separated")
    parser.add_argument(
        "--node-name",
        default=env("RINGSEED_NODE_NAME") or socket.gethostname(),
        help="this node's name (env RINGSEED_NODE_NAME, else the host name)",
    )
    parser.add_argument(
        "--advertise-host",
        default=env("RINGSEED_ADVERTISE_HOST") or "127.0.0.1",
        help="address peers use to reach this agent (env RINGSEED_ADVERTISE_HOST)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address the peer server listens on")
    parser.add_argument("--port", type=cmdline.port, default=8473, help="peer server port (0: any free port)")
    parser.add_argument("--token-file", help="file holding the group's bearer token (else env RINGSEED_TOKEN)")
    parser.add_argument("--group", default="", help="the node's group (replicas prefer nodes of the same group)")
    parser.add_argument("--socket", default="/run/ringseed/cache.sock", help="Unix socket for this node's pods")
    parser.add_argument("--memory-dir", default="/dev/shm/ringseed", help="memory tier directory (tmpfs)")
    parser.add_argument("--memory-bytes", type=cmdline.positive_size, default="4Gi", help="memory tier budget")
    parser.add_argument("--ssd-dir", default=None, help="SSD tier directory (none: memory only)")
    parser.add_argument("--ssd-bytes", type=cmdline.size, default="0", help="SSD tier budget")
    parser.add_argument(
        "--chunk-size", type=cmdline.positive_size, default="32Mi", help="chunk size of written objects (5Mi to 1Gi)"
    )
    parser.add_argument("--sink", default=None, help="file:// or s3:// URI checkpoints are persisted to")
    parser.add_argument(
        "--persist-rate-limit", type=cmdline.positive_size, default=None, help="bytes/s to the sink (e.g. 50Mi)"
    )
    parser.add_argument(
        "--write-deadline", type=cmdline.positive_seconds, default=120.0, help="seconds a writer waits for room"
    )
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="NAME=URI",
        help="a dataset read through the cache as ringseed://data/NAME/ (repeatable; s3://, http(s)://, file://)",
    )
    parser.add_argument(
        "--list-ttl", type=cmdline.positive_seconds, default=300.0, help="seconds a dataset listing stays current"
    )
    parser.add_argument("--readahead", type=cmdline.non_negative_int, default=4, help="dataset chunks read ahead")
    parser.add_argument("--warmup", action="store_true", help="fill the cache with the datasets at start")
    parser.add_argument(
        "--warmup-path", action="append", default=[], help="only warm the files under this dataset path (repeatable)"
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    from pathlib import Path

    from ringseed.cache import service
    from ringseed.protocol import units

    problems = []
    try:
        token = cmdline.read_token(args.token_file)
    except ValueError as exc:
        problems.append(str(exc))
        token = None
    if token is None and not problems:
        problems.append("no token (use --token-file or RINGSEED_TOKEN)")
    if not args.master_url:
        problems.append("no master URL (use --master-url or RINGSEED_MASTER_URL)")
    try:
        chunk_size = units.parse_size(args.chunk_size)
        memory, ssd = units.parse_size(args.memory_bytes), units.parse_size(args.ssd_bytes)
        rate = units.parse_size(args.persist_rate_limit) if args.persist_rate_limit else None
    except ValueError as exc:
        problems.append(str(exc))
        chunk_size = memory = ssd = 0
        rate = None
    if chunk_size and not (5 << 20) <= chunk_size <= (1 << 30):
        problems.append(f"--chunk-size {chunk_size} must be between 5Mi (S3's smallest part) and 1Gi")
    if memory and chunk_size and memory < chunk_size:
        problems.append(f"--memory-bytes {memory} is smaller than one chunk ({chunk_size})")
    sources = {}
    for item in args.data:
        name, _, uri = str(item).partition("=")
        if not name or not uri or "/" in name or name in sources:
            problems.append(f"--data {item!r}: expected a unique NAME=URI (NAME without '/')")
        sources[name] = uri
    for problem in problems:
        print(f"ringseed agent --role cache: {problem}", file=sys.stderr)
    if problems or token is None:
        return 2
    config = service.Config(
        master_urls=[u.strip() for u in str(args.master_url).split(",") if u.strip()],
        node_name=args.node_name,
        advertise_host=args.advertise_host,
        host=args.host,
        port=args.port,
        token=token,
        group=args.group,
        socket_path=Path(args.socket),
        memory_dir=Path(args.memory_dir),
        ssd_dir=Path(args.ssd_dir) if args.ssd_dir else None,
        memory_bytes=memory,
        ssd_bytes=ssd if args.ssd_dir else 0,
        chunk_size=chunk_size,
        sink=args.sink,
        persist_rate_limit=float(rate) if rate else None,
        write_deadline=args.write_deadline,
        data_sources=sources,
        list_ttl=args.list_ttl,
        readahead=args.readahead,
        warmup=args.warmup,
        warmup_paths=tuple(args.warmup_path),
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await service.CacheAgent(config).run(stop)

    asyncio.run(main())
    return 0
