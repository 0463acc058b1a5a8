"""Ring schedules of the collective engine: which segment goes out and comes in, in what order (pure).

What this module owns
- The segment math of every ring collective: the array is cut into ``world`` chunks
  (``chunk i = [length*i//world, length*(i+1)//world)``, so any length works, including 0 and
  lengths below ``world``) and each chunk into segments of at most ``seg_elems`` elements.
- A :class:`Plan` per rank: the frames it sends to its successor and the frames it receives
  from its predecessor, each numbered by ``seq``. For every collective, rank ``r``'s
  ``sends[k]`` is rank ``r+1``'s ``recvs[k]`` (same range, same sequence number), which is what
  lets the receiver check each header against its own expectation.

Rules
- A send may depend on one earlier receive (``after``): it goes out only once that segment has
  been received and combined, which pipelines reduce-scatter and all-gather segment by
  segment. Dependencies always point to an earlier sequence number, so the schedule cannot
  deadlock as long as each link delivers in order.
- Reduce-scatter leaves rank ``r`` owning the fully reduced chunk ``r``; each element is
  reduced by exactly one chain of peers in a fixed order and then copied, so every peer ends
  with bit-identical values.
- Empty segments are never scheduled (no zero-length frames).
- Plans are immutable, so the last ones built are cached (a training step repeats the same sizes).
"""

from __future__ import annotations

import dataclasses
import functools

MIN_SEGMENT_BYTES = 256 << 10
MAX_SEGMENT_BYTES = 4 << 20
_CACHED_PLANS = 64  # per collective: building a plan costs more than a small segment's I/O, so repeats reuse it


@dataclasses.dataclass(frozen=True)
class Recv:
    seq: int
    start: int  # element range in the destination array
    stop: int
    seg: int  # segment id (stable across steps, used for quantised storage)
    reduce: bool  # combine into the array (else copy)
    final: bool  # the last reduction of this segment (AVG divides, quantised owner encodes)


@dataclasses.dataclass(frozen=True)
class Send:
    seq: int
    start: int
    stop: int
    seg: int
    after: int | None  # index of the receive that must complete first
    stored: bool  # quantised: forward the segment's stored encoded bytes


@dataclasses.dataclass(frozen=True)
class Plan:
    sends: tuple[Send, ...]
    recvs: tuple[Recv, ...]
    segments: int  # number of distinct segment ids


def segment_elems(*, length: int, world: int, itemsize: int) -> int:
    """Segment size in elements: about a quarter of a chunk, clamped to [256 KiB, 4 MiB]."""
    chunk_bytes = max(1, length // max(world, 1)) * itemsize
    target = min(MAX_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES, chunk_bytes // 4))
    return max(1, target // itemsize)


def chunk_bounds(*, length: int, world: int) -> list[int]:
    return [length * i // world for i in range(world + 1)]


def _chunk_segments(*, start: int, stop: int, seg_elems: int, first_id: int) -> list[tuple[int, int, int]]:
    return [(a, min(a + seg_elems, stop), first_id + i) for i, a in enumerate(range(start, stop, seg_elems))]


def _split(*, bounds: list[int], seg_elems: int) -> list[list[tuple[int, int, int]]]:
    chunks: list[list[tuple[int, int, int]]] = []
    next_id = 0
    for c in range(len(bounds) - 1):
        segs = _chunk_segments(start=bounds[c], stop=bounds[c + 1], seg_elems=seg_elems, first_id=next_id)
        next_id += len(segs)
        chunks.append(segs)
    return chunks


class _Builder:
    def __init__(self) -> None:
        self.sends: list[Send] = []
        self.recvs: list[Recv] = []
        self.last_recv: dict[int, int] = {}  # segment id -> index of its latest receive

    def send(self, segs: list[tuple[int, int, int]], *, depend: bool, stored: bool = False) -> None:
        for a, b, sid in segs:
            after = self.last_recv.get(sid) if depend else None
            self.sends.append(Send(seq=len(self.sends), start=a, stop=b, seg=sid, after=after, stored=stored))

    def recv(self, segs: list[tuple[int, int, int]], *, reduce: bool, final: bool = False) -> None:
        for a, b, sid in segs:
            self.last_recv[sid] = len(self.recvs)
            self.recvs.append(Recv(seq=len(self.recvs), start=a, stop=b, seg=sid, reduce=reduce, final=final))

    def plan(self, segments: int) -> Plan:
        return Plan(sends=tuple(self.sends), recvs=tuple(self.recvs), segments=segments)


def _reduce_scatter(b: _Builder, chunks: list[list[tuple[int, int, int]]], *, rank: int) -> None:
    world = len(chunks)
    for step in range(world - 1):
        b.send(chunks[(rank - step - 1) % world], depend=step > 0)
        b.recv(chunks[(rank - step - 2) % world], reduce=True, final=step == world - 2)


def _all_gather(b: _Builder, chunks: list[list[tuple[int, int, int]]], *, rank: int, stored: bool) -> None:
    world = len(chunks)
    for step in range(world - 1):
        b.send(chunks[(rank - step) % world], depend=True, stored=stored)
        b.recv(chunks[(rank - step - 1) % world], reduce=False)


@functools.lru_cache(maxsize=_CACHED_PLANS)
def all_reduce(*, length: int, rank: int, world: int, seg_elems: int) -> Plan:
    """Reduce-scatter (rank r ends owning chunk r) then all-gather, pipelined per segment."""
    chunks = _split(bounds=chunk_bounds(length=length, world=world), seg_elems=seg_elems)
    b = _Builder()
    _reduce_scatter(b, chunks, rank=rank)
    _all_gather(b, chunks, rank=rank, stored=True)
    return b.plan(sum(len(c) for c in chunks))


@functools.lru_cache(maxsize=_CACHED_PLANS)
def reduce_scatter(*, length: int, rank: int, world: int, seg_elems: int) -> Plan:
    """Reduce-scatter only: rank r ends owning chunk r of ``length`` (= world * block)."""
    chunks = _split(bounds=chunk_bounds(length=length, world=world), seg_elems=seg_elems)
    b = _Builder()
    _reduce_scatter(b, chunks, rank=rank)
    return b.plan(sum(len(c) for c in chunks))


@functools.lru_cache(maxsize=_CACHED_PLANS)
def all_gather(*, block: int, rank: int, world: int, seg_elems: int) -> Plan:
    """All-gather into an array of ``world * block``; rank r contributes block r."""
    chunks = _split(bounds=[block * i for i in range(world + 1)], seg_elems=seg_elems)
    b = _Builder()
    _all_gather(b, chunks, rank=rank, stored=False)
    return b.plan(sum(len(c) for c in chunks))


@functools.lru_cache(maxsize=_CACHED_PLANS)
def broadcast(*, length: int, rank: int, world: int, root: int, seg_elems: int) -> Plan:
    """Pipelined chain root -> root+1 -> ... -> root-1; each peer forwards what it received."""
    segs = _split(bounds=[0, length], seg_elems=seg_elems)[0]
    distance = (rank - root) % world
    b = _Builder()
    if distance > 0:
        b.recv(segs, reduce=False)
    if distance < world - 1:
        b.send(segs, depend=distance > 0)
    return b.plan(len(segs))
