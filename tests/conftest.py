"""Shared test settings."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def ringseed_cmd() -> list[str]:
    """The command line that runs the installed ``ringseed`` CLI in a child process."""
    return [sys.executable, "-m", "ringseed.cli"]


def is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 5 MiB tmpfs (root only), a file system that fills up; unmounted afterwards."""
    if not is_root():
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
