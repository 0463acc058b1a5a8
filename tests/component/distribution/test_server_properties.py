"""Hostile requests against the agent's peer server (hypothesis): any chunk index, query string and
header gets a whole verified chunk, a JSON 4xx naming the problem, never a 500, and the server
keeps serving afterwards."""

from __future__ import annotations

import hashlib
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringseed import web
from ringseed.agent import cache, server, store, stream
from ringseed.protocol import manifest, revision
from tests.component import served

TOKEN = "t0ken"
MiB = 1 << 20


class _Source:
    def __init__(self, staging: store.Store, rev: revision.Revision, held: dict[int, str]) -> None:
        self.store = staging
        self.revision = rev
        self.held = held
        self.memory = cache.MemoryTier(MiB)
        self.inflight: dict[int, stream.Inflight] = {}
        self.active_uploads = 0
        self.active_streams = 0
        self.uploaded_bytes = 0
        self.refused_uploads = 0


class _Control:
    def __init__(self) -> None:
        self.verifies = 0

    def status(self) -> dict[str, Any]:
        return {"node": "n"}

    def start_verify(self) -> bool:
        self.verifies += 1
        return True


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[int, str]]]:
    layout = manifest.Layout.build([("a.bin", 2 * MiB + 5, 0o644)], chunk_size=MiB)
    rev = revision.Revision(layout=layout)
    staging = store.Store(Path(tmp_path_factory.mktemp("peer")) / "cache")
    staging.open(rev)
    data = bytes(range(256)) * ((2 * MiB + 5) // 256 + 1)
    held = {}
    for index in (0, 2):  # chunk 1 is not held
        start, end = layout.chunk_span(index)
        staging.write_chunk(index, data[start:end])
        held[index] = manifest.chunk_sha256(data[start:end])
    source = _Source(staging, rev, held)
    source.memory.put(0, data[:MiB])
    app = server.create_app(
        token=TOKEN,
        source=source,
        max_uploads=4,
        metrics=web.Metrics(),
        refresh_metrics=lambda: None,
        control=_Control(),
    )
    with served.in_thread(app) as url:
        yield url, held
    staging.close()


def _get(base: str, path: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, bytes]:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {TOKEN}", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


INDICES = st.one_of(
    st.sampled_from(["0", "1", "2", "3", "-1", "+1", " 1", "1 ", "٣", "1_0", "0x1", "9" * 30, "", "00", "2.0"]),
    st.text(max_size=12),
)
QUERIES = st.dictionaries(
    st.sampled_from(["stream", "revision", "x", "stream[]", ""]),
    st.one_of(st.sampled_from(["1", "0", "", "true", "a" * 64]), st.text(max_size=10)),
    max_size=3,
)
HEADERS = st.dictionaries(
    st.sampled_from(["Range", "If-Match", "Accept-Encoding", "X-Chunk-Sha256"]),
    st.sampled_from(["bytes=0-10", "bytes=-5", "bytes=9999999999-", "bytes=a-b", "*", "gzip", ""]),
    max_size=2,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=INDICES, query=QUERIES, headers=HEADERS)
def test_any_chunk_request_is_a_whole_chunk_or_a_named_4xx(
    peer: tuple[str, dict[int, str]], index: str, query: dict[str, str], headers: dict[str, str]
) -> None:
    base, held = peer
    path = "/v1/chunks/" + quote(index, safe="") + ("?" + urlencode(query) if query else "")
    status, body = _get(base, path, headers)
    assert status < 500, (status, body[:200])
    if status == 200:
        assert index.isascii() and index.isdigit() and int(index) in held
        assert hashlib.sha256(body).hexdigest() == held[int(index)]  # whole and verified, whatever Range said
    else:
        answer = json.loads(body)
        assert status in (400, 404, 409, 429) and answer["error"] and answer["reason"], (status, answer)


def test_the_control_endpoints_and_the_chunks_still_answer(peer: tuple[str, dict[int, str]]) -> None:
    base, held = peer
    assert _get(base, "/v1/status")[0] == 200
    status, body = _get(base, "/v1/verify", method="POST")
    assert status == 202 and json.loads(body) == {"started": True}
    assert _get(base, "/v1/chunks/1")[0] == 404  # not held: never sent
    assert _get(base, "/v1/chunks/2?revision=" + "0" * 64)[0] == 409  # another revision's chunk 2
    status, body = _get(base, "/v1/chunks/2")
    assert status == 200 and hashlib.sha256(body).hexdigest() == held[2]
