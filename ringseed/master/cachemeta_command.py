"""The cache role's flags of ``ringseed master`` (``--role cache``), and starting it.

Owns the cache master's command line (docs/contracts.md). Two replicas run the same command;
the lock decides which leads: ``--lock-dir DIR`` (cluster-free: a file lock both replicas can
reach) or ``--lease NAME`` (in a cluster: a Lease in ``$POD_NAMESPACE``). ``--advertise-url`` is
where this replica answers (``http://$(POD_IP):8470`` in a pod). These three flags are the
master's (``ringseed/master/command.py``), shared with the tracker role. Light at import: the server's
modules load only in :func:`run`.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cache role")
    group.add_argument("--replicas", type=int, default=2, help="cache: copies of each checkpoint (writer included)")
    group.add_argument("--sink", default=None, help="cache: the sink URI (objects are persisted there)")
    group.add_argument("--keep", type=int, default=0, help="cache: checkpoints kept in the cache (0: all)")
    group.add_argument("--follower-timeout", type=float, default=2.0, help="cache: seconds to wait for the follower")
    group.add_argument(
        "--takeover-grace",
        type=float,
        default=60.0,
        help="cache: seconds without any replica in sync before one leads with what it has",
    )
    group.add_argument(
        "--orphan-grace", type=float, default=600.0, help="cache: seconds before unreferenced chunks are dropped"
    )


def run(args: argparse.Namespace, *, token: str) -> int:
    from aiohttp import web as aioweb

    from ringseed.master import cachemeta, cachemeta_api
    from ringseed.master import election as locks

    problems = []
    if not args.advertise_url:
        problems.append("--advertise-url is required for --role cache")
    if bool(args.lock_dir) == bool(args.lease):
        problems.append("give exactly one of --lock-dir (cluster-free) or --lease (Kubernetes)")
    if args.replicas < 1:
        problems.append("--replicas must be at least 1")
    for problem in problems:
        print(f"ringseed master: {problem}", file=sys.stderr)
    if problems:
        return 2
    lock = locks.make_lock(lock_dir=args.lock_dir, lease=args.lease, name="cachemeta")
    settings = cachemeta.Settings(
        url=args.advertise_url.rstrip("/"),
        replicas=args.replicas,
        sink=bool(args.sink),
        keep=args.keep,
        offline_after=args.offline_after,
        heartbeat_interval=args.heartbeat_interval,
        orphan_grace=args.orphan_grace,
        follower_timeout=args.follower_timeout,
        takeover_grace=args.takeover_grace,
    )
    app = cachemeta_api.create_app(token=token, lock=lock, settings=settings)
    aioweb.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0
