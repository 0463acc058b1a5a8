"""Names and numbers of ringseed's Kubernetes API: group, kinds, labels, ports, bounds.

Owns every string the operator, the chart and the CRDs must agree on. Pure constants, no I/O.

Rules: a value here is part of the API; change it only together with ``crds/`` and the chart.
The chunk-size bounds are ``ringseed.protocol.manifest``'s (api/ sits above protocol/).
"""

from __future__ import annotations

from ringseed.protocol import manifest

GROUP = "ringseed.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

MD_KIND = "ModelDistribution"
MD_PLURAL = "modeldistributions"
MD_SHORT = "md"
TG_KIND = "TrainingGroup"
TG_PLURAL = "traininggroups"
TG_SHORT = "tg"
CATEGORY = "ringseed"

# Ports (docs/contracts.md).
MASTER_PORT = 8470
AGENT_PORT = 8471
COLLECTIVE_PORT = 8472

# Labels and annotations on every child object.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_OWNER_KIND = "ringseed.io/owner-kind"
APP_NAME = "ringseed"
MANAGED_BY = "ringseed-operator"
COMPONENT_MASTER = "master"
COMPONENT_AGENT = "agent"
COMPONENT_WORKER = "worker"
COMPONENT_CLEANUP = "cleanup"
COMPONENT_MASTER_IDENTITY = "master-identity"
# The ServiceAccount (with its Role and RoleBinding) every replicated master of a namespace runs as
MASTER_ACCOUNT = "ringseed-master"
SPEC_HASH_ANNOTATION = "ringseed.io/spec-hash"
MODEL_SOURCE_ANNOTATION = "ringseed.io/model-source"

# Node label marking a verified model copy: ``models.ringseed.io/<namespace>.<name>=verified``.
MODEL_LABEL_PREFIX = "models.ringseed.io"
MODEL_LABEL_VALUE = "verified"

# Token Secret: one key, mounted as a file in masters and agents.
TOKEN_KEY = "token"
TOKEN_DIR = "/etc/ringseed"
TOKEN_PATH = f"{TOKEN_DIR}/{TOKEN_KEY}"

# Node paths and mounts.
DEFAULT_DATA_ROOT = "/var/lib/ringseed"
RUNTIME_DIR = "/opt/ringseed"
MODEL_MOUNT_ROOT = "/models"
RUNTIME_UID = 10001

# Bounds (the CRDs state the chunk bounds too; a unit test keeps them equal).
MIN_CHUNK_SIZE = manifest.MIN_CHUNK_SIZE
MAX_CHUNK_SIZE = manifest.MAX_CHUNK_SIZE
DEFAULT_CHUNK_SIZE = manifest.DEFAULT_CHUNK_SIZE
MIN_SEEDERS = 1
MAX_SEEDERS = 64
DEFAULT_SEEDERS = 1
MAX_MIN_PEERS = 10000
MAX_HEARTBEAT_SECONDS = 300
MAX_TIMEOUT_SECONDS = 3600

# Names: children are "<name>-master", "<name>-cleanup", ...; Services need DNS-1035 labels
# (at most 63 characters), so a resource name may be at most 63 - len("-cleanup") = 55 long.
MAX_NAME_LENGTH = 55

RETAIN = "Retain"
DELETE = "Delete"
RETAIN_POLICIES = (RETAIN, DELETE)
QUANTIZATIONS = ("none", "int8", "fp16", "bf16")
SOURCE_SCHEMES = ("s3", "http", "https", "file")

# The node cache (TrainingGroup spec.checkpoints / spec.data).
CACHE_MASTER_PORT = MASTER_PORT
CACHE_AGENT_PORT = 8473
DEFAULT_CHECKPOINT_REPLICAS = 2
MAX_CHECKPOINT_REPLICAS = 8
DEFAULT_CACHE_MEMORY_BYTES = 4 << 30
DEFAULT_CACHE_CHUNK_SIZE = 32 << 20
MIN_CACHE_CHUNK_SIZE = 5 << 20  # S3's smallest multipart part: one chunk is one part
MAX_DATA_SOURCES = 16
CACHE_SHM_ROOT = "/dev/shm/ringseed"  # memory tier (tmpfs), per <namespace>/<name>
CACHE_SOCKET_ROOT = "/run/ringseed"  # the agent's Unix socket, per <namespace>/<name>
COMPONENT_CACHE = "cache"
COMPONENT_CACHE_AGENT = "cache-agent"

# Phases shown in status.phase.
MD_PHASES = ("Pending", "Downloading", "Distributing", "Complete", "Degraded", "Failed")
TG_PHASES = ("WaitingForModel", "Starting", "Running", "Degraded", "Failed")
