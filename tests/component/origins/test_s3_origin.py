"""s3:// origin against a moto server on loopback: listing, pagination, ranged reads, signing."""

from __future__ import annotations

import collections.abc
import contextlib
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from ringseed.agent import origins
from ringseed.agent.origins import s3
from ringseed.protocol import manifest
from tests.component.origins import servers

MI = 1 << 20


def _objects() -> dict[str, bytes]:
    rng = random.Random(11)
    return {
        "models/llama/config.json": b'{"dim": 8}',
        "models/llama/shards/00.bin": rng.randbytes(MI + 321),
        "models/llama/shards/deep/01.bin": rng.randbytes(700_000),
        "models/llama/tokenizer/vocab é+ü.txt": "ünïcode+plus".encode(),
        "models/llama/empty/": b"",  # a "directory" marker object
        "models/llama-2/other.bin": b"not part of the prefix",
    }


def _open(uri: str, **kw: object) -> origins.Origin:
    return origins.open_origin(uri, retry_base_delay=0.001, retry_max_delay=0.01, **kw)  # type: ignore[arg-type]


async def test_prefix_lists_nested_keys_and_reads_ranges(s3_env: dict[str, str], s3_bucket: str) -> None:
    objects = _objects()
    servers.put_objects(s3_env["AWS_ENDPOINT_URL"], s3_bucket, objects)
    origin = _open(f"s3://{s3_bucket}/models/llama")
    try:
        listed = sorted(await origin.list_files())
        assert listed == [
            ("config.json", 10, 0o644),
            ("shards/00.bin", MI + 321, 0o644),
            ("shards/deep/01.bin", 700_000, 0o644),
            ("tokenizer/vocab é+ü.txt", len("ünïcode+plus".encode()), 0o644),
        ]
        shard = objects["models/llama/shards/00.bin"]
        assert await origin.read("shards/00.bin", 300, MI) == shard[300 : 300 + MI]
        assert await origin.read("tokenizer/vocab é+ü.txt", 0, 5) == "ünïcode+plus".encode()[:5]
        assert origin.bytes_read == MI + 5
    finally:
        await origin.close()


