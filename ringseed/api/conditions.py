"""Status condition types, reasons and phases of ringseed's custom resources.

Owns the names a user reads in ``kubectl describe`` and searches for, and the pure helper that
merges one condition into a list the Kubernetes way. No I/O, no clock: time is an argument.

Rules: condition types are CamelCase nouns/adjectives (Ready, Progressing, Degraded,
InvalidSpec, WaitingForModel); reasons are CamelCase and stable; ``lastTransitionTime``
changes only when a condition's status changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

# Condition types.
READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
INVALID_SPEC = "InvalidSpec"
WAITING_FOR_MODEL = "WaitingForModel"

TRUE = "True"
FALSE = "False"
UNKNOWN = "Unknown"

# Reasons (stable; users search for them).
REASON_SPEC_VALID = "SpecValid"
REASON_SPEC_INVALID = "SpecInvalid"
REASON_CHILDREN_CREATED = "ChildrenCreated"
REASON_MASTER_UNREACHABLE = "MasterUnreachable"
REASON_DOWNLOADING = "Downloading"
REASON_DISTRIBUTING = "Distributing"
REASON_COMPLETE = "DistributionComplete"
REASON_NODES_FAILED = "NodesFailed"  # wanted nodes offline
REASON_NODES_STUCK = "NodesStuck"  # wanted nodes held up by a reason (DiskFull, ...) for degraded_after
REASON_NO_NODES = "NoNodesSelected"
REASON_MODEL_NOT_FOUND = "ModelNotFound"
REASON_MODEL_NOT_READY = "ModelNotReady"
REASON_MODEL_READY = "ModelReady"
REASON_PEERS_BELOW_MINIMUM = "PeersBelowMinimum"
REASON_PEERS_READY = "PeersReady"
REASON_STARTING = "Starting"

# Phases (status.phase); the CRDs list the same enums.
MD_PENDING = "Pending"
MD_DOWNLOADING = "Downloading"
MD_DISTRIBUTING = "Distributing"
MD_COMPLETE = "Complete"
MD_DEGRADED = "Degraded"
MD_FAILED = "Failed"
TG_WAITING_FOR_MODEL = "WaitingForModel"
TG_STARTING = "Starting"
TG_RUNNING = "Running"
TG_DEGRADED = "Degraded"
TG_FAILED = "Failed"


class Condition(TypedDict):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    observedGeneration: int


def make(*, type: str, status: str, reason: str, message: str, now: str, generation: int) -> Condition:
    """One condition; ``now`` is an RFC 3339 time such as ``2025-01-01T00:00:00Z``."""
    return Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        lastTransitionTime=now,
        observedGeneration=generation,
    )


def merge(existing: Sequence[Mapping[str, Any]], new: Condition) -> list[dict[str, Any]]:
    """``existing`` with ``new`` put in place of its type, keeping the old transition time if status is unchanged."""
    result: list[dict[str, Any]] = []
    replaced = False
    for item in existing:
        if item.get("type") != new["type"]:
            result.append(dict(item))
            continue
        merged: dict[str, Any] = dict(new)
        if item.get("status") == new["status"] and item.get("lastTransitionTime"):
            merged["lastTransitionTime"] = item["lastTransitionTime"]
        result.append(merged)
        replaced = True
    if not replaced:
        result.append(dict(new))
    return result
