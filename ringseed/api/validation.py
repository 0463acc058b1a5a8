"""Validation of ringseed's custom-resource specs: raw mapping in, frozen spec (or SpecError) out.

Owns every rule that decides whether a spec can work. Pure, no I/O. The CRD schema in ``crds/``
states the same bounds so the API server rejects most mistakes at once; these checks are the
operator's own guard (and cover what a schema cannot: a path under the data root, a template
that clashes with ringseed's names, a resource name too long for its children).

Rules: the first problem found raises :class:`SpecError` naming the field as a user writes it
(``spec.source.uri``, ``spec.template.spec.containers[0].image``) and what is wrong; unknown
fields are rejected (a typo must not be silently ignored); sizes become whole bytes.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

from ringseed.api import constants, types
from ringseed.protocol import units

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_URI = re.compile(r"^(s3|https?|file)://.+$")
_DIGEST = re.compile(r"^(sha256:)?[0-9a-f]{64}$")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_RESERVED_PREFIX = "ringseed-"


# The top-level spec fields each kind accepts. To add one: its name here, a parser below whose
# errors name the field, a field in ``types``, and the same property in ``crds/`` (a unit test
# keeps these sets equal to the CRDs' spec properties).
MD_FIELDS = frozenset(
    {"source", "chunkSize", "nodeSelector", "tolerations", "cache", "originRateLimit", "seeders", "retainPolicy"}
)
TG_FIELDS = frozenset({"template", "nodeSelector", "minPeers", "modelRef", "collective", "checkpoints", "data"})


class SpecError(ValueError):
    """A spec that cannot work; ``field`` is the path a user writes, ``problem`` says why."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check_name(name: str) -> None:
    """A resource name ringseed can derive child names (Services are DNS-1035 labels) from."""
    if not _DNS_1035.match(name):
        raise SpecError("metadata.name", f"{name!r} must be lowercase letters, digits and '-', starting with a letter")
    if len(name) > constants.MAX_NAME_LENGTH:
        raise SpecError("metadata.name", f"{name!r} is longer than {constants.MAX_NAME_LENGTH} characters")


def check_ssd_path(path: str, *, data_root: str, field: str = "spec.cache.ssdPath") -> None:
    """An ``ssdPath`` must lie under the operator's data root (hostPath is confined there)."""
    root = posixpath.normpath(data_root)
    if posixpath.commonpath([root, path]) != root or path == root:
        raise SpecError(field, f"{path!r} is not under the data root {root!r}")


def parse_model_distribution(
    spec: Mapping[str, Any], *, name: str | None = None, data_root: str | None = None
) -> types.ModelDistributionSpec:
    """A validated ModelDistribution spec; pass ``name`` and ``data_root`` to check those too."""
    if name is not None:
        check_name(name)
    spec = _mapping(spec, "spec")
    _reject_unknown(spec, MD_FIELDS, "spec")
    cache = _cache(spec.get("cache"))
    if cache.ssd_path is not None and data_root is not None:
        check_ssd_path(cache.ssd_path, data_root=data_root)
    retain = spec.get("retainPolicy", constants.RETAIN)
    if retain not in constants.RETAIN_POLICIES:
        raise SpecError("spec.retainPolicy", f"{retain!r} is not one of {', '.join(constants.RETAIN_POLICIES)}")
    rate = spec.get("originRateLimit")
    return types.ModelDistributionSpec(
        source=_source(spec.get("source")),
        chunk_size=_bytes(
            spec.get("chunkSize", constants.DEFAULT_CHUNK_SIZE),
            "spec.chunkSize",
            low=constants.MIN_CHUNK_SIZE,
            high=constants.MAX_CHUNK_SIZE,
        ),
        node_selector=_selector(spec.get("nodeSelector"), "spec.nodeSelector"),
        tolerations=_tolerations(spec.get("tolerations")),
        cache=cache,
        origin_rate_limit=None if rate is None else _bytes(rate, "spec.originRateLimit", low=1),
        seeders=_int(spec.get("seeders", constants.DEFAULT_SEEDERS), "spec.seeders", low=1, high=constants.MAX_SEEDERS),
        retain_policy=retain,
    )


