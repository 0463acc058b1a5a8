"""Byte sizes: one grammar for flags, custom-resource fields and the operator's environment."""

from __future__ import annotations

import pytest

from ringseed.protocol import units

QUANTITY, FLAG = units.Syntax.QUANTITY, units.Syntax.FLAG


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("67108864", 64 << 20),
        ("64Mi", 64 << 20),
        ("1Gi", 1 << 30),
        ("1.5Gi", 3 << 29),
        ("1.5Ki", 1536),
        ("500M", 500_000_000),
        ("2k", 2000),
        ("1e9", 10**9),
        ("1E3", 1000),
        ("2E", 2 * 10**18),
        ("+4Ki", 4096),
        (".5Ki", 512),
    ],
)
@pytest.mark.parametrize("syntax", [QUANTITY, FLAG])
def test_the_quantity_grammar_holds_in_both_syntaxes(text: str | int, expected: int, syntax: units.Syntax) -> None:
    assert units.parse_size(text, syntax=syntax) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("64MiB", 64 << 20), ("500MB", 500_000_000), ("1K", 1000), ("1KiB", 1024), (" 3 Gi ", 3 << 30), ("5B", 5)],
)
def test_flags_also_take_a_trailing_b_upper_k_and_blanks(text: str, expected: int) -> None:
    assert units.parse_size(text, syntax=FLAG) == expected
    with pytest.raises(ValueError, match="expected a number with an optional suffix like 64Mi, 1Gi"):
        units.parse_size(text, syntax=QUANTITY)


@pytest.mark.parametrize("syntax", [QUANTITY, FLAG])
@pytest.mark.parametrize("text", ["500m", "500mi", "2000m", "1.5m"])
def test_m_is_refused_in_every_syntax_with_both_readings_named(text: str, syntax: units.Syntax) -> None:
    number = text.rstrip("mi")
    with pytest.raises(ValueError, match=f"'m' is ambiguous.*write {number}M .* {number}Mi"):
        units.parse_size(text, syntax=syntax)


@pytest.mark.parametrize("syntax", [QUANTITY, FLAG])
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "expected a number"),
        ("Mi", "expected a number"),
        ("-1", "expected a number"),
        (-5, "between 0 and"),
        ("1.3", "not a whole number"),
        ("0.1Ki", "not a whole number"),
        ("64Xi", "expected a number"),
        ("1g", "expected a number"),
        ("ten", "expected a number"),
        ("64iB", "expected a number"),
        ("1.2.3", "expected a number"),
        ("1e999999999", "larger than"),
        ("9Ei", "larger than"),
        (True, "not a number of bytes"),
        (1.5, "not a number of bytes"),
        (None, "not a number of bytes"),
    ],
)
def test_what_is_not_a_whole_size_is_refused_naming_the_text(text: object, problem: str, syntax: units.Syntax) -> None:
    with pytest.raises(ValueError, match=problem) as info:
        units.parse_size(text, syntax=syntax)
    assert str(info.value).startswith(f"size {text!r}: ")


def test_format_size_uses_binary_units() -> None:
    assert units.format_size(512) == "512 B"
    assert units.format_size(64 << 20) == "64.0 MiB"
    assert units.format_size(3 << 40) == "3.0 TiB"
