"""When the operator calls the Kubernetes API again after a failed call, and how long it waits.

Owns the retry policy of ``kube.Client``. Pure: no I/O and no clock (``now`` and the random
source are arguments), so the decisions are tested without a server. Rules:
- Retried: 429 (the API server's priority and fairness, or a webhook, sheds load), 500, 502, 503
  and 504 (a restarting or overloaded server, an aggregated API that is away), and a lost or
  refused connection or a timeout (``status=None``). Every other answer is final.
- The server's ``Retry-After`` (delta seconds, or an HTTP date) is honoured, capped at
  ``max_delay``; without one the delay is exponential from ``base_delay`` with full jitter,
  capped at ``max_delay``.
- At most ``attempts`` tries in all; after that the caller gives up (and kopf retries the handler).
"""

from __future__ import annotations

import email.utils
import random
from dataclasses import dataclass

RETRYABLE = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Backoff:
    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 10.0

    def delay(
        self, *, attempt: int, status: int | None, retry_after: str | None, now: float, rng: random.Random
    ) -> float | None:
        """Seconds to wait before the next try, after try ``attempt`` (from 1) failed with ``status``
        (None: no answer); None when that failure is final or the tries are used up."""
        if attempt >= self.attempts or (status is not None and status not in RETRYABLE):
            return None
        asked = parse_retry_after(retry_after, now=now)
        if asked is not None:
            return min(asked, self.max_delay)
        return rng.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds asked for by a ``Retry-After`` header (RFC 9110: delta seconds or an HTTP date
    relative to ``now``, seconds since the epoch); None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        return None
    return max(0.0, when.timestamp() - now)