def parse_training_group(
    spec: Mapping[str, Any], *, name: str | None = None, data_root: str | None = None
) -> types.TrainingGroupSpec:
    """A validated TrainingGroup spec; with ``name``, also the name and that modelRef is not itself;
    with ``data_root``, that ``checkpoints.ssdPath`` lies under it."""
    if name is not None:
        check_name(name)
    spec = _mapping(spec, "spec")
    _reject_unknown(spec, TG_FIELDS, "spec")
    model_ref = None
    if spec.get("modelRef") is not None:
        ref = _mapping(spec["modelRef"], "spec.modelRef")
        _reject_unknown(ref, {"name"}, "spec.modelRef")
        ref_name = _string(ref.get("name"), "spec.modelRef.name")
        if not _DNS_1035.match(ref_name) or len(ref_name) > constants.MAX_NAME_LENGTH:
            raise SpecError("spec.modelRef.name", f"{ref_name!r} is not a valid ModelDistribution name")
        if ref_name == name:
            raise SpecError("spec.modelRef.name", "refers to the TrainingGroup itself; children of both would clash")
        model_ref = types.ModelRef(name=ref_name)
    return types.TrainingGroupSpec(
        template=_template(spec.get("template")),
        node_selector=_selector(spec.get("nodeSelector"), "spec.nodeSelector"),
        min_peers=_int(spec.get("minPeers", 1), "spec.minPeers", low=1, high=constants.MAX_MIN_PEERS),
        model_ref=model_ref,
        collective=_collective(spec.get("collective")),
        checkpoints=_checkpoints(spec.get("checkpoints"), data_root=data_root),
        data=_data(spec.get("data")),
    )


def _secret_ref(value: object, field: str) -> str | None:
    if value is None:
        return None
    ref = _mapping(value, field)
    _reject_unknown(ref, {"name"}, field)
    name = _string(ref.get("name"), f"{field}.name")
    if not _DNS_1123_SUBDOMAIN.match(name) or len(name) > 253:
        raise SpecError(f"{field}.name", f"{name!r} is not a valid Secret name")
    return name


def _checkpoints(value: object, *, data_root: str | None) -> types.CheckpointSpec | None:
    if value is None:
        return None
    field = "spec.checkpoints"
    spec = _mapping(value, field)
    _reject_unknown(
        spec, {"sink", "replicas", "memoryBytes", "ssdBytes", "ssdPath", "keep", "persistRateLimit", "chunkSize"}, field
    )
    sink = None
    if spec.get("sink") is not None:
        raw = _mapping(spec["sink"], f"{field}.sink")
        _reject_unknown(raw, {"uri", "secretRef"}, f"{field}.sink")
        uri = _uri(raw.get("uri"), f"{field}.sink.uri")
        if not uri.startswith(("s3://", "file://")):
            raise SpecError(f"{field}.sink.uri", f"{uri!r}: a sink is s3:// or file://")
        sink = types.SinkSpec(uri=uri, secret_name=_secret_ref(raw.get("secretRef"), f"{field}.sink.secretRef"))
    chunk = _bytes(
        spec.get("chunkSize", constants.DEFAULT_CACHE_CHUNK_SIZE),
        f"{field}.chunkSize",
        low=constants.MIN_CACHE_CHUNK_SIZE,
        high=constants.MAX_CHUNK_SIZE,
    )
    memory = _bytes(spec.get("memoryBytes", constants.DEFAULT_CACHE_MEMORY_BYTES), f"{field}.memoryBytes", low=chunk)
    ssd_path = None
    if spec.get("ssdPath") is not None:
        ssd_path = _absolute(spec["ssdPath"], f"{field}.ssdPath")
        if data_root is not None:
            check_ssd_path(ssd_path, data_root=data_root, field=f"{field}.ssdPath")
    rate = spec.get("persistRateLimit")
    return types.CheckpointSpec(
        sink=sink,
        replicas=_int(
            spec.get("replicas", constants.DEFAULT_CHECKPOINT_REPLICAS),
            f"{field}.replicas",
            low=1,
            high=constants.MAX_CHECKPOINT_REPLICAS,
        ),
        memory_bytes=memory,
        ssd_bytes=_bytes(spec.get("ssdBytes", 0), f"{field}.ssdBytes"),
        ssd_path=ssd_path,
        keep=_int(spec.get("keep", 0), f"{field}.keep", low=0, high=100_000),
        persist_rate_limit=None if rate is None else _bytes(rate, f"{field}.persistRateLimit", low=1),
        chunk_size=chunk,
    )


