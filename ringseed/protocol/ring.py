"""The ring schedule: how a buffer is cut into chunks and which chunk moves at each step.

Owns the chunk bounds for a buffer of any length split over ``world`` ranks, and the step list
of a ring all-reduce (reduce-scatter then all-gather), a ring all-gather and a ring broadcast.
Pure: no I/O, no clock. The data plane turns the steps into frames on sockets.

Rules:
- Chunk ``i`` of ``length`` elements over ``world`` ranks is ``[start, end)``; the first
  ``length % world`` chunks hold one element more than the others. With fewer elements than
  ranks some chunks are empty (``start == end``); a step on an empty chunk still happens (it
  carries zero bytes) so every rank runs the same number of steps.
- Rank ``r`` sends to ``(r + 1) % world`` and receives from ``(r - 1) % world``.
- Reduce-scatter step ``s`` (``0 <= s < world - 1``): rank ``r`` sends chunk ``(r - s) % world``
  and receives chunk ``(r - s - 1) % world``, which it reduces into its own copy. After it, rank
  ``r`` holds the full reduction of chunk ``(r + 1) % world`` (:func:`owned_chunk`).
- All-gather step ``s``: rank ``r`` sends chunk ``(r + 1 - s) % world`` and receives chunk
  ``(r - s) % world``, which it copies over its own. After it every rank holds every chunk.
- Broadcast is a pipeline from ``root`` along the ring: ranks at ring distance ``d`` from the
  root receive from ``d - 1`` and (except the last) forward; see :func:`broadcast_role`.
- A world of one has no steps: the buffer already is the result.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"


@dataclass(frozen=True)
class Step:
    """One ring step of one rank: send ``send_chunk`` to the next rank, receive ``recv_chunk``."""

    phase: Phase
    index: int
    send_chunk: int
    recv_chunk: int


@dataclass(frozen=True)
class BroadcastRole:
    """Where a rank sits in a broadcast pipeline: receive first? forward after?"""

    receives: bool
    forwards: bool
    distance: int


def _check(*, rank: int, world: int) -> None:
    if world < 1:
        raise ValueError(f"world size must be at least 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")


def chunk_bounds(length: int, world: int) -> list[tuple[int, int]]:
    """``[start, end)`` of every chunk; lengths differ by at most one, larger ones first."""
    if length < 0:
        raise ValueError(f"length must not be negative, got {length}")
    if world < 1:
        raise ValueError(f"world size must be at least 1, got {world}")
    base, extra = divmod(length, world)
    bounds: list[tuple[int, int]] = []
    start = 0
    for i in range(world):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def neighbours(*, rank: int, world: int) -> tuple[int, int]:
    """``(previous, next)`` rank on the ring."""
    _check(rank=rank, world=world)
    return (rank - 1) % world, (rank + 1) % world


def reduce_scatter_steps(*, rank: int, world: int) -> list[Step]:
    _check(rank=rank, world=world)
    return [Step(Phase.REDUCE_SCATTER, s, (rank - s) % world, (rank - s - 1) % world) for s in range(world - 1)]


def all_gather_steps(*, rank: int, world: int) -> list[Step]:
    """All-gather steps that start from :func:`owned_chunk` (the end of reduce-scatter)."""
    _check(rank=rank, world=world)
    return [Step(Phase.ALL_GATHER, s, (rank + 1 - s) % world, (rank - s) % world) for s in range(world - 1)]


def all_reduce_steps(*, rank: int, world: int) -> list[Step]:
    return reduce_scatter_steps(rank=rank, world=world) + all_gather_steps(rank=rank, world=world)


def owned_chunk(*, rank: int, world: int) -> int:
    """The chunk rank ``rank`` holds fully reduced after reduce-scatter."""
    _check(rank=rank, world=world)
    return (rank + 1) % world


def gather_steps(*, rank: int, world: int) -> list[Step]:
    """All-gather of per-rank blocks (block ``r`` starts at rank ``r``): step ``s`` moves block
    ``(r - s) % world`` to the next rank and receives block ``(r - s - 1) % world``."""
    _check(rank=rank, world=world)
    return [Step(Phase.ALL_GATHER, s, (rank - s) % world, (rank - s - 1) % world) for s in range(world - 1)]


def broadcast_role(*, rank: int, root: int, world: int) -> BroadcastRole:
    _check(rank=rank, world=world)
    _check(rank=root, world=world)
    distance = (rank - root) % world
    return BroadcastRole(receives=distance > 0, forwards=distance < world - 1, distance=distance)
