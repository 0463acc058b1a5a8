"""Byte sizes as users write them in flags and specs."""

from __future__ import annotations

import pytest

from ringseed.protocol import units


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64Mi", 64 << 20),
        ("1Gi", 1 << 30),
        ("1048576", 1 << 20),
        ("64MiB", 64 << 20),
        ("500M", 500_000_000),
        ("500MB", 500_000_000),
        ("1.5Ki", 1536),
        ("2k", 2000),
        (" 3 Gi ", 3 << 30),
        (4096, 4096),
    ],
)
def test_parse_size_accepts_binary_decimal_and_plain_sizes(text: str | int, expected: int) -> None:
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "Mi", "-1", "1.3", "0.1Ki", "64Xi", "1e6", "ten", "64iB"])
def test_parse_size_rejects_what_is_not_a_whole_size(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        units.parse_size(text)


def test_format_size_uses_binary_units() -> None:
    assert units.format_size(512) == "512 B"
    assert units.format_size(64 << 20) == "64.0 MiB"
    assert units.format_size(3 << 40) == "3.0 TiB"