def _data(value: object) -> types.DataSpec | None:
    if value is None:
        return None
    field = "spec.data"
    spec = _mapping(value, field)
    _reject_unknown(spec, {"sources", "memoryBytes", "ssdBytes", "mountPath", "warmup", "listTTLSeconds"}, field)
    raw_sources = spec.get("sources")
    if not isinstance(raw_sources, list) or not 0 < len(raw_sources) <= constants.MAX_DATA_SOURCES:
        raise SpecError(f"{field}.sources", f"must list 1 to {constants.MAX_DATA_SOURCES} sources")
    sources, names = [], set()
    for index, item in enumerate(raw_sources):
        at = f"{field}.sources[{index}]"
        source = _mapping(item, at)
        _reject_unknown(source, {"name", "uri", "secretRef"}, at)
        name = _string(source.get("name"), f"{at}.name")
        if not _DNS_1035.match(name) or len(name) > 63 or name in names:
            raise SpecError(f"{at}.name", f"{name!r} must be a unique lowercase DNS label")
        names.add(name)
        sources.append(
            types.DataSource(
                name=name,
                uri=_uri(source.get("uri"), f"{at}.uri"),
                secret_name=_secret_ref(source.get("secretRef"), f"{at}.secretRef"),
            )
        )
    mount = None if spec.get("mountPath") is None else _absolute(spec["mountPath"], f"{field}.mountPath")
    warmup = spec.get("warmup")
    enabled = False
    paths: tuple[str, ...] = ()
    if warmup is not None:
        raw = _mapping(warmup, f"{field}.warmup")
        _reject_unknown(raw, {"enabled", "paths"}, f"{field}.warmup")
        enabled = raw.get("enabled", True)
        if not isinstance(enabled, bool):
            raise SpecError(f"{field}.warmup.enabled", "must be true or false")
        listed = raw.get("paths") or []
        if not isinstance(listed, list) or not all(isinstance(p, str) and p for p in listed):
            raise SpecError(f"{field}.warmup.paths", "must be a list of path prefixes")
        paths = tuple(str(p).strip("/") for p in listed)
    return types.DataSpec(
        sources=tuple(sources),
        memory_bytes=_bytes(spec.get("memoryBytes", constants.DEFAULT_CACHE_MEMORY_BYTES), f"{field}.memoryBytes"),
        ssd_bytes=_bytes(spec.get("ssdBytes", 0), f"{field}.ssdBytes"),
        mount_path=mount,
        warmup=enabled,
        warmup_paths=paths,
        list_ttl_seconds=_int(spec.get("listTTLSeconds", 300), f"{field}.listTTLSeconds", low=0, high=86_400),
    )


def _absolute(value: object, field: str) -> str:
    raw = _string(value, field)
    if not raw.startswith("/") or ".." in raw.split("/"):
        raise SpecError(field, f"{raw!r} must be an absolute path without '..'")
    return posixpath.normpath(raw)


def _source(value: object) -> types.SourceSpec:
    source = _mapping(value, "spec.source")
    _reject_unknown(source, {"uri", "secretRef", "manifestUri", "digest"}, "spec.source")
    uri = _uri(source.get("uri"), "spec.source.uri")
    manifest_uri = None if source.get("manifestUri") is None else _uri(source["manifestUri"], "spec.source.manifestUri")
    secret_name = None
    if source.get("secretRef") is not None:
        ref = _mapping(source["secretRef"], "spec.source.secretRef")
        _reject_unknown(ref, {"name"}, "spec.source.secretRef")
        secret_name = _string(ref.get("name"), "spec.source.secretRef.name")
        if not _DNS_1123_SUBDOMAIN.match(secret_name) or len(secret_name) > 253:
            raise SpecError("spec.source.secretRef.name", f"{secret_name!r} is not a valid Secret name")
    digest = None
    if source.get("digest") is not None:
        digest = _string(source["digest"], "spec.source.digest").lower()
        if not _DIGEST.match(digest):
            raise SpecError("spec.source.digest", "must be 64 hex digits of SHA-256, optionally prefixed 'sha256:'")
        digest = digest.removeprefix("sha256:")
    return types.SourceSpec(uri=uri, secret_name=secret_name, manifest_uri=manifest_uri, digest=digest)


def _uri(value: object, field: str) -> str:
    uri = _string(value, field)
    if not _URI.match(uri):
        raise SpecError(field, f"{uri!r} must start with s3://, http://, https:// or file:// and name something")
    if uri.startswith("s3://") and not uri[5:].split("/", 1)[0]:
        raise SpecError(field, f"{uri!r} names no bucket")
    return uri


def _cache(value: object) -> types.CacheSpec:
    if value is None:
        return types.CacheSpec()
    cache = _mapping(value, "spec.cache")
    _reject_unknown(cache, {"memoryBytes", "ssdPath", "ssdBytes"}, "spec.cache")
    ssd_path = None
    if cache.get("ssdPath") is not None:
        raw = _string(cache["ssdPath"], "spec.cache.ssdPath")
        if not raw.startswith("/") or ".." in raw.split("/"):
            raise SpecError("spec.cache.ssdPath", f"{raw!r} must be an absolute path without '..'")
        ssd_path = posixpath.normpath(raw)
    memory, ssd = cache.get("memoryBytes"), cache.get("ssdBytes")
    return types.CacheSpec(
        memory_bytes=None if memory is None else _bytes(memory, "spec.cache.memoryBytes"),
        ssd_path=ssd_path,
        ssd_bytes=None if ssd is None else _bytes(ssd, "spec.cache.ssdBytes"),
    )


