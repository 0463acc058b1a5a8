"""The API server as pods see it: KMock behind TLS on the control host, with service-account tokens.

Owns what stands between the cluster's pods and the emulator (test harness, not product code):
- a certificate authority and a serving certificate for ``10.77.0.1`` and ``kubernetes.default.svc``
  (made with the ``openssl`` command), whose CA the kubelet puts in every pod's
  ``/var/run/secrets/kubernetes.io/serviceaccount/ca.crt``;
- a TLS front on ``<control address>:6443`` inside the control host's netns that relays bytes to
  KMock on loopback, so in-cluster clients (kopf's ``login_via_client``, the ``kubernetes``
  client's in-cluster config) connect exactly as in a cluster;
- service-account tokens, one per ``namespace/name``, and who holds which (for RBAC checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.cluster import network

PORT = 6443


@dataclass
class Certificates:
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path, *, address: str) -> Certificates:
        directory.mkdir(parents=True, exist_ok=True)
        ca_key, ca, key, csr, cert = (directory / n for n in ("ca.key", "ca.crt", "tls.key", "tls.csr", "tls.crt"))
        ext = directory / "san.cnf"
        ext.write_text(
            f"subjectAltName=IP:{address},DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True)

        openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=e2e-cluster-ca",
            "-keyout",
            str(ca_key),
            "-out",
            str(ca),
        )
        openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver", "-keyout", str(key), "-out", str(csr)
        )
        openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca),
            "-CAkey",
            str(ca_key),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(ext),
            "-out",
            str(cert),
        )
        return cls(ca=ca, cert=cert, key=key)


@dataclass
class Front:
    """TLS on ``address:PORT`` in netns ``netns``, relayed to ``upstream`` (host, port) on loopback."""

    netns: str
    address: str
    upstream: tuple[str, int]
    certs: Certificates
    _server: asyncio.Server | None = None
    _relays: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certs.cert, self.certs.key)
        sock = await asyncio.to_thread(network.socket_in, self.netns)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.address, PORT))
        sock.listen(128)
        sock.setblocking(False)
        self._server = await asyncio.start_server(self._serve, sock=sock, ssl=context)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._relays.discard(task)
            for w in (writer, up_writer):
                w.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._relays):
            task.cancel()
        for task in list(self._relays):
            with contextlib.suppress(BaseException):
                await task


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.write_eof()


@dataclass
class Tokens:
    """Service-account tokens: ``token -> (namespace, name)``."""

    by_token: dict[str, tuple[str, str]] = field(default_factory=dict)

    def token_for(self, namespace: str, name: str) -> str:
        for token, owner in self.by_token.items():
            if owner == (namespace, name):
                return token
        token = secrets.token_urlsafe(32)
        self.by_token[token] = (namespace, name)
        return token
