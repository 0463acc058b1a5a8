"""``ringseed agent``: run a node agent in the distribution role.

Owns the agent's command line (docs/contracts.md, "Command lines the operator builds") and its
environment fallbacks (``RINGSEED_MASTER_URL``, ``RINGSEED_NODE_NAME``, ``RINGSEED_ADVERTISE_HOST``,
``RINGSEED_TOKEN``); ``RINGSEED_EXPECTED_DIGEST`` (optional) is the manifest digest the model
must have to be published. SIGTERM and SIGINT stop the agent cleanly (journal flushed).

Names from outside are checked by argparse like every other value (one line naming the option,
exit 2): ``--model-name`` is ``NAMESPACE/NAME`` with Kubernetes names (so it can never leave
``--data-dir`` or collide with the agent's own ``.NAME.tmp-*`` directories), ``--node-name``
(also from ``RINGSEED_NODE_NAME``) is 1-253 letters, digits, ``.``, ``_`` or ``-``; the expected
digest is a SHA-256 (``sha256:`` prefix allowed). A second agent for the same model on the same
node is refused (exit 1: the staging directory is locked).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from typing import Any

from ringseed import cmdline


def configure(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--master-url",
        default=env("RINGSEED_MASTER_URL"),
        help="the tracker's URL, or both replicas' URLs separated by commas (env RINGSEED_MASTER_URL)",
    )
    parser.add_argument(
        "--node-name",
        type=node_name,
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
    parser.add_argument("--model-name", type=model_name, required=True, help="NAMESPACE/NAME")
    parser.add_argument("--memory-bytes", type=cmdline.positive_size, default="256Mi", help="memory tier budget")
    parser.add_argument(
        "--ssd-bytes",
        type=cmdline.positive_size,
        default=None,
        help="SSD tier budget: staging never allocates more (DiskFull pauses fetching until there is room)",
    )
    parser.add_argument(
        "--staging-writes",
        choices=("auto", "direct", "in-place", "buffered"),  # store.WRITES (not imported: a fast --help)
        default="auto",
        help="how verified chunks get into staging: O_DIRECT from the chunk's buffer, received in place "
        "through a mapping, or pwrite (auto: direct unless staging is in RAM or refuses O_DIRECT)",
    )
    parser.add_argument(
        "--scrub-rate", type=cmdline.size, default="16Mi", help="bytes/s re-hashed from disk in the background (0: off)"
    )
    parser.add_argument(
        "--scrub-after", type=cmdline.positive_seconds, default=60.0, help="seconds after publishing before scrubbing"
    )
    parser.add_argument(
        "--verify-on-start",
        action="store_true",
        help="hash every staged chunk from disk at start, bad ones refetched (default: off)",
    )
    parser.add_argument(
        "--source-check-interval",
        type=cmdline.positive_seconds,
        default=300.0,
        help="seconds between checks of the source for changes by the agent on origin duty (a listing)",
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


_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NODE = re.compile(r"[A-Za-z0-9._-]{1,253}")
_DIGEST = re.compile(r"(sha256:)?([0-9a-f]{64})")


def model_name(text: str) -> tuple[str, str]:
    """``(namespace, name)`` of ``NAMESPACE/NAME``, both Kubernetes names."""
    from ringseed.api import validation

    namespace, slash, name = text.partition("/")
    if not slash or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r} must be NAMESPACE/NAME")
    if not _NAMESPACE.fullmatch(namespace):
        raise argparse.ArgumentTypeError(f"{text!r}: {namespace!r} is not a Kubernetes namespace name")
    try:
        validation.check_name(name)
    except validation.SpecError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.problem}") from exc
    return namespace, name


def node_name(text: str) -> str:
    if not _NODE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} must be 1-253 letters, digits, '.', '_' or '-'")
    return text


def expected_digest(text: str | None) -> str | None:
    """The manifest digest the model must have (hex), from ``RINGSEED_EXPECTED_DIGEST``."""
    if not text:
        return None
    match = _DIGEST.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"RINGSEED_EXPECTED_DIGEST {text!r} is not a SHA-256 (64 lowercase hex, 'sha256:' allowed)")
    return match.group(2)


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
        ssd_bytes=args.ssd_bytes,
        staging_writes=str(args.staging_writes),
        origin_rate_limit=float(rate) if rate else None,
        download_slots=args.download_slots,
        upload_slots=args.upload_slots,
        origin_depth=args.origin_depth,
        origin_upload_slots=args.origin_upload_slots,
        stream_slots=args.stream_slots,
        expected_digest=expected_digest(os.environ.get("RINGSEED_EXPECTED_DIGEST")),
        scrub_rate=float(args.scrub_rate),
        scrub_after=float(args.scrub_after),
        verify_on_start=bool(args.verify_on_start),
        source_check_interval=float(args.source_check_interval),
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from ringseed.agent import agent, store

    try:
        token = cmdline.read_token(args.token_file)
    except ValueError as exc:
        print(f"ringseed agent: {exc}", file=sys.stderr)
        return 2
    namespace, name = args.model_name
    problems = [
        "no token (use --token-file or RINGSEED_TOKEN)" if token is None else "",
        "no master URL (use --master-url or RINGSEED_MASTER_URL)" if not args.master_url else "",
    ]
    config = None
    try:
        if token is not None:
            config = _config(args, token=token, namespace=namespace, name=name)
    except ValueError as exc:
        problems.append(str(exc))
    for problem in filter(None, problems):
        print(f"ringseed agent: {problem}", file=sys.stderr)
    if any(problems) or config is None:
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await agent.Agent(config).run(stop)

    try:
        asyncio.run(main())
    except store.Busy as exc:
        print(f"ringseed agent: {exc}", file=sys.stderr)
        return 1
    return 0
