"""The node's current problems, by reason: what the heartbeat reports as ``problem``.

Owns the reasons an agent may report (docs/contracts.md, "Per-node problem and revision") and
which one is shown when several hold at once. No I/O beyond a log line when a problem starts
or ends.

Rules:
- A problem is ``(reason, message)``: a CamelCase reason a user can search for, and one
  sentence naming what is wrong and what was tried. Setting a reason again updates its message.
- The heartbeat carries the most severe current problem (:data:`SEVERITY`: a node that cannot
  write comes before one whose source changed) or null.
- Whoever set a problem clears it when the condition is gone (space returned, a pull worked).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

DISK_FULL = "DiskFull"  # staging cannot take more bytes (ENOSPC or --ssd-bytes); fetching paused
WRITE_FAILED = "WriteFailed"  # a write to staging failed with another error (EIO, EROFS, ...)
CORRUPT_AT_REST = "CorruptAtRest"  # bytes on disk no longer match their hash; being repaired
DIGEST_MISMATCH = "DigestMismatch"  # the model's digest is not the expected one; not published
SOURCE_CHANGED = "SourceChanged"  # the source no longer matches the published manifest
BAD_SOURCE = "BadSource"  # the source cannot make a model (bad names, empty, bad manifest)
ORIGIN_ERROR = "OriginError"  # the origin keeps failing (after bounded retries)
PEER_UNREACHABLE = "PeerUnreachable"  # chunks are listed only on peers this node cannot reach

SEVERITY = (
    DISK_FULL,
    WRITE_FAILED,
    CORRUPT_AT_REST,
    DIGEST_MISMATCH,
    SOURCE_CHANGED,
    BAD_SOURCE,
    ORIGIN_ERROR,
    PEER_UNREACHABLE,
)


class Problems:
    """Current problems by reason."""

    def __init__(self) -> None:
        self._by_reason: dict[str, str] = {}

    def set(self, reason: str, message: str) -> None:
        if self._by_reason.get(reason) != message:
            log.warning("%s: %s", reason, message)
        self._by_reason[reason] = message

    def clear(self, reason: str) -> None:
        if self._by_reason.pop(reason, None) is not None:
            log.info("%s resolved", reason)

    def active(self, reason: str) -> bool:
        return reason in self._by_reason

    def current(self) -> dict[str, str] | None:
        """``{"reason", "message"}`` of the most severe problem, or None."""
        if not self._by_reason:
            return None
        rank = {reason: i for i, reason in enumerate(SEVERITY)}
        reason = min(self._by_reason, key=lambda r: (rank.get(r, len(SEVERITY)), r))
        return {"reason": reason, "message": self._by_reason[reason]}

    def all(self) -> dict[str, str]:
        return dict(self._by_reason)
