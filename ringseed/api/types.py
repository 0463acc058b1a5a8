"""Typed, validated views of ringseed's custom-resource specs.

Owns the frozen dataclasses that ``ringseed.api.validation`` produces from a raw spec and that
the builders consume. Pure values, no I/O.

Rules: every field is already checked and normalised (sizes in bytes, defaults applied) when a
value exists; optional fields are ``None`` when the user left them out and a default of the
operator's configuration applies. Kubernetes sub-objects the operator passes through untouched
(tolerations, the pod template) stay plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ringseed.api import constants


@dataclass(frozen=True)
class SourceSpec:
    """Where the model comes from: ``s3://``, ``http(s)://`` or ``file://``."""

    uri: str
    secret_name: str | None = None  # Secret whose keys become the agents' environment
    manifest_uri: str | None = None
    digest: str | None = None  # expected manifest digest, lowercase hex SHA-256


@dataclass(frozen=True)
class CacheSpec:
    memory_bytes: int | None = None  # None: the operator's default
    ssd_path: str | None = None  # absolute, normalised; None: <dataRoot>/cache
    ssd_bytes: int | None = None  # None: no limit beyond the disk


@dataclass(frozen=True)
class ModelDistributionSpec:
    source: SourceSpec
    chunk_size: int = constants.DEFAULT_CHUNK_SIZE
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    cache: CacheSpec = field(default_factory=CacheSpec)
    origin_rate_limit: int | None = None  # bytes/s; None: unlimited
    seeders: int = constants.DEFAULT_SEEDERS
    retain_policy: str = constants.RETAIN


@dataclass(frozen=True)
class ModelRef:
    name: str  # a ModelDistribution in the TrainingGroup's namespace


@dataclass(frozen=True)
class CollectiveSpec:
    quantization: str = "none"
    heartbeat_seconds: int | None = None  # None: the operator's default
    timeout_seconds: int | None = None  # None: the operator's default
    optimize_topology: bool = False


@dataclass(frozen=True)
class SinkSpec:
    """Where checkpoints are persisted behind the cache: ``s3://`` or ``file://``."""

    uri: str
    secret_name: str | None = None  # Secret whose keys become the cache agents' environment (AWS_*)


@dataclass(frozen=True)
class CheckpointSpec:
    """``spec.checkpoints``: the node cache for checkpoints (issue 12)."""

    sink: SinkSpec | None = None  # None: cache only, nothing persisted
    replicas: int = constants.DEFAULT_CHECKPOINT_REPLICAS  # copies, the writer's node included
    memory_bytes: int = constants.DEFAULT_CACHE_MEMORY_BYTES
    ssd_bytes: int = 0
    ssd_path: str | None = None  # under the data root; None: <dataRoot>/cache
    keep: int = 0  # checkpoints kept in the cache; 0: all
    persist_rate_limit: int | None = None  # bytes/s to the sink; None: unlimited
    chunk_size: int = constants.DEFAULT_CACHE_CHUNK_SIZE


@dataclass(frozen=True)
class DataSource:
    name: str  # a DNS label: the dataset is ringseed://data/<name>/...
    uri: str
    secret_name: str | None = None


@dataclass(frozen=True)
class DataSpec:
    """``spec.data``: read-through dataset caching (issue 13)."""

    sources: tuple[DataSource, ...]
    memory_bytes: int = constants.DEFAULT_CACHE_MEMORY_BYTES
    ssd_bytes: int = 0
    mount_path: str | None = None  # a FUSE mount of ringseed://data in every worker container
    warmup: bool = False
    warmup_paths: tuple[str, ...] = ()  # prefixes to warm (empty: everything)
    list_ttl_seconds: int = 300


@dataclass(frozen=True)
class TrainingGroupSpec:
    template: dict[str, Any]  # a PodTemplateSpec, passed through (checked only where ringseed relies on it)
    node_selector: dict[str, str] = field(default_factory=dict)
    min_peers: int = 1
    model_ref: ModelRef | None = None
    collective: CollectiveSpec = field(default_factory=CollectiveSpec)
    checkpoints: CheckpointSpec | None = None
    data: DataSpec | None = None
