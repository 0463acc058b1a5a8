"""What the running operator shares between handlers, and the steps both custom resources use.

Owns :class:`Runtime` (config, API client, master reader, caches; handed to kopf as ``memo``) and
the common steps of a reconcile: parse-or-fail, make the token Secret once, apply children,
write status, post phase Events, delete children. Rules:
- Handlers are safe to run twice: every step reads first and writes only what differs.
- An invalid spec writes its condition (phase Failed, InvalidSpec naming field and problem), posts
  one Warning Event, then raises ``kopf.PermanentError``: no crash loop, no retries.
- The status is written here and by the timers only, always as a merge patch to ``/status``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf

from ringseed.api import constants, validation
from ringseed.operator import builders, builders_common, builders_monitor, kube, masters, status
from ringseed.operator import config as config_module

log = logging.getLogger(__name__)
T = TypeVar("T")
CHILD_KINDS = (("apps/v1", "Deployment", "master"), ("v1", "Service", "master"))


@dataclass
class Runtime:
    """The operator's shared state; one per process (kopf's memo holds it)."""

    config: config_module.OperatorConfig
    login: Callable[[], kopf.ConnectionInfo]  # credentials of kopf and of ``kube`` alike
    kube: kube.Client
    reader: masters.Reader
    locator: masters.Locator
    degraded_after: float = 60.0  # seconds a master may be silent after answering before Degraded
    cleanup_timeout: float = 300.0  # seconds the cleanup DaemonSet may take before it is removed anyway
    silence: masters.Silence = field(default_factory=masters.Silence)
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)
    labelled: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    # the namespaces whose master identity this process made or found (ensure_identity), the
    # resources whose masters run as it, and one lock per namespace (one apply, not one per resource)
    identities: set[str] = field(default_factory=set)
    identity_users: set[tuple[str, str, str]] = field(default_factory=set)
    identity_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    applying: asyncio.Semaphore | None = None  # see apply_slot

    def apply_slot(self) -> asyncio.Semaphore:
        """At most ``config.apply_concurrency`` resources have their spec applied at once; the rest
        wait their turn. Under a burst of creates the first resources get their children early
        instead of every resource getting them at the end (the API calls are the same)."""
        if self.applying is None:
            self.applying = asyncio.Semaphore(self.config.apply_concurrency)
        return self.applying

    @classmethod
    def create(
        cls,
        *,
        config: config_module.OperatorConfig,
        login: Callable[[], kopf.ConnectionInfo],
        locator: masters.Locator,
        degraded_after: float,
        cleanup_timeout: float,
    ) -> Runtime:
        return cls(
            config=config,
            login=login,
            kube=kube.Client(login=login),
            locator=locator,
            reader=masters.Reader(timeout=3.0),
            degraded_after=degraded_after,
            cleanup_timeout=cleanup_timeout,
        )

    async def close(self) -> None:
        await self.reader.close()
        await self.kube.close()


def now_text() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def monotonic() -> float:
    return time.monotonic()


def ident(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body["metadata"]
    return str(meta.get("namespace") or "default"), str(meta["name"])


async def parse_or_fail(rt: Runtime, *, body: Mapping[str, Any], parse: Callable[[], T]) -> T:
    """The parsed spec; on :class:`SpecError` write Failed + InvalidSpec, post a Warning, give up."""
    try:
        return parse()
    except validation.SpecError as exc:
        await write_status(rt, body=body, new=invalid(body=body, error=exc))
        raise kopf.PermanentError(f"Invalid spec: {exc.field}: {exc.problem}") from exc


def invalid(*, body: Mapping[str, Any], error: validation.SpecError) -> dict[str, Any]:
    """Phase Failed with the InvalidSpec condition naming the field and the problem."""
    return status.invalid_status(
        field=error.field,
        problem=error.problem,
        generation=generation_of(body),
        previous=body.get("status") or {},
        now=now_text(),
    )


def generation_of(body: Mapping[str, Any]) -> int | None:
    value = body.get("metadata", {}).get("generation")
    return None if value is None else int(value)


def changed(previous: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(previous.get(key) != value for key, value in new.items())


async def write_status(rt: Runtime, *, body: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Patch the status when it differs; post an Event when the phase changed. True if patched."""
    previous = body.get("status") or {}
    if not changed(previous, new):
        return False
    namespace, name = ident(body)
    alive = await kube.patch_status(
        rt.kube, api_version=body["apiVersion"], kind=body["kind"], namespace=namespace, name=name, status=new
    )
    event = status.phase_event(previous=previous, current=new)
    if alive and event is not None:
        await post_events(rt, body=body, events=[event])
    return alive


async def post_events(rt: Runtime, *, body: Mapping[str, Any], events: Sequence[tuple[str, str, str]]) -> None:
    """Post ``(type, reason, message)`` Events about the resource; a failure is logged, not raised
    (an Event is a courtesy: the status already says it)."""
    for type_, reason, message in events:
        try:
            await kube.post_event(rt.kube, involved=body, reason=reason, message=message, type_=type_)
        except kube.ApiError as exc:
            namespace, name = ident(body)
            log.warning("Could not post Event about %s %s/%s: %s", body["kind"], namespace, name, exc)


async def token_of(rt: Runtime, *, namespace: str, name: str) -> str | None:
    """The group token from Secret ``<name>-token`` (cached once read)."""
    key = (namespace, name)
    if key not in rt.tokens:
        token = await kube.read_secret_key(rt.kube, namespace=namespace, name=f"{name}-token", key=constants.TOKEN_KEY)
        if token is None:
            return None
        rt.tokens[key] = token
    return rt.tokens[key]


