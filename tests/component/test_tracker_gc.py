"""The tracker's collector policy (--gc-freeze-every): survivors frozen, frozen cycles freed at the full pass."""

from __future__ import annotations

import gc
import weakref

from ringseed.master import tracker
from tests.component import served
from tests.waiting import wait_for


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_survivors_are_frozen_and_a_frozen_cycle_is_freed_at_the_full_pass() -> None:
    app = tracker.create_app(
        token="t", offline_after=3600.0, heartbeat_interval=1.0, seeders=1, gc_freeze_every=0.05, gc_full_every=1.0
    )
    with served.in_thread(app):
        held = [Cycle()]
        ref = weakref.ref(held[0])
        wait_for(lambda: not any(o is held[0] for o in gc.get_objects()), what="the survivor frozen")
        held.clear()
        gc.collect()
        assert ref() is not None  # a frozen cycle outlives a collection ...
        wait_for(lambda: ref() is None, what="the full pass")  # ... until it unfreezes and collects
    assert gc.get_freeze_count() == 0  # the policy ends with the app
