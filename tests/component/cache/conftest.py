"""Fixtures of the cache component tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.component.cache.cluster import Cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    made = Cluster(root=tmp_path)
    try:
        yield made
    finally:
        await made.close()
