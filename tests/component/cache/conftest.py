"""Fixtures of the cache component tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.component.cache.cluster import Cluster
from tests.component.origins import servers


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    made = Cluster(root=tmp_path)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with servers.moto_s3() as endpoint:
        yield endpoint


@pytest.fixture
def s3_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = servers.s3_env(moto_endpoint)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    servers.put_objects(moto_endpoint, "ckpt", {})
    return env
