"""``ringseed mount MOUNTPOINT``: mount this node's cache tree (the group's ``ringseed://``) with FUSE.

Owns the command. It reaches the node's agent like the SDK (``RINGSEED_CACHE_SOCKET``,
``RINGSEED_TOKEN``, or ``--socket``/``--token-file``), runs in the foreground until the mount is
unmounted (``umount MOUNTPOINT`` or ``fusermount -u``) or it gets SIGTERM/SIGINT. Needs
``/dev/fuse``, libfuse 2 (``apt-get install libfuse2``) and the ``fuse`` extra (fusepy).
"""

from __future__ import annotations

import argparse
import sys

from ringseed import cmdline


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", help="an existing empty directory")
    parser.add_argument("--socket", default=None, help="the agent's Unix socket (else RINGSEED_CACHE_SOCKET)")
    parser.add_argument("--token-file", default=None, help="file holding the token (else RINGSEED_TOKEN)")
    parser.add_argument("--root", default="", help="mount this directory of the tree (e.g. data: the datasets)")
    parser.add_argument(
        "--attr-timeout",
        type=cmdline.positive_seconds,
        default=None,
        help="seconds the kernel keeps names and sizes (default: 1; under data/, the datasets' staleness period)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        from ringseed.fs import fuse, spec
    except (ImportError, OSError) as exc:  # fusepy missing, or libfuse not installed
        print(f"ringseed mount: FUSE is not available here: {exc}", file=sys.stderr)
        return 2
    try:
        token = cmdline.read_token(args.token_file)
    except ValueError as exc:
        print(f"ringseed mount: {exc}", file=sys.stderr)
        return 2
    filesystem = spec.RingseedFileSystem(socket=args.socket, token=token)
    fuse.mount(filesystem, args.mountpoint, root=args.root.strip("/"), attr_timeout=args.attr_timeout)
    return 0
