"""``ringseed mount MOUNTPOINT``: mount this node's cache tree (the group's ``ringseed://``) with FUSE.

Owns the command. It reaches the node's agent like the SDK (``RINGSEED_CACHE_SOCKET``,
``RINGSEED_TOKEN``, or ``--socket``/``--token-file``), runs in the foreground until the mount is
unmounted (``umount MOUNTPOINT`` or ``fusermount -u``) or it gets SIGTERM/SIGINT. Needs ``/dev/fuse``.

Two servers (``--driver``): a dataset mount (``--root data...``) is served on libfuse 3's
low-level API (:mod:`ringseed.fs.datamount`: ``libfuse3.so.3``, from ``fuse3``; no round trip per
open) where it can be, else, and for the rest of the tree (checkpoints, writes), by fusepy over
libfuse 2 (:mod:`ringseed.fs.fuse`: the ``fuse`` extra and ``apt-get install libfuse2``).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ringseed import cmdline

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", help="an existing empty directory")
    parser.add_argument("--socket", default=None, help="the agent's Unix socket (else RINGSEED_CACHE_SOCKET)")
    parser.add_argument("--token-file", default=None, help="file holding the token (else RINGSEED_TOKEN)")
    parser.add_argument("--root", default="", help="mount this directory of the tree (e.g. data: the datasets)")
    parser.add_argument(
        "--attr-timeout",
        type=cmdline.positive_seconds,
        default=None,
        help="seconds the kernel keeps names and sizes (default: 1; under data/, the datasets' staleness period, "
        "or with the libfuse3 driver a day: it is told of each new revision)",
    )
    parser.add_argument(
        "--list-ttl",
        type=cmdline.positive_seconds,
        default=None,
        help="under data/: the datasets' staleness period, for when the agent cannot tell it yet; the fusepy "
        "driver keeps names and sizes that long (the libfuse3 driver keeps them a day and is told of changes)",
    )
    parser.add_argument(
        "--driver",
        choices=("auto", "libfuse3", "fusepy"),
        default="auto",
        help="the FUSE server: libfuse3 (low-level; datasets only), fusepy (libfuse 2; the whole tree), or "
        "auto: libfuse3 for a dataset root where libfuse 3 loads, else fusepy",
    )


def _lowlevel(root: str, driver: str) -> bool:
    """Whether to serve with libfuse 3's low-level API (``ValueError`` naming why it cannot when asked for)."""
    from ringseed.fs import libfuse3
    from ringseed.protocol import cacheobjects

    if driver == "fusepy":
        return False
    if not cacheobjects.is_data(root):
        if driver == "libfuse3":
            raise ValueError(f"--driver libfuse3 serves datasets only (--root data[/<name>]), not {root or '/'!r}")
        return False
    try:
        libfuse3.load()
    except libfuse3.Unavailable as exc:
        if driver == "libfuse3":
            raise ValueError(str(exc)) from None
        log.warning("ringseed mount: %s; serving with fusepy (a round trip per open)", exc)
        return False
    return True


def _fusepy_timeout(root: str, *, attr_timeout: float | None, list_ttl: float | None) -> float | None:
    """The fusepy driver's name and attribute timeout: ``--attr-timeout``, else under data/ ``--list-ttl``
    (None: the driver asks the agent). The libfuse3 driver does not use ``--list-ttl``: it is told of each
    new revision, so the kernel may keep names a day (a sidecar that passed the staleness period as
    ``--attr-timeout`` made the kernel look every name up again once per period: a round trip per open
    in any epoch longer than that)."""
    from ringseed.protocol import cacheobjects

    if list_ttl is not None and not cacheobjects.is_data(root):
        raise ValueError(f"--list-ttl applies to dataset mounts (--root data[/<name>]), not {root or '/'!r}")
    return attr_timeout if attr_timeout is not None else list_ttl


def run(args: argparse.Namespace) -> int:
    root = args.root.strip("/")
    try:
        token = cmdline.read_token(args.token_file)
        lowlevel = _lowlevel(root, args.driver)
        fusepy_timeout = _fusepy_timeout(root, attr_timeout=args.attr_timeout, list_ttl=args.list_ttl)
    except ValueError as exc:
        print(f"ringseed mount: {exc}", file=sys.stderr)
        return 2
    from ringseed.fs import spec

    filesystem = spec.RingseedFileSystem(socket=args.socket, token=token)
    if lowlevel:
        from ringseed.fs import datamount

        datamount.mount(filesystem, args.mountpoint, root=root, attr_timeout=args.attr_timeout)
        return 0
    try:
        from ringseed.fs import fuse
    except (ImportError, OSError) as exc:  # fusepy missing, or libfuse not installed
        print(f"ringseed mount: FUSE is not available here: {exc}", file=sys.stderr)
        return 2
    fuse.mount(filesystem, args.mountpoint, root=root, attr_timeout=fusepy_timeout)
    return 0
