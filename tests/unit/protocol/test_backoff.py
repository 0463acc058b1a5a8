"""Bounded back-off with a fake clock and a seeded RNG."""

from __future__ import annotations

import random

from ringseed.protocol import backoff


def test_delay_doubles_up_to_the_cap_with_jitter_and_honours_retry_after() -> None:
    rng = random.Random(7)
    waits = [backoff.delay(n, base=0.1, cap=2.0, rng=rng) for n in range(1, 10)]
    for n, wait in enumerate(waits, start=1):
        full = min(2.0, 0.1 * 2 ** (n - 1))
        assert full * 0.5 <= wait <= full
    assert backoff.delay(10_000, base=0.1, cap=2.0, rng=rng) <= 2.0  # no overflow for huge counts
    assert backoff.delay(1, base=0.1, cap=2.0, rng=rng, retry_after=1.5) == 1.5
    assert backoff.delay(1, base=0.1, cap=2.0, rng=rng, retry_after=60) == 2.0


def test_backoff_per_key_waits_forgets_on_success_and_resets_when_a_copy_appears() -> None:
    b: backoff.Backoff[int] = backoff.Backoff(base=1.0, cap=8.0, rng=random.Random(1))
    now = 100.0
    assert b.ready(3, now=now) and b.failures(3) == 0
    wait = b.failed(3, now=now)
    assert 0.5 <= wait <= 1.0 and not b.ready(3, now=now) and b.ready(3, now=now + wait)
    assert b.ready(4, now=now)  # other keys are not held back
    second = b.failed(3, now=now + wait)
    assert 1.0 <= second <= 2.0 and b.failures(3) == 2 and len(b) == 1
    b.reset(3)
    assert b.ready(3, now=now + wait) and b.failures(3) == 2  # tried at once, but the count stays
    b.succeeded(3)
    assert b.failures(3) == 0 and len(b) == 0
