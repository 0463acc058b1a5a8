"""The ring schedule, run in memory: every rank ends with the full reduction / every block."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ringseed.protocol import ring


@pytest.mark.parametrize(("length", "world"), [(0, 3), (1, 4), (2, 5), (7, 3), (13, 4), (97, 6), (12, 4), (5, 1)])
def test_chunk_bounds_cover_the_buffer_evenly(length: int, world: int) -> None:
    bounds = ring.chunk_bounds(length, world)
    assert len(bounds) == world
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def _simulate_all_reduce(data: list[np.ndarray]) -> list[np.ndarray]:
    world = len(data)
    bufs = [d.copy() for d in data]
    bounds = ring.chunk_bounds(len(data[0]), world)
    schedules = [ring.all_reduce_steps(rank=r, world=world) for r in range(world)]
    for step_index in range(len(schedules[0])):
        # every rank sends at once; messages land at the next rank
        sent = []
        for r in range(world):
            step = schedules[r][step_index]
            start, end = bounds[step.send_chunk]
            sent.append(bufs[r][start:end].copy())
        for r in range(world):
            step = schedules[r][step_index]
            prev, _ = ring.neighbours(rank=r, world=world)
            prev_step = schedules[prev][step_index]
            assert prev_step.send_chunk == step.recv_chunk
            start, end = bounds[step.recv_chunk]
            if step.phase is ring.Phase.REDUCE_SCATTER:
                bufs[r][start:end] += sent[prev]
            else:
                bufs[r][start:end] = sent[prev]
    return bufs


@pytest.mark.parametrize(("length", "world"), [(1, 4), (3, 5), (7, 3), (13, 4), (101, 7), (64, 2), (10, 1)])
def test_all_reduce_schedule_gives_every_rank_the_sum(length: int, world: int) -> None:
    rng = np.random.default_rng(length * 31 + world)
    data = [rng.integers(-1000, 1000, size=length).astype(np.int64) for _ in range(world)]
    expected = np.sum(data, axis=0)
    for result in _simulate_all_reduce(data):
        np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_reduce_scatter_leaves_the_owned_chunk_reduced(world: int) -> None:
    length = 11
    data = [np.full(length, r + 1, dtype=np.int64) for r in range(world)]
    bufs = [d.copy() for d in data]
    bounds = ring.chunk_bounds(length, world)
    for s in range(world - 1):
        sent = [
            bufs[r][slice(*bounds[ring.reduce_scatter_steps(rank=r, world=world)[s].send_chunk])].copy()
            for r in range(world)
        ]
        for r in range(world):
            step = ring.reduce_scatter_steps(rank=r, world=world)[s]
            bufs[r][slice(*bounds[step.recv_chunk])] += sent[(r - 1) % world]
    total = sum(range(1, world + 1))
    for r in range(world):
        owned = bufs[r][slice(*bounds[ring.owned_chunk(rank=r, world=world)])]
        assert (owned == total).all()


@pytest.mark.parametrize("world", [1, 2, 4, 5])
def test_gather_steps_give_every_rank_every_block(world: int) -> None:
    blocks = [[r if b == r else None for b in range(world)] for r in range(world)]
    for s in range(world - 1):
        steps = [ring.gather_steps(rank=r, world=world)[s] for r in range(world)]
        sent = [blocks[r][steps[r].send_chunk] for r in range(world)]
        assert all(x is not None for x in sent)
        for r in range(world):
            blocks[r][steps[r].recv_chunk] = sent[(r - 1) % world]
    assert all(b == list(range(world)) for b in blocks)


def test_broadcast_roles_form_one_pipeline_from_the_root() -> None:
    roles = [ring.broadcast_role(rank=r, root=2, world=5) for r in range(5)]
    assert [r.distance for r in roles] == [3, 4, 0, 1, 2]
    assert not roles[2].receives and roles[2].forwards
    assert roles[1].receives and not roles[1].forwards
    assert sum(r.forwards for r in roles) == 4


@pytest.mark.parametrize(("rank", "world"), [(0, 0), (3, 3), (-1, 2)])
def test_bad_rank_or_world_is_rejected(rank: int, world: int) -> None:
    with pytest.raises(ValueError):
        ring.all_reduce_steps(rank=rank, world=world)
