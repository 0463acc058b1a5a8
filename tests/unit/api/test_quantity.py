"""Byte counts written as Kubernetes quantities in CR fields."""

from __future__ import annotations

import pytest

from ringseed.api import quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (67108864, 64 << 20),
        ("67108864", 64 << 20),
        ("64Mi", 64 << 20),
        ("1Gi", 1 << 30),
        ("1.5Gi", 3 << 29),
        ("500M", 500_000_000),
        ("2k", 2000),
        ("1e9", 10**9),
        ("+4Ki", 4096),
        ("1500m", None),
        ("2000m", 2),
    ],
)
def test_quantities_become_whole_bytes(text: int | str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="whole number"):
            quantity.parse_bytes(text)
    else:
        assert quantity.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "64MB", "64 Mi", "-1", -5, "Mi", "1.2.3", True, 1.5, None])
def test_non_quantities_are_refused(text: object) -> None:
    with pytest.raises(ValueError):
        quantity.parse_bytes(text)
