"""The tracker's collector policy (--gc-freeze-every): survivors frozen, frozen cycles freed at the full pass."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable

from ringseed.master import tracker
from tests.component import served


class Cycle:
    def __init__(self) -> None:
        self.me = self


def wait_for(condition: Callable[[], bool], *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_survivors_are_frozen_and_a_frozen_cycle_is_freed_at_the_full_pass() -> None:
    app = tracker.create_app(
        token="t", offline_after=3600.0, heartbeat_interval=1.0, seeders=1, gc_freeze_every=0.05, gc_full_every=1.0
    )
    with served.in_thread(app):
        held = [Cycle()]
        ref = weakref.ref(held[0])
        wait_for(lambda: not any(o is held[0] for o in gc.get_objects()))  # frozen: out of the generations
        held.clear()
        gc.collect()
        assert ref() is not None  # a frozen cycle outlives a collection ...
        wait_for(lambda: ref() is None)  # ... until the full pass unfreezes and collects
    assert gc.get_freeze_count() == 0  # the policy ends with the app
