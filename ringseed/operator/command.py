"""``ringseed operator``: run the kopf operator with ringseed's handlers.

Owns the command line, kopf's settings and the start of the operator. Rules:
- One replica (kopf peering off: ``standalone``); handler progress and the last handled spec are
  kept in ``ringseed.io/`` annotations so that ``status`` holds only what ringseed writes; the
  finalizer is ``ringseed.io/finalizer``; kopf posts Events only for its warnings and errors
  (ringseed posts its own phase Events).
- Credentials: in the cluster the service account, else the kubeconfig (through the
  ``kubernetes`` client), shared by kopf and ``kube``. :func:`operate` takes any ``login``
  callable, which is how tests point the operator at KMock.
- ``--namespace`` (repeatable) or ``RINGSEED_WATCH_NAMESPACES`` restrict what is watched;
  otherwise (or with ``--all-namespaces``) it is cluster-wide.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_DEGRADED_AFTER = 60.0
DEFAULT_CLEANUP_TIMEOUT = 300.0

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch all namespaces (default)")
    parser.add_argument(
        "--status-interval",
        type=float,
        default=None,
        metavar="S",
        help="seconds between reads of masters' status (default: RINGSEED_STATUS_INTERVAL_SECONDS or 5)",
    )
    parser.add_argument(
        "--liveness",
        default=None,
        metavar="URL",
        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--degraded-after",
        type=float,
        default=DEFAULT_DEGRADED_AFTER,
        metavar="S",
        help="seconds a master may stay silent after answering before the phase is Degraded",
    )
    parser.add_argument(
        "--cleanup-timeout",
        type=float,
        default=DEFAULT_CLEANUP_TIMEOUT,
        metavar="S",
        help="seconds to wait for node data removal (retainPolicy Delete) before giving up",
    )


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import kopf

    from ringseed.operator import config as config_module

    config = config_module.OperatorConfig.from_env()
    if args.status_interval is not None:
        config = dataclasses.replace(config, status_interval_seconds=args.status_interval)
    namespaces = () if args.all_namespaces else tuple(args.namespace) or config.watch_namespaces
    settings = kopf.OperatorSettings()

    def login() -> kopf.ConnectionInfo:
        info = kopf.login_via_client(logger=log, settings=settings)
        if info is None:
            raise kopf.LoginError("No Kubernetes credentials: neither in-cluster nor a kubeconfig")
        return info

    asyncio.run(
        operate(
            config=config,
            login=login,
            namespaces=namespaces,
            liveness=args.liveness,
            degraded_after=args.degraded_after,
            cleanup_timeout=args.cleanup_timeout,
        )
    )
    return 0


def make_settings(settings: Any = None) -> Any:
    """kopf settings for ringseed (see the module docstring)."""
    import kopf

    settings = settings or kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.persistence.finalizer = "ringseed.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="ringseed.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="ringseed.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    return settings


async def operate(
    *,
    config: Any,
    login: Callable[[], Any],
    namespaces: Sequence[str] = (),
    liveness: str | None = None,
    degraded_after: float = DEFAULT_DEGRADED_AFTER,
    cleanup_timeout: float = DEFAULT_CLEANUP_TIMEOUT,
    locator: Any = None,
    stop_flag: Any = None,
    ready_flag: Any = None,
    tune: Callable[[Any], None] | None = None,
) -> None:
    """Run the operator until cancelled or ``stop_flag`` (asyncio or threading Event) is set.

    ``tune`` may adjust kopf's settings (tests shorten kopf's retry backoffs with it)."""
    import kopf

    from ringseed.operator import handlers, masters, runtime

    registry = kopf.OperatorRegistry()
    handlers.register(registry=registry, interval=config.status_interval_seconds)
    rt = runtime.Runtime.create(
        config=config,
        login=login,
        locator=locator or masters.Locator.from_env(),
        degraded_after=degraded_after,
        cleanup_timeout=cleanup_timeout,
    )
    settings = make_settings()
    if tune is not None:
        tune(settings)
    try:
        await kopf.operator(
            registry=registry,
            settings=settings,
            memo=kopf.Memo(runtime=rt),
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            standalone=True,
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        await rt.close()
