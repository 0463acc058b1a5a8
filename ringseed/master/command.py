"""``ringseed master``: run the master in its tracker (distribution), coordinator (training) or cache role.

The tracker and cache roles may run as two replicas, a leader and a follower: ``--lock-dir``
(cluster-free) or ``--lease`` (Kubernetes) picks the leader, ``--advertise-url`` is where this
replica answers.

Owns the master's command line (docs/contracts.md, "Command lines the operator builds"). The
coordinator role's module is imported only for ``--role coordinator``. The token comes from
``--token-file`` or ``RINGSEED_TOKEN`` (the file wins); a master without a token refuses to start.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ringseed import cmdline
from ringseed.protocol import pacing


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--role",
        choices=("tracker", "coordinator", "cache"),
        required=True,
        help="tracker (distribution), coordinator (training) or cache (node cache metadata)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0: all addresses)")
    parser.add_argument("--port", type=cmdline.port, default=8470, help="port to listen on (0: any free port)")
    parser.add_argument("--token-file", help="file holding the group's bearer token (else RINGSEED_TOKEN)")
    parser.add_argument(
        "--offline-after",
        type=cmdline.positive_seconds,
        default=10.0,
        help="seconds of silence before a node is purged",
    )
    parser.add_argument(
        "--heartbeat-interval", type=cmdline.positive_seconds, default=2.0, help="seconds between heartbeats"
    )
    parser.add_argument(
        "--heartbeat-rate",
        type=cmdline.non_negative_int,
        default=pacing.DEFAULT_RATE,
        help="tracker: heartbeats per second the swarm's pace aims at: a larger swarm is told a longer "
        "interval and gap (0: every node keeps --heartbeat-interval and --early-gap)",
    )
    parser.add_argument(
        "--early-gap",
        type=cmdline.positive_seconds,
        default=pacing.DEFAULT_GAP,
        help="tracker: least seconds between a node's early heartbeats (news to tell) in a small swarm",
    )
    parser.add_argument(
        "--heartbeat-jitter",
        type=cmdline.fraction,
        default=pacing.DEFAULT_JITTER,
        help="tracker: a scaled pace (a swarm above --heartbeat-rate x --early-gap nodes) is told times a "
        "factor drawn from [1 - jitter, 1 + jitter], so that agents that started together drift apart "
        "instead of heartbeating in waves (0: none)",
    )
    parser.add_argument(
        "--gc-freeze-every",
        type=cmdline.non_negative_seconds,
        default=0.25,  # (BENCHMARKS section 9, session 6: young collections of 120-200 ms -> 3 ms at 10,000 agents)
        help="tracker: gc.freeze() every this many seconds, so young collections walk only what is new "
        "since (a keep-alive server piles survivors there); unfrozen and fully collected every "
        "--gc-full-every (0: Python's own policy)",
    )
    parser.add_argument(
        "--gc-full-every",
        type=cmdline.positive_seconds,
        default=600.0,
        help="tracker: with --gc-freeze-every, seconds between full collections (frees the cyclic garbage "
        "frozen meanwhile)",
    )
    parser.add_argument(
        "--front-seats",
        type=cmdline.non_negative_int,
        default=pacing.DEFAULT_FRONT_SEATS,
        help="tracker: nodes that last announced a chunk few nodes hold keep --early-gap (the front of "
        "the pipeline; 0: none)",
    )
    parser.add_argument(
        "--heartbeat-timeout", type=cmdline.positive_seconds, default=10.0, help="coordinator: seconds to lose a peer"
    )
    parser.add_argument(
        "--seeders", type=cmdline.positive_int, default=1, help="tracker: agents on origin duty at once"
    )
    parser.add_argument(
        "--heartbeat-replies",
        choices=("delta", "full"),
        default="delta",
        help="tracker: what heartbeat replies carry: the changes since the agent's version, or (the "
        "behaviour before deltas, for comparison) the whole availability vector whenever it changed",
    )
    parser.add_argument("--min-peers", type=cmdline.positive_int, default=1, help="coordinator: peers needed to start")
    parser.add_argument(
        "--optimize-topology",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="coordinator: order the ring by measured bandwidth (default: off)",
    )
    replicas = parser.add_argument_group("replicas (tracker and cache: a leader and a follower)")
    replicas.add_argument("--advertise-url", help="this replica's URL as agents and the other replica reach it")
    replicas.add_argument("--lock-dir", help="directory of the leader lock both replicas reach (cluster-free)")
    replicas.add_argument("--lease", help="name of the Kubernetes Lease that picks the leader (in $POD_NAMESPACE)")
    from ringseed.master import cachemeta_command

    cachemeta_command.configure(parser)


def run(args: argparse.Namespace) -> int:
    from aiohttp import web as aioweb

    try:
        token = cmdline.read_token(args.token_file)
    except ValueError as exc:
        print(f"ringseed master: {exc}", file=sys.stderr)
        return 2
    if token is None:
        print("ringseed master: no token (use --token-file or RINGSEED_TOKEN)", file=sys.stderr)
        return 2
    if args.role == "cache":
        from ringseed.master import cachemeta_command

        return cachemeta_command.run(args, token=token)
    if args.role == "tracker":
        from ringseed.master import tracker
        from ringseed.protocol import tracker_log

        try:
            lock = _tracker_lock(args)
        except ValueError as exc:
            print(f"ringseed master: {exc}", file=sys.stderr)
            return 2
        app = tracker.create_app(
            token=token,
            offline_after=args.offline_after,
            heartbeat_interval=args.heartbeat_interval,
            seeders=args.seeders,
            replies=tracker_log.Replies(args.heartbeat_replies),
            lock=lock,
            url=(args.advertise_url or "").rstrip("/"),
            heartbeat_rate=float(args.heartbeat_rate) or None,
            early_gap=args.early_gap,
            front_seats=args.front_seats,
            heartbeat_jitter=args.heartbeat_jitter,
            gc_freeze_every=args.gc_freeze_every,
            gc_full_every=args.gc_full_every,
        )
    else:
        from ringseed.master import coordinator  # type: ignore[attr-defined,unused-ignore]

        app = coordinator.create_app(
            token=token,
            heartbeat_interval=args.heartbeat_interval,
            heartbeat_timeout=args.heartbeat_timeout,
            optimize_topology=args.optimize_topology,
            min_peers=args.min_peers,
        )
    aioweb.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0


def _tracker_lock(args: argparse.Namespace) -> Any:
    """The tracker replica's lock (None: a single replica); its Lease lets a follower take over
    within one heartbeat timeout (``--offline-after``)."""
    if not args.lock_dir and not args.lease:
        return None
    if not args.advertise_url:
        raise ValueError("--advertise-url is required with --lock-dir or --lease (agents are sent to it)")
    from ringseed.master import election as locks
    from ringseed.protocol import election

    timing = election.lease_timing(takeover_within=args.offline_after)
    return locks.make_lock(lock_dir=args.lock_dir, lease=args.lease, name="tracker", duration=timing.duration)