def _template(value: object) -> dict[str, Any]:
    template = _mapping(value, "spec.template")
    pod = _mapping(template.get("spec"), "spec.template.spec")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise SpecError("spec.template.spec.containers", "must list at least one container")
    for index, container in enumerate(containers):
        field = f"spec.template.spec.containers[{index}]"
        container = _mapping(container, field)
        _string(container.get("name"), f"{field}.name")
        _string(container.get("image"), f"{field}.image")
    if pod.get("restartPolicy", "Always") != "Always":
        raise SpecError("spec.template.spec.restartPolicy", "must be Always (workers run as a DaemonSet)")
    for kind in ("volumes", "initContainers"):
        for index, item in enumerate(pod.get(kind) or []):
            item_name = _mapping(item, f"spec.template.spec.{kind}[{index}]").get("name", "")
            if str(item_name).startswith(_RESERVED_PREFIX):
                raise SpecError(
                    f"spec.template.spec.{kind}[{index}].name", f"the prefix {_RESERVED_PREFIX!r} is ringseed's"
                )
    return dict(template)


def _collective(value: object) -> types.CollectiveSpec:
    if value is None:
        return types.CollectiveSpec()
    spec = _mapping(value, "spec.collective")
    _reject_unknown(spec, {"quantization", "heartbeatSeconds", "timeoutSeconds", "optimizeTopology"}, "spec.collective")
    quantization = spec.get("quantization", "none")
    if quantization not in constants.QUANTIZATIONS:
        raise SpecError(
            "spec.collective.quantization", f"{quantization!r} is not one of {', '.join(constants.QUANTIZATIONS)}"
        )
    heartbeat, timeout = spec.get("heartbeatSeconds"), spec.get("timeoutSeconds")
    if heartbeat is not None:
        heartbeat = _int(heartbeat, "spec.collective.heartbeatSeconds", low=1, high=constants.MAX_HEARTBEAT_SECONDS)
    if timeout is not None:
        timeout = _int(timeout, "spec.collective.timeoutSeconds", low=1, high=constants.MAX_TIMEOUT_SECONDS)
    if heartbeat is not None and timeout is not None and timeout <= heartbeat:
        raise SpecError("spec.collective.timeoutSeconds", "must be longer than heartbeatSeconds")
    optimize = spec.get("optimizeTopology", False)
    if not isinstance(optimize, bool):
        raise SpecError("spec.collective.optimizeTopology", "must be true or false")
    return types.CollectiveSpec(
        quantization=quantization, heartbeat_seconds=heartbeat, timeout_seconds=timeout, optimize_topology=optimize
    )


def _selector(value: object, field: str) -> dict[str, str]:
    if value is None:
        return {}
    selector = _mapping(value, field)
    for key, label in selector.items():
        prefix, _, name = str(key).rpartition("/")
        if (
            not name
            or len(name) > 63
            or not _LABEL_NAME.match(name)
            or (prefix and not _DNS_1123_SUBDOMAIN.match(prefix))
        ):
            raise SpecError(f"{field}.{key}", "is not a valid label key")
        if not isinstance(label, str) or len(label) > 63 or not _LABEL_NAME.match(label):
            raise SpecError(f"{field}.{key}", f"{label!r} is not a valid label value")
    return {str(key): str(label) for key, label in selector.items()}


def _tolerations(value: object) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError("spec.tolerations", "must be a list")
    for index, item in enumerate(value):
        field = f"spec.tolerations[{index}]"
        _reject_unknown(_mapping(item, field), _TOLERATION_KEYS, field)
        if item.get("operator", "Equal") not in ("Equal", "Exists"):
            raise SpecError(f"{field}.operator", "must be Equal or Exists")
        if item.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise SpecError(f"{field}.effect", "must be NoSchedule, PreferNoSchedule or NoExecute")
    return tuple(dict(item) for item in value)


def _bytes(value: object, field: str, *, low: int = 0, high: int | None = None) -> int:
    try:
        result = units.parse_size(value, syntax=units.Syntax.QUANTITY)
    except ValueError as exc:
        raise SpecError(field, str(exc)) from None
    if result < low or (high is not None and result > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise SpecError(field, f"{result} bytes is out of range: must be {bounds}")
    return result


def _int(value: object, field: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"{value!r} is not an integer")
    if not low <= value <= high:
        raise SpecError(field, f"{value} is out of range: must be between {low} and {high}")
    return value


def _string(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(field, "is required and must be a non-empty string")
    return value


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(field, "is required and must be an object")
    return value


def _reject_unknown(value: Mapping[str, Any], allowed: set[str] | frozenset[str], field: str) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise SpecError(f"{field}.{unknown[0]}", f"unknown field; expected one of {', '.join(sorted(allowed))}")
