"""Shared state: named numpy arrays every peer must hold identically, with a revision.

Owns the per-tensor hash and the container the communicator syncs
(``Communicator.sync_shared_state``). No I/O here; the transfer runs over the ring engine.

Rules of a sync (decided by the coordinator, ``protocol.membership.decide_sync``):
- Every peer sends its revision and a hash per tensor (BLAKE2b-256 over dtype, shape and the
  bytes), so equal hashes mean equal dtype, shape and bits.
- The most common hash set wins (ties: the higher revision, then the earlier ring position);
  one peer holding it is the source. Every tensor that differs on some peer is broadcast from
  the source, and each receiver checks the hash of what it got: a mismatch raises
  :class:`StateSyncError` and the caller must not train on that state.
- After a sync every peer's revision is the winning revision plus one: revisions rise by
  exactly one per sync.
- Every peer must hold the same tensor names with the same dtypes and shapes (a newcomer builds
  its model first, then syncs); otherwise every peer gets :class:`StateSyncError`.
- Arrays are updated in place and must be C-contiguous.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np


class StateSyncError(Exception):
    """The shared state could not be made identical (names differ, or a hash check failed)."""


def digest(array: np.ndarray) -> str:
    """BLAKE2b-256 hex of dtype, shape and contents."""
    h = hashlib.blake2b(digest_size=32)
    h.update(f"{array.dtype.str}|{array.shape}|".encode())
    h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


@dataclass
class SharedState:
    """Named arrays plus the revision they were last agreed at (mutable: syncs update both)."""

    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    revision: int = 0

    def hashes(self) -> dict[str, str]:
        return {name: digest(array) for name, array in sorted(self.tensors.items())}

    def flat(self, name: str) -> np.ndarray:
        """A 1-D view of tensor ``name`` (writes go to the tensor)."""
        array = self.tensors[name]
        if not array.flags.c_contiguous:
            raise StateSyncError(f"shared tensor {name!r} must be C-contiguous")
        return array.reshape(-1)
