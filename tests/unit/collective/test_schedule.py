"""Ring schedules: what a rank sends is exactly what its successor expects, every element is covered,
and the plans executed in memory leave every rank with the right values."""

from __future__ import annotations

import numpy as np
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


# ----- the plans, executed in memory: every rank ends with the right values -----------------------


def execute(ps: list[schedule.Plan], data: list[np.ndarray]) -> list[np.ndarray]:
    """Deliver every rank's sends, in order, to its successor's receives (SUM reductions), honouring
    each send's dependency; fails if the plans deadlock or a send does not match the receive."""
    n = len(ps)
    bufs = [d.copy() for d in data]
    sent, received = [0] * n, [0] * n
    inbox: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    while any(sent[r] < len(ps[r].sends) or received[r] < len(ps[r].recvs) for r in range(n)):
        progress = False
        for r in range(n):
            if sent[r] < len(ps[r].sends):
                item = ps[r].sends[sent[r]]
                if item.after is None or item.after < received[r]:
                    inbox[(r + 1) % n].append((item.seq, bufs[r][item.start : item.stop].copy()))
                    sent[r], progress = sent[r] + 1, True
            if inbox[r]:
                seq, payload = inbox[r].pop(0)
                want = ps[r].recvs[received[r]]
                assert seq == want.seq and len(payload) == want.stop - want.start
                if want.reduce:
                    bufs[r][want.start : want.stop] += payload
                else:
                    bufs[r][want.start : want.stop] = payload
                received[r], progress = received[r] + 1, True
        assert progress, "the plans deadlock"
    return bufs


@pytest.mark.parametrize(("length", "n"), [(1, 4), (3, 5), (7, 3), (13, 4), (101, 7), (64, 2)])
@pytest.mark.parametrize("seg", [1, 3, 1000])
def test_all_reduce_gives_every_rank_the_sum(length: int, n: int, seg: int) -> None:
    rng = np.random.default_rng(length * 31 + n)
    data = [rng.integers(-1000, 1000, size=length).astype(np.int64) for _ in range(n)]
    ps = [schedule.all_reduce(length=length, rank=r, world=n, seg_elems=seg) for r in range(n)]
    for result in execute(ps, data):
        np.testing.assert_array_equal(result, np.sum(data, axis=0))


@pytest.mark.parametrize("n", [2, 3, 5])
def test_reduce_scatter_leaves_each_rank_its_chunk_reduced(n: int) -> None:
    length = 11 * n
    data = [np.full(length, r + 1, dtype=np.int64) for r in range(n)]
    ps = [schedule.reduce_scatter(length=length, rank=r, world=n, seg_elems=4) for r in range(n)]
    bounds = schedule.chunk_bounds(length=length, world=n)
    for r, result in enumerate(execute(ps, data)):
        assert (result[bounds[r] : bounds[r + 1]] == sum(range(1, n + 1))).all()


@pytest.mark.parametrize("n", [2, 4, 5])
def test_all_gather_gives_every_rank_every_block(n: int) -> None:
    block = 6
    data = []
    for r in range(n):
        own = np.full(n * block, -1, dtype=np.int64)
        own[r * block : (r + 1) * block] = r
        data.append(own)
    ps = [schedule.all_gather(block=block, rank=r, world=n, seg_elems=4) for r in range(n)]
    for result in execute(ps, data):
        np.testing.assert_array_equal(result, np.repeat(np.arange(n), block))


@pytest.mark.parametrize(("n", "root"), [(2, 0), (5, 2), (4, 3)])
def test_broadcast_delivers_the_roots_buffer_to_every_rank(n: int, root: int) -> None:
    data = [np.full(10, r, dtype=np.int64) for r in range(n)]
    ps = [schedule.broadcast(length=10, rank=r, world=n, root=root, seg_elems=3) for r in range(n)]
    for result in execute(ps, data):
        np.testing.assert_array_equal(result, np.full(10, root))


def test_a_world_of_one_has_nothing_to_send() -> None:
    plan = schedule.all_reduce(length=10, rank=0, world=1, seg_elems=4)
    assert plan.sends == () and plan.recvs == ()
