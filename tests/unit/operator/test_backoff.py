"""The Kubernetes client's retry policy: which failures are retried, and after how long."""

from __future__ import annotations

import email.utils
import random

import pytest

from ringseed.operator import backoff

NOW = 1_700_000_000.0
POLICY = backoff.Backoff(attempts=4, base_delay=0.5, max_delay=3.0)


class Highest(random.Random):
    """A random source whose uniform(a, b) is always b: the top of the jitter range."""

    def uniform(self, a: float, b: float) -> float:
        return b


def delay(*, attempt: int = 1, status: int | None = 503, retry_after: str | None = None) -> float | None:
    return POLICY.delay(attempt=attempt, status=status, retry_after=retry_after, now=NOW, rng=Highest())


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, None])
def test_overload_server_errors_and_lost_connections_are_retried(status: int | None) -> None:
    assert delay(status=status) == 0.5


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422, 501])
def test_other_answers_are_final(status: int) -> None:
    assert delay(status=status) is None


def test_without_retry_after_the_delay_doubles_up_to_the_cap_with_full_jitter() -> None:
    assert [delay(attempt=a) for a in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert (
        backoff.Backoff(attempts=9, base_delay=0.5, max_delay=3.0).delay(
            attempt=6, status=503, retry_after=None, now=NOW, rng=Highest()
        )
        == 3.0
    )
    jittered = [
        POLICY.delay(attempt=3, status=503, retry_after=None, now=NOW, rng=random.Random(seed)) for seed in range(50)
    ]
    assert all(d is not None and 0 <= d <= 2.0 for d in jittered) and len(set(jittered)) > 1


def test_tries_are_bounded() -> None:
    assert delay(attempt=3) is not None
    assert delay(attempt=4) is None  # the fourth try was the last


def test_retry_after_in_seconds_is_honoured_and_capped() -> None:
    assert delay(status=429, retry_after="2") == 2.0
    assert delay(status=429, retry_after="0") == 0.0
    assert delay(status=429, retry_after="120") == 3.0


def test_retry_after_as_an_http_date_counts_from_now() -> None:
    assert delay(status=503, retry_after=email.utils.formatdate(NOW + 2, usegmt=True)) == 2.0
    assert delay(status=503, retry_after=email.utils.formatdate(NOW - 60, usegmt=True)) == 0.0


@pytest.mark.parametrize("header", ["", "soon", "-1", "1.5", "Mon, 99 Foo 2020"])
def test_an_unreadable_retry_after_falls_back_to_the_exponential_delay(header: str) -> None:
    assert delay(status=429, retry_after=header) == 0.5
