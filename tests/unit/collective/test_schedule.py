"""Ring schedules: what a rank sends is exactly what its successor expects; every element covered."""

from __future__ import annotations

import pytest

from ringseed.collective import schedule


def plans(kind: str, *, n: int, length: int, seg: int) -> list[schedule.Plan]:
    if kind == "all_reduce":
        return [schedule.all_reduce(length=length, rank=r, world=n, seg_elems=seg) for r in range(n)]
    if kind == "all_gather":
        return [schedule.all_gather(block=length, rank=r, world=n, seg_elems=seg) for r in range(n)]
    return [schedule.broadcast(length=length, rank=r, world=n, root=n - 1, seg_elems=seg) for r in range(n)]


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "broadcast"])
@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("length", [0, 1, 4, 13, 1000])
def test_sends_match_successor_receives_and_depend_backwards(kind: str, n: int, length: int) -> None:
    ps = plans(kind, n=n, length=length, seg=3)
    for r in range(n):
        mine, succ = ps[r], ps[(r + 1) % n]
        assert [(s.seq, s.start, s.stop) for s in mine.sends] == [(v.seq, v.start, v.stop) for v in succ.recvs]
        for s in mine.sends:
            assert s.stop > s.start
            if s.after is not None:
                assert mine.recvs[s.after].seg == s.seg


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_reduce_owner_finishes_its_chunk_and_everyone_else_copies_it(n: int) -> None:
    length = 17
    for r, plan in enumerate(plans("all_reduce", n=n, length=length, seg=2)):
        reduced = [0] * length
        copied = [0] * length
        for v in plan.recvs:
            for i in range(v.start, v.stop):
                (reduced if v.reduce else copied)[i] += 1
        bounds = schedule.chunk_bounds(length=length, world=n)
        for i in range(length):
            owned = bounds[r] <= i < bounds[r + 1]
            assert (reduced[i], copied[i]) == ((1, 0) if owned else (reduced[i], 1))
        assert sum(v.stop - v.start for v in plan.recvs if v.final) == bounds[r + 1] - bounds[r]


def test_segment_size_is_clamped() -> None:
    assert schedule.segment_elems(length=1 << 30, world=2, itemsize=4) * 4 == schedule.MAX_SEGMENT_BYTES
    assert schedule.segment_elems(length=10, world=2, itemsize=4) * 4 == schedule.MIN_SEGMENT_BYTES
