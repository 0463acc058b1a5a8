"""Conditions merge the Kubernetes way: one per type, transition time kept while status holds."""

from __future__ import annotations

from ringseed.api import conditions


def test_merge_keeps_transition_time_while_status_is_unchanged() -> None:
    first = conditions.make(type="Ready", status="False", reason="Downloading", message="a", now="T1", generation=1)
    other = conditions.make(type="Degraded", status="False", reason="Ok", message="", now="T1", generation=1)
    current = conditions.merge([other], first)
    same = conditions.make(type="Ready", status="False", reason="Distributing", message="b", now="T2", generation=2)
    current = conditions.merge(current, same)
    assert current == [dict(other), {**same, "lastTransitionTime": "T1"}]
    flipped = conditions.make(
        type="Ready", status="True", reason="DistributionComplete", message="c", now="T3", generation=2
    )
    assert conditions.merge(current, flipped) == [dict(other), dict(flipped)]