async def apply_children(
    rt: Runtime,
    *,
    body: Mapping[str, Any],
    children: Sequence[Mapping[str, Any]],
    logger: logging.Logger | logging.LoggerAdapter[Any],
    fresh: bool = False,
) -> None:
    """The token Secret (made once, never rotated by a spec change), then all children at once;
    ``fresh``: the resource was just created (try creates before reads)."""
    token = secrets.token_urlsafe(32)
    secret = builders.token_secret(body=body, token=token)
    identity = []
    if any(builders_common.uses_master_identity(child) for child in children):
        rt.identity_users.add(user_of(body))
        identity.append(ensure_identity(rt, namespace=ident(body)[0], fresh=fresh))
    applying = asyncio.gather(
        kube.apply(rt.kube, obj=secret, once=True, fresh=fresh),
        *(kube.apply(rt.kube, obj=child, fresh=fresh) for child in children),
    )
    await asyncio.gather(applying, *identity)
    outcomes = applying.result()
    if outcomes[0] is kube.Applied.CREATED:
        rt.tokens[ident(body)] = token  # saves the timer reading it back
    for obj, outcome in zip([secret, *children], outcomes, strict=True):
        if outcome is not kube.Applied.UNCHANGED:
            logger.info("%s %s %s", outcome.value, obj["kind"], obj["metadata"]["name"])


def user_of(body: Mapping[str, Any]) -> tuple[str, str, str]:
    namespace, name = ident(body)
    return str(body["kind"]), namespace, name


async def ensure_identity(rt: Runtime, *, namespace: str, fresh: bool = False) -> None:
    """The namespace's master identity exists (made once per namespace and process; see
    ``builders_common.master_identity``). Resources applied at once wait for one apply."""
    lock = rt.identity_locks.setdefault(namespace, asyncio.Lock())
    async with lock:
        if namespace in rt.identities:
            return
        identity = builders_common.master_identity(namespace=namespace)
        outcomes = await asyncio.gather(*(kube.apply(rt.kube, obj=obj, fresh=fresh) for obj in identity))
        for obj, outcome in zip(identity, outcomes, strict=True):
            if outcome is not kube.Applied.UNCHANGED:
                log.info("%s %s %s/%s", outcome.value, obj["kind"], namespace, obj["metadata"]["name"])
        rt.identities.add(namespace)


async def keep_identity(rt: Runtime, *, body: Mapping[str, Any]) -> None:
    """For the status timers: make the identity again if it was released while this resource was
    being created (the namespace's last other resource deleted at that moment); costs nothing
    while this process knows it exists."""
    if user_of(body) in rt.identity_users:
        await ensure_identity(rt, namespace=ident(body)[0])


async def release_identity(rt: Runtime, *, body: Mapping[str, Any]) -> None:
    """Delete the namespace's master identity if no ModelDistribution or TrainingGroup that is not
    being deleted is left in it (asked of the API server: this process may not know them all)."""
    namespace, _ = ident(body)
    rt.identity_users.discard(user_of(body))
    if any(user[1] == namespace for user in rt.identity_users):
        return
    for kind in (constants.MD_KIND, constants.TG_KIND):
        items = await rt.kube.list(api_version=constants.API_VERSION, kind=kind, namespace=namespace)
        if any(not (item.get("metadata") or {}).get("deletionTimestamp") for item in items):
            return
    async with rt.identity_locks.setdefault(namespace, asyncio.Lock()):
        rt.identities.discard(namespace)
        await asyncio.gather(
            *(
                rt.kube.delete(
                    api_version=obj["apiVersion"], kind=obj["kind"], namespace=namespace, name=obj["metadata"]["name"]
                )
                for obj in builders_common.master_identity(namespace=namespace)
            )
        )
    log.info("Deleted the master identity of namespace %s: no resource left there", namespace)


async def delete_children(rt: Runtime, *, body: Mapping[str, Any], workload: tuple[str, str, str]) -> None:
    """Delete what ownerReferences would make the garbage collector delete (explicit: it may not run)."""
    namespace, name = ident(body)
    kinds = [*CHILD_KINDS, workload, ("v1", "Secret", "token")]
    if rt.config.pod_monitor:
        kinds.append((builders_monitor.API_VERSION, builders_monitor.KIND, builders_monitor.SUFFIX))
    await asyncio.gather(
        *(
            rt.kube.delete(api_version=api_version, kind=kind, namespace=namespace, name=f"{name}-{suffix}")
            for api_version, kind, suffix in kinds
        )
    )
    rt.tokens.pop((namespace, name), None)
    rt.silence.forget((body["kind"], namespace, name))
    await release_identity(rt, body=body)


async def read_master(rt: Runtime, *, body: Mapping[str, Any]) -> status.Reach:
    """Ask the resource's master for ``/v1/status``; remember when it last answered."""
    namespace, name = ident(body)
    key = (str(body["kind"]), namespace, name)
    url = rt.locator.url(namespace=namespace, name=name)
    try:
        token = await token_of(rt, namespace=namespace, name=name)
        report = await rt.reader.status(url=url, token=token)
    except masters.MasterError as exc:
        return status.Reach(report=None, unreachable_for=rt.silence.silent_for(key, now=monotonic()), error=str(exc))
    rt.silence.answered(key, now=monotonic())
    return status.Reach(report=report)
