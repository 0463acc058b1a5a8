"""kopf handlers of ringseed's operator: thin routes from kopf's causes to the reconcile modules.

Owns which kopf cause calls what. Rules: handlers are registered into an explicit
``kopf.OperatorRegistry`` by :func:`register` (no import-time globals, so intervals come from the
configuration); each handler takes the :class:`runtime.Runtime` from kopf's ``memo`` and calls
``distributions`` or ``groups``; nothing here calls the API or computes status itself; handlers
never return values (those would land in ``status`` under the handler's name).
"""

from __future__ import annotations

import datetime
from typing import Any

import kopf

from ringseed.api import constants
from ringseed.operator import distributions, groups, runtime

MD = (constants.GROUP, constants.VERSION, constants.MD_PLURAL)
TG = (constants.GROUP, constants.VERSION, constants.TG_PLURAL)


def _rt(memo: Any) -> runtime.Runtime:
    rt: runtime.Runtime = memo.runtime
    return rt


def register(*, registry: kopf.OperatorRegistry, interval: float) -> None:
    """Register every ringseed handler in ``registry``; status timers tick every ``interval`` seconds."""
    _register_activities(registry=registry)
    _register_distributions(registry=registry, interval=interval)
    _register_groups(registry=registry, interval=interval)


def _register_activities(*, registry: kopf.OperatorRegistry) -> None:
    @kopf.on.login(registry=registry)
    def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
        return _rt(memo).login()

    # No cleanup activity closes the runtime's sessions: kopf runs it while cancelled timers and
    # handlers may still be finishing a request. ``command.operate`` closes them after kopf is done.


def _first_tick(interval: float) -> Any:
    """When a status timer first ticks: at once for a resource that already has a status (the
    operator restarted: refresh it now), one interval on for a new one (its create handler writes
    the first status; an immediate tick would only find nothing to do, in the burst of creates)."""

    def delay(body: kopf.Body, **_: Any) -> float:
        return 0.0 if body.get("status") else interval

    return delay


def _register_distributions(*, registry: kopf.OperatorRegistry, interval: float) -> None:
    @kopf.on.resume(*MD, registry=registry)
    @kopf.on.create(*MD, registry=registry)
    @kopf.on.update(*MD, field="spec", registry=registry)
    async def md_apply(body: kopf.Body, logger: Any, memo: Any, reason: Any, **_: Any) -> None:
        async with _rt(memo).apply_slot():
            await distributions.apply(_rt(memo), body=body, logger=logger, fresh=reason == kopf.Reason.CREATE)

    @kopf.timer(
        *MD, interval=interval, initial_delay=_first_tick(interval), backoff=max(1.0, interval), registry=registry
    )
    async def md_status(body: kopf.Body, logger: Any, memo: Any, **_: Any) -> None:
        await distributions.observe(_rt(memo), body=body, logger=logger)

    @kopf.on.delete(*MD, registry=registry)
    async def md_delete(body: kopf.Body, logger: Any, memo: Any, runtime: datetime.timedelta, **_: Any) -> None:
        await distributions.delete(_rt(memo), body=body, runtime_=runtime, logger=logger)


def _register_groups(*, registry: kopf.OperatorRegistry, interval: float) -> None:
    @kopf.on.resume(*TG, registry=registry)
    @kopf.on.create(*TG, registry=registry)
    @kopf.on.update(*TG, field="spec", registry=registry)
    async def tg_apply(body: kopf.Body, logger: Any, memo: Any, reason: Any, **_: Any) -> None:
        async with _rt(memo).apply_slot():
            await groups.apply(_rt(memo), body=body, logger=logger, fresh=reason == kopf.Reason.CREATE)

    @kopf.timer(
        *TG, interval=interval, initial_delay=_first_tick(interval), backoff=max(1.0, interval), registry=registry
    )
    async def tg_status(body: kopf.Body, logger: Any, memo: Any, **_: Any) -> None:
        await groups.observe(_rt(memo), body=body, logger=logger)

    @kopf.on.delete(*TG, registry=registry)
    async def tg_delete(body: kopf.Body, logger: Any, memo: Any, **_: Any) -> None:
        await groups.delete(_rt(memo), body=body, logger=logger)
