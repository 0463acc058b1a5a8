"""ringseed deployed as a user deploys it, on the emulated cluster: brought up and torn down here.

Owns the order of bringing the pieces up and down (test harness): KMock (with printing) on
loopback -> the cluster network (4 nodes, shaped links) -> the API server's TLS front on the
control host -> controllers and kubelets -> ``helm template charts/ringseed | kubectl apply``
(the operator's RBAC, ConfigMap and Deployment; the operator then runs as a pod from the image).
``kubectl`` talks to KMock directly (a kubeconfig in the work directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from kmock._internal import apps

from tests.conftest import REPO
from tests.e2e.cluster import apiserver, cluster, emulator, network
from tests.e2e.cluster.process import run_process

TOOLS = REPO / ".tools" / "bin"
OPERATOR_NS = "ringseed-system"
IMAGE_REPOSITORY, IMAGE_TAG = "ringseed", "dev"
KUBERNETES = "1.35.0"


def missing_tools() -> str | None:
    for tool in ("helm", "kubectl"):
        if not (TOOLS / tool).exists():
            return f"{TOOLS / tool} missing (hack/install-helm.sh installs it)"
    if shutil.which("openssl") is None:
        return "openssl missing"
    return None


@dataclass
class Deployed:
    cluster: cluster.Cluster
    net: network.ClusterNetwork
    kubeconfig: Path
    work: Path
    kmock: Any

    async def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """Run kubectl against the emulator (asynchronously: the emulator serves from this event loop)."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        done = await run_process(
            str(TOOLS / "kubectl"), *args, env=env, within=60, stdin=stdin.encode() if stdin is not None else None
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}: {done.err.decode().strip()}")
        return done.out.decode()

    async def apply(self, manifest: str) -> str:
        """``kubectl apply`` of YAML text, each built-in object first validated against Kubernetes' schema.

        kubectl's own validation needs the server's OpenAPI document, which KMock does not serve, so
        it runs with ``--validate=false`` after :func:`kubernetes_validate.validate` (strict) here."""
        for doc in yaml.safe_load_all(manifest):
            if doc and not doc["apiVersion"].startswith("ringseed.io/"):  # custom resources: no upstream schema
                kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        return await self.kubectl("apply", "--validate=false", "-f", "-", stdin=manifest)

    async def create_config_map(self, name: str, *files: Path) -> str:
        """``kubectl create configmap NAME --from-file ...`` (rendered client-side, then applied: kubectl
        sends ``create`` bodies as protobuf, which KMock cannot read)."""
        sources = [f"--from-file={path}" for path in files]
        rendered = await self.kubectl("create", "configmap", name, *sources, "--dry-run=client", "-o", "yaml")
        return await self.apply(rendered)

    async def wait_for(self, check: Callable[[], Any], *, within: float, what: str) -> Any:
        """Poll ``check`` until truthy; fail at once on a harness error, or after ``within`` s."""
        deadline = time.monotonic() + within
        last: Any = None
        while time.monotonic() < deadline:
            if self.cluster.errors:
                raise AssertionError(f"the e2e cluster could not honour the pods: {self.cluster.errors}")
            last = check()
            if last:
                return last
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out after {within}s waiting for {what}; last: {last!r}")


def helm_template(*values: str) -> str:
    args = [str(TOOLS / "helm"), "template", "ringseed", str(REPO / "charts" / "ringseed"), "--namespace", OPERATOR_NS]
    for value in values:
        args += ["--set", value]
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout


@contextlib.asynccontextmanager
async def deployed(
    work: Path, *, image_ids: Mapping[str, str], nodes: int = 4, node_rate: float = 500e6
) -> AsyncIterator[Deployed]:
    """The cluster up, the chart not yet applied; containers of image ``name`` run ``image_ids[name]``."""
    tokens = apiserver.Tokens()
    async with emulator.PrintingEmulator(identities=tokens.by_token) as kmock, apps.Server(kmock):
        emulator.declare(kmock)
        with network.ClusterNetwork(nodes=nodes, node_rate=node_rate) as net:
            certs = await asyncio.to_thread(apiserver.Certificates.make, work / "pki", address=net.control_address)
            upstream = (str(kmock.url.host), int(kmock.url.port))
            front = apiserver.Front(
                netns=net.testbed.origin.netns, address=net.control_address, upstream=upstream, certs=certs
            )
            await front.start()
            label = f"io.ringseed.e2e={net.testbed.prefix}"
            harness = cluster.Cluster(
                net=net,
                api_url=str(kmock.url).rstrip("/"),
                work=work,
                certs=certs,
                tokens=tokens,
                label=label,
                image_ids=image_ids,
            )
            try:
                await harness.start()
                kubeconfig = emulator.kubeconfig(work / "kubeconfig", server=str(kmock.url).rstrip("/"))
                yield Deployed(cluster=harness, net=net, kubeconfig=kubeconfig, work=work, kmock=kmock)
            finally:
                await harness.close()
                await front.close()
                from tests.e2e.cluster import kubelet

                await kubelet.podman("rm", "-f", "-t", "0", "--filter", f"label={label}", check=False)
