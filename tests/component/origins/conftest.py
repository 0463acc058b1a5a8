"""Fixtures for origin tests (and for anyone who needs an origin server on loopback).

- ``moto_endpoint`` (session): a moto S3 server's ``http://127.0.0.1:PORT``.
- ``s3_env``: the process environment pointed at that server (restored afterwards); returns the dict.
- ``s3_bucket``: a fresh, empty bucket name on that server.
- ``http_root`` / ``flaky_http``: a directory and a started :class:`servers.FlakyHTTPOrigin` over it
  (add files to ``http_root`` and faults with ``flaky_http.add_faults(...)``).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.component.origins import servers

_buckets = itertools.count()


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
    return env


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    name = f"ringseed-test-{next(_buckets)}"
    servers.put_objects(moto_endpoint, name, {})
    return name


@pytest.fixture
def http_root(tmp_path: Path) -> Path:
    root = tmp_path / "http-root"
    root.mkdir()
    return root


@pytest.fixture
async def flaky_http(http_root: Path) -> AsyncIterator[servers.FlakyHTTPOrigin]:
    async with servers.FlakyHTTPOrigin(http_root) as server:
        yield server
