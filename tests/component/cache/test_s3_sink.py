"""The s3:// sink against a moto server: multipart uploads with per-part SHA-256, sidecars, restore from S3."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

from ringseed.cache import sink
from tests.component.cache.cluster import Cluster, MiB
from tests.component.cache.test_checkpoints import write
from tests.component.origins import servers


def parts_of(tmp_path: Path, data: bytes, size: int) -> list[sink.Part]:
    out = []
    for i, start in enumerate(range(0, len(data), size)):
        piece = data[start : start + size]
        path = tmp_path / f"part-{i}"
        path.write_bytes(piece)
        out.append(sink.Part(path=path, length=len(piece), sha256=hashlib.sha256(piece).hexdigest()))
    return out


async def test_objects_are_uploaded_whole_and_read_back_through_the_origin(
    s3_env: dict[str, str], tmp_path: Path
) -> None:
    target = sink.open_sink("s3://ckpt/run-1", rate_limit=None)
    try:
        big = os.urandom(13 * MiB + 5)  # three parts: 6 MiB, 6 MiB, 1 MiB + 5
        await target.put("step-1/model.pt", parts_of(tmp_path, big, 6 * MiB), sidecar={"size": len(big)})
        await target.put("step-1/small.json", parts_of(tmp_path, b'{"a": 1}', 6 * MiB), sidecar={"size": 8})
        await target.put("step-1/empty", [], sidecar={"size": 0})
        client = servers.boto3_client(s3_env["AWS_ENDPOINT_URL"])
        assert client.get_object(Bucket="ckpt", Key="run-1/step-1/model.pt")["Body"].read() == big
        assert client.get_object(Bucket="ckpt", Key="run-1/step-1/empty")["Body"].read() == b""
        assert (await target.get_sidecar("step-1/model.pt")) == {"size": len(big)}
        view = bytearray(1000)
        await target.read_into("step-1/model.pt", 6 * MiB - 500, memoryview(view))  # type: ignore[attr-defined]
        assert bytes(view) == big[6 * MiB - 500 : 6 * MiB + 500]
    finally:
        await target.close()


async def test_a_cluster_persists_to_s3_and_a_new_node_restores_from_it(
    s3_env: dict[str, str], cluster: Cluster
) -> None:
    await cluster.start_master(replicas=1, sink=True)
    await cluster.start_node("n0", sink="s3://ckpt/run-2", secret_env=dict(s3_env))
    data = os.urandom(17 * MiB)
    await asyncio.to_thread(write, cluster.nodes["n0"].fs(cluster.token), "step-2/model.pt", data)
    await cluster.wait_until(
        lambda: cluster.leader().state.meta.get("step-2/model.pt").persisted, within=60, what="persisted to S3"
    )
    await cluster.stop_node("n0")
    await cluster.start_node("n1", sink="s3://ckpt/run-2", secret_env=dict(s3_env))
    back = await asyncio.to_thread(lambda: cluster.nodes["n1"].fs(cluster.token).cat("step-2/model.pt"))
    assert back == data and cluster.nodes["n1"].agent.reads.sources["sink"] == 3
