"""The chunk buffer pool: a buffer is handed out again only once nothing refers to it."""

from __future__ import annotations

import gc
import random
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from ringseed.agent import buffers

MiB = 1 << 20


def test_a_buffer_comes_back_only_when_its_last_view_is_gone() -> None:
    pool = buffers.Pool(capacity=MiB, limit=2)
    first = pool.take(MiB)
    first[:4] = b"keep"
    tail = first[MiB - 10 :]  # a slice keeps the whole buffer in use
    del first
    second = pool.take(MiB)
    second[:4] = b"next"
    assert pool.reused == 0 and len(pool) == 2
    del tail
    third = pool.take(100)
    assert pool.reused == 1 and len(third) == 100
    assert bytes(second[:4]) == b"next"  # the buffer still in use was not handed out


def test_a_view_held_by_another_thread_keeps_its_buffer() -> None:
    pool = buffers.Pool(capacity=MiB, limit=1)
    view = pool.take(MiB)
    release = threading.Event()
    worker = threading.Thread(target=lambda v: release.wait(), args=(view,))
    worker.start()
    del view
    other = pool.take(MiB)  # the only pooled map is the worker's: this one is a one-off
    assert pool.reused == 0 and pool.one_off == 1
    release.set()
    worker.join()
    del other
    pool.take(MiB)
    assert pool.reused == 1


def test_beyond_the_limit_or_the_capacity_buffers_are_one_off_and_trim_unmaps_free_ones() -> None:
    pool = buffers.Pool(capacity=MiB, limit=2)
    views = [pool.take(MiB) for _ in range(3)]
    large = pool.take(2 * MiB)
    assert len(pool) == 2 and pool.one_off == 2 and len(large) == 2 * MiB
    views[2][:] = b"x" * MiB  # a one-off buffer is as usable as a pooled one
    assert pool.free() == 0
    del views
    gc.collect()
    assert pool.free() == 2
    pool.trim(keep=1)
    assert len(pool) == 1 and pool.free() == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(min_value=1, max_value=4096)), min_size=1, max_size=60))
def test_live_buffers_never_share_memory(steps: list[tuple[bool, int]]) -> None:
    """Whatever the order of takes and drops, every live view keeps the bytes written into it."""
    pool = buffers.Pool(capacity=4096, limit=3)
    live: list[tuple[memoryview, int]] = []
    rng = random.Random(len(steps))
    for take, length in steps:
        if take or not live:
            view = pool.take(length)
            mark = rng.randrange(256)
            view[:] = bytes([mark]) * length
            live.append((view, mark))
        else:
            live.pop(rng.randrange(len(live)))
        for view, mark in live:
            assert view[0] == mark and view[len(view) - 1] == mark
