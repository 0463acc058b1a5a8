"""Command-line value types: a bad value is an argparse error naming it, never a traceback."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ringseed import cmdline


@pytest.mark.parametrize(
    ("kind", "text", "problem"),
    [
        (cmdline.positive_int, "0", "'0' must be at least 1"),
        (cmdline.positive_int, "-1", "'-1' must be at least 1"),
        (cmdline.positive_int, "two", "'two' is not a whole number"),
        (cmdline.size, "1x", "size '1x': expected a number"),
        (cmdline.positive_size, "fast", "size 'fast': expected a number"),
        (cmdline.positive_size, "0", "'0' must be more than 0 bytes"),
        (cmdline.chunk_size, "1x", "size '1x': expected a number"),
        (cmdline.chunk_size, "4Gi", "outside the allowed range"),
        (cmdline.positive_seconds, "soon", "'soon' is not a number of seconds"),
        (cmdline.positive_seconds, "nan", "'nan' must be a finite number of seconds above 0"),
        (cmdline.positive_seconds, "-3", "'-3' must be a finite number"),
        (cmdline.port, "70000", "'70000' is not a TCP port"),
        (cmdline.non_negative_int, "-2", "'-2' must not be negative"),
    ],
)
def test_bad_values_are_argument_errors_naming_the_value(kind, text: str, problem: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(argparse.ArgumentTypeError, match=problem.replace("(", r"\(")):
        kind(text)


def test_good_values() -> None:
    assert cmdline.size("64Mi") == 64 << 20
    assert cmdline.positive_size("32Mi") == 32 << 20
    assert cmdline.chunk_size("4Mi") == 4 << 20
    assert cmdline.positive_int("8") == 8
    assert cmdline.positive_seconds("0.5") == 0.5
    assert cmdline.port("0") == 0


def test_token_file_wins_over_the_environment_and_a_missing_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RINGSEED_TOKEN", "from-env")
    assert cmdline.read_token(None) == "from-env"
    (tmp_path / "token").write_text("from-file\n")
    assert cmdline.read_token(str(tmp_path / "token")) == "from-file"
    with pytest.raises(ValueError, match=r"--token-file .*/absent: No such file or directory"):
        cmdline.read_token(str(tmp_path / "absent"))