async def test_listing_follows_continuation_pages(
    s3_env: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = {f"p/file-{i:02d}": bytes([i]) * (i + 1) for i in range(7)}
    servers.put_objects(s3_env["AWS_ENDPOINT_URL"], s3_bucket, objects)
    monkeypatch.setattr(s3.S3Origin, "list_page_size", 2)
    origin = _open(f"s3://{s3_bucket}/p/")
    try:
        assert sorted(p for p, _, _ in await origin.list_files()) == [f"file-{i:02d}" for i in range(7)]
    finally:
        await origin.close()


async def test_a_key_naming_one_object_is_a_one_file_source(s3_env: dict[str, str], s3_bucket: str) -> None:
    servers.put_objects(s3_env["AWS_ENDPOINT_URL"], s3_bucket, {"m/weights.bin": b"0123456789"})
    origin = _open(f"s3://{s3_bucket}/m/weights.bin")
    try:
        assert await origin.list_files() == [("weights.bin", 10, 0o644)]
        assert await origin.read("weights.bin", 3, 4) == b"3456"
    finally:
        await origin.close()


async def test_manifest_over_s3_equals_manifest_of_the_same_files_on_disk(
    s3_env: dict[str, str], s3_bucket: str, tmp_path: Path
) -> None:
    objects = {k: v for k, v in _objects().items() if k.startswith("models/llama/") and not k.endswith("/")}
    servers.put_objects(s3_env["AWS_ENDPOINT_URL"], s3_bucket, objects)
    servers.write_tree(tmp_path, {k.removeprefix("models/llama/"): v for k, v in objects.items()})
    remote = _open(f"s3://{s3_bucket}/models/llama/")
    try:
        over_s3 = await origins.build_manifest(remote, chunk_size=MI)
    finally:
        await remote.close()
    on_disk = await origins.build_manifest(origins.open_origin(str(tmp_path)), chunk_size=MI)
    assert over_s3.digest == on_disk.digest


async def test_missing_bucket_is_a_permanent_error(s3_env: dict[str, str]) -> None:
    origin = _open("s3://no-such-bucket-ringseed/x/")
    try:
        with pytest.raises(origins.OriginError, match=r"no-such-bucket-ringseed.*HTTP 404"):
            await origin.list_files()
    finally:
        await origin.close()


@contextlib.contextmanager
def _iam_enforced(endpoint: str, bucket: str) -> collections.abc.Iterator[dict[str, str]]:
    """A moto IAM user allowed to read ``bucket``; moto checks every SigV4 signature inside."""
    from moto.core import authorization

    iam = servers.boto3_client(endpoint, "iam")
    user = f"reader-{bucket}"
    iam.create_user(UserName=user)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName=user, PolicyName="read", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    with authorization.enable_iam_authentication():
        yield {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


async def test_requests_are_sigv4_signed_and_secret_env_overrides_the_environment(
    s3_env: dict[str, str], s3_bucket: str
) -> None:
    endpoint = s3_env["AWS_ENDPOINT_URL"]
    objects = {"m/a b/ü.bin": b"x" * 5000, "m/c.bin": b"y" * 10}
    servers.put_objects(endpoint, s3_bucket, objects)
    with _iam_enforced(endpoint, s3_bucket) as secret_env:
        good = _open(f"s3://{s3_bucket}/m/", secret_env=secret_env)
        try:
            assert sorted(p for p, _, _ in await good.list_files()) == ["a b/ü.bin", "c.bin"]
            assert await good.read("a b/ü.bin", 10, 100) == b"x" * 100
        finally:
            await good.close()
        wrong = _open(f"s3://{s3_bucket}/m/", secret_env=dict(secret_env, AWS_SECRET_ACCESS_KEY="wrong"))
        try:
            with pytest.raises(origins.OriginError, match="HTTP 403"):
                await wrong.list_files()
        finally:
            await wrong.close()


async def test_fetch_manifest_from_s3_checks_the_digest(s3_env: dict[str, str], s3_bucket: str) -> None:
    layout = manifest.Layout.build([("w.bin", 3, 0o644)], chunk_size=MI)
    published = manifest.Manifest(layout=layout, chunk_hashes=(hashlib.sha256(b"abc").hexdigest(),))
    body = json.dumps(published.to_dict()).encode()
    servers.put_objects(s3_env["AWS_ENDPOINT_URL"], s3_bucket, {"m/manifest.json": body})
    loaded = await origins.fetch_manifest(f"s3://{s3_bucket}/m/manifest.json", retry_base_delay=0.001)
    assert loaded == published


async def test_a_chunk_is_read_as_concurrent_ranged_parts_into_one_buffer(
    s3_env: dict[str, str], s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = {"parts/a.bin": random.Random(5).randbytes(3 * MI + 77), "parts/b.bin": b"tail of the chunk"}
    servers.put_objects(s3_env["AWS_ENDPOINT_URL"], s3_bucket, objects)
    monkeypatch.setattr(s3.S3Origin, "range_part", MI)
    origin = _open(f"s3://{s3_bucket}/parts/")
    calls: list[tuple[int, int]] = []
    running = [0, 0]  # now, most at once
    real = s3.S3Origin.get_range_into

    async def spy(self: s3.S3Origin, url: str, *, offset: int, view: memoryview, **more: Any) -> None:
        calls.append((offset, len(view)))
        running[0] += 1
        running[1] = max(running)
        try:
            await real(self, url, offset=offset, view=view, **more)
        finally:
            running[0] -= 1

    monkeypatch.setattr(s3.S3Origin, "get_range_into", spy)
    try:
        layout = manifest.Layout.build(await origin.list_files(), chunk_size=4 * MI)
        seen: list[int] = []
        out = memoryview(bytearray(layout.chunk_length(0)))
        await origins.read_chunk_into(origin, layout, 0, out, progress=seen.append)
    finally:
        await origin.close()
    assert bytes(out) == objects["parts/a.bin"] + objects["parts/b.bin"]
    assert sorted(calls) == sorted([(0, MI), (MI, MI), (2 * MI, MI), (3 * MI, 77), (0, len(b"tail of the chunk"))])
    assert running[1] > 1  # parts of one object were read at once
    assert seen == sorted(seen) and seen[-1] == len(out)
