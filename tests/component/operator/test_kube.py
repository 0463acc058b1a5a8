"""The operator's Kubernetes client against API servers on loopback that misbehave on purpose.

Proves the wiring the unit tests of ``backoff`` cannot: credentials and TLS come from kopf's
``ConnectionInfo`` (client certificates and keys never land in a file that stays behind), 401
logs in again, 429/5xx and dropped connections are retried as the server asks, lists are read
in pages, and a closed client opens no session behind the caller's back.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ringseed.operator import backoff, kube
from tests.component.operator.conftest import serve

FAST = backoff.Backoff(attempts=4, base_delay=0.01, max_delay=1.0)
PODS = "/api/v1/namespaces/ml/pods"


class Api:
    """A scripted API server: each path answers from a queue of (status, body, headers), the last
    answer repeating; every request is recorded with its arrival time."""

    def __init__(self) -> None:
        self.script: dict[str, list[tuple[int, Any, dict[str, str]]]] = {}
        self.seen: list[tuple[str, str, dict[str, str], float, str]] = []  # method, path, query, time, auth

    def answer(self, path: str, *answers: tuple[int, Any, dict[str, str]]) -> None:
        self.script[path] = list(answers)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        self.seen.append((request.method, request.path, dict(request.query), time.monotonic(), auth))
        queue = self.script.get(request.path)
        if not queue:
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        status, body, headers = queue.pop(0) if len(queue) > 1 else queue[0]
        if status == 0:  # drop the connection without an answer
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return web.json_response(body, status=status, headers=headers)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@pytest.fixture
async def api() -> AsyncIterator[tuple[Api, str]]:
    fake = Api()
    async with serve(fake.app()) as url:
        yield fake, url


def client(url: str, *, logins: list[str] | None = None, **info: Any) -> kube.Client:
    def login() -> kopf.ConnectionInfo:
        if logins is not None:
            logins.append("login")
            info["token"] = f"token-{len(logins)}"
        return kopf.ConnectionInfo(server=url, **info)

    return kube.Client(login=login, retry=FAST, page_size=2)


def status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "code": code, "message": message}


async def test_429_is_retried_after_the_servers_retry_after(api: tuple[Api, str]) -> None:
    fake, url = api
    fake.answer(PODS + "/p", (429, status(429, "slow down"), {"Retry-After": "1"}), (200, {"kind": "Pod"}, {}))
    k = client(url)
    try:
        assert await k.get(api_version="v1", kind="Pod", namespace="ml", name="p") == {"kind": "Pod"}
    finally:
        await k.close()
    (_, _, _, first, _), (_, _, _, second, _) = fake.seen
    assert second - first >= 1.0  # the server asked for a second; FAST alone would wait <= 0.01 s


@pytest.mark.parametrize("failure", [500, 502, 503, 504, 0])
async def test_server_errors_and_dropped_connections_are_retried(api: tuple[Api, str], failure: int) -> None:
    fake, url = api
    fake.answer(PODS + "/p", (failure, status(failure, "down"), {}), (failure, status(failure, "down"), {}))
    fake.script[PODS + "/p"].append((200, {"kind": "Pod"}, {}))
    k = client(url)
    try:
        assert await k.get(api_version="v1", kind="Pod", namespace="ml", name="p") == {"kind": "Pod"}
    finally:
        await k.close()
    assert len(fake.seen) == 3


async def test_retries_are_bounded_and_the_error_carries_the_servers_reason(api: tuple[Api, str]) -> None:
    fake, url = api
    fake.answer(PODS + "/p", (503, status(503, "etcd is away"), {}))
    k = client(url)
    try:
        with pytest.raises(kube.ApiError, match="etcd is away") as info:
            await k.get(api_version="v1", kind="Pod", namespace="ml", name="p")
    finally:
        await k.close()
    assert info.value.status == 503
    assert len(fake.seen) == FAST.attempts


@pytest.mark.parametrize(("code", "calls"), [(409, 1), (422, 1), (403, 1)])
async def test_final_answers_are_not_retried(api: tuple[Api, str], code: int, calls: int) -> None:
    fake, url = api
    fake.answer(PODS, (code, status(code, "no"), {}))
    k = client(url)
    try:
        with pytest.raises(kube.ApiError) as info:
            await k.create(obj={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"}})
    finally:
        await k.close()
    assert info.value.status == code and len(fake.seen) == calls


async def test_404_is_an_answer(api: tuple[Api, str]) -> None:
    fake, url = api
    k = client(url)
    try:
        assert await k.get(api_version="v1", kind="Pod", namespace="ml", name="gone") is None
        assert await k.delete(api_version="v1", kind="Pod", namespace="ml", name="gone") is False
    finally:
        await k.close()
    assert len(fake.seen) == 2


async def test_401_logs_in_again_once_with_fresh_credentials(api: tuple[Api, str]) -> None:
    fake, url = api
    fake.answer(PODS + "/p", (401, status(401, "expired"), {}), (200, {"kind": "Pod"}, {}))
    logins: list[str] = []
    k = client(url, logins=logins)
    try:
        assert await k.get(api_version="v1", kind="Pod", namespace="ml", name="p") == {"kind": "Pod"}
        fake.answer(PODS + "/q", (401, status(401, "still expired"), {}))
        with pytest.raises(kube.ApiError) as info:
            await k.get(api_version="v1", kind="Pod", namespace="ml", name="q")
    finally:
        await k.close()
    assert info.value.status == 401
    assert [auth for *_, auth in fake.seen] == ["Bearer token-1", "Bearer token-2", "Bearer token-2", "Bearer token-3"]


async def test_lists_are_read_in_pages(api: tuple[Api, str]) -> None:
    fake, url = api
    pods = [{"metadata": {"name": f"p{i}"}} for i in range(5)]
    fake.answer(
        PODS,
        (200, {"items": pods[0:2], "metadata": {"continue": "c1"}}, {}),
        (200, {"items": pods[2:4], "metadata": {"continue": "c2"}}, {}),
        (200, {"items": pods[4:], "metadata": {}}, {}),
    )
    k = client(url)
    try:
        listed = await k.list(api_version="v1", kind="Pod", namespace="ml", label_selector="app=x")
    finally:
        await k.close()
    assert [p["metadata"]["name"] for p in listed] == ["p0", "p1", "p2", "p3", "p4"]
    queries = [query for _, _, query, _, _ in fake.seen]
    assert queries == [
        {"limit": "2", "labelSelector": "app=x"},
        {"limit": "2", "labelSelector": "app=x", "continue": "c1"},
        {"limit": "2", "labelSelector": "app=x", "continue": "c2"},
    ]


async def test_an_expired_continue_token_starts_the_list_again(api: tuple[Api, str]) -> None:
    fake, url = api
    pods = [{"metadata": {"name": f"p{i}"}} for i in range(3)]
    fake.answer(
        PODS,
        (200, {"items": pods[0:2], "metadata": {"continue": "old"}}, {}),
        (410, status(410, "continue token expired"), {}),
        (200, {"items": pods[0:2], "metadata": {"continue": "new"}}, {}),
        (200, {"items": pods[2:], "metadata": {}}, {}),
    )
    k = client(url)
    try:
        listed = await k.list(api_version="v1", kind="Pod", namespace="ml")
    finally:
        await k.close()
    assert [p["metadata"]["name"] for p in listed] == ["p0", "p1", "p2"]  # no duplicates from the first try


async def test_a_closed_client_opens_no_new_session(api: tuple[Api, str]) -> None:
    fake, url = api
    fake.answer(PODS + "/p", (200, {"kind": "Pod"}, {}))
    k = client(url)
    await k.get(api_version="v1", kind="Pod", namespace="ml", name="p")
    await k.close()
    with pytest.raises(kube.ApiError, match="closed"):
        await k.get(api_version="v1", kind="Pod", namespace="ml", name="p")
    assert len(fake.seen) == 1


# TLS: client certificates from kopf's ConnectionInfo, as a kubeconfig with embedded data gives them.


def _pem_pair(
    *, subject: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None, ca: bool = False
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256()), key


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, bytes]:
    ca = _pem_pair(subject="test-ca", issuer=None, ca=True)
    server = _pem_pair(subject="127.0.0.1", issuer=ca)
    user = _pem_pair(subject="ringseed-operator", issuer=ca)
    return {
        "ca": _pem(ca[0]),
        "server_cert": _pem(server[0]),
        "server_key": _pem(server[1]),
        "client_cert": _pem(user[0]),
        "client_key": _pem(user[1]),
    }


async def serve_tls(app: web.Application, *, pki: dict[str, bytes], tmp: Path) -> tuple[web.AppRunner, str]:
    for name in ("ca", "server_cert", "server_key"):
        (tmp / name).write_bytes(pki[name])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp / "ca"))
    context.load_cert_chain(str(tmp / "server_cert"), str(tmp / "server_key"))
    context.verify_mode = ssl.CERT_REQUIRED  # a client without its certificate is refused
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"https://127.0.0.1:{port}"


async def test_client_certificates_come_from_connection_info_and_leave_no_files(
    tmp_path: Path, pki: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    async def whoami(request: web.Request) -> web.Response:
        calls.append(1)
        if len(calls) % 2:  # every other call: the credentials "expired", as after a rotation
            return web.json_response(status(401, "expired"), status=401)
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(item[0] for item in peer["subject"]) if peer else {}
        return web.json_response({"user": subject.get("commonName")})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ml/pods/me", whoami)
    server_files = tmp_path / "server"
    server_files.mkdir()
    runner, url = await serve_tls(app, pki=pki, tmp=server_files)
    scratch = tmp_path / "scratch"  # where tempfile would put key material
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    logins: list[int] = []

    def login() -> kopf.ConnectionInfo:
        logins.append(1)
        return kopf.ConnectionInfo(
            server=url, ca_data=pki["ca"], certificate_data=pki["client_cert"], private_key_data=pki["client_key"]
        )

    k = kube.Client(login=login, retry=FAST)
    try:
        for _ in range(3):  # each call meets a 401 first and logs in again
            answer = await k.get(api_version="v1", kind="Pod", namespace="ml", name="me")
            assert answer == {"user": "ringseed-operator"}
    finally:
        await k.close()
        await runner.cleanup()
    assert len(logins) == 4
    assert list(scratch.iterdir()) == []  # no certificate or key left behind

    runner, url = await serve_tls(app, pki=pki, tmp=server_files)
    untrusting = kube.Client(login=lambda: kopf.ConnectionInfo(server=url), retry=FAST)  # no CA, no cert
    try:
        with pytest.raises(kube.ApiError, match="certificate"):
            await untrusting.get(api_version="v1", kind="Pod", namespace="ml", name="me")
    finally:
        await untrusting.close()
        await runner.cleanup()
