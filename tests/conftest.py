"""Shared test settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def ringseed_cmd() -> list[str]:
    """The command line that runs the installed ``ringseed`` CLI in a child process."""
    return [sys.executable, "-m", "ringseed.cli"]


def is_root() -> bool:
    return os.geteuid() == 0
