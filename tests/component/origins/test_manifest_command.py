"""`ringseed manifest` as a user runs it, and fetching a published manifest back."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from ringseed.agent import origins
from ringseed.protocol import manifest
from tests.component.origins import servers

MI = 1 << 20


@pytest.fixture
def model(tmp_path: Path) -> Path:
    rng = random.Random(3)
    files = {"w/0.bin": rng.randbytes(MI + 10), "w/1.bin": rng.randbytes(MI // 2), "名前.json": b"{}"}
    return servers.write_tree(tmp_path / "model", files)


def _cli(ringseed_cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ringseed_cmd, "manifest", *args], capture_output=True, text=True, timeout=120, check=False)


def _stream(root: Path) -> bytes:
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return b"".join((root / name).read_bytes() for name in names)


def test_json_output_has_chunk_hashes_that_match_hashlib(ringseed_cmd: list[str], model: Path) -> None:
    result = _cli(ringseed_cmd, f"file://{model}", "--chunk-size", "1Mi", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    stream = _stream(model)
    assert doc["chunk_size"] == MI
    assert doc["total_size"] == len(stream)
    assert doc["chunk_hashes"] == [hashlib.sha256(stream[i : i + MI]).hexdigest() for i in range(0, len(stream), MI)]
    assert [f["path"] for f in doc["files"]] == ["w/0.bin", "w/1.bin", "名前.json"]
    assert manifest.Manifest.from_dict(doc).digest == doc["digest"]


async def test_output_file_publishes_a_manifest_that_fetch_manifest_accepts(
    ringseed_cmd: list[str], model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "manifest.json"
    result = _cli(ringseed_cmd, str(model), "--chunk-size", "1048576", "--output", str(out))
    assert result.returncode == 0, result.stderr
    loaded = await origins.fetch_manifest(f"file://{out}")
    assert f"digest:     {loaded.digest}" in result.stdout
    assert "chunks:     2" in result.stdout
    assert "files:      3" in result.stdout


def test_http_source_works_through_the_cli(ringseed_cmd: list[str], model: Path) -> None:
    with servers.FlakyHTTPOrigin(model, faults=[servers.Fault.RESET]).in_thread() as url:
        over_http = _cli(ringseed_cmd, url, "--chunk-size", "1Mi", "--json")
    assert over_http.returncode == 0, over_http.stderr
    on_disk = _cli(ringseed_cmd, str(model), "--chunk-size", "1Mi", "--json")
    assert json.loads(over_http.stdout)["digest"] == json.loads(on_disk.stdout)["digest"]


def test_rejected_sources_exit_1_naming_the_problem(ringseed_cmd: list[str], model: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path, model / "escape")
    result = _cli(ringseed_cmd, str(model))
    assert result.returncode == 1
    assert "'escape'" in result.stderr
    os.unlink(model / "escape")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "zero").write_bytes(b"")
    result = _cli(ringseed_cmd, str(empty))
    assert result.returncode == 1
    assert result.stderr.strip() == "ringseed manifest: source is empty: its 1 file(s) hold 0 bytes"


def test_bad_chunk_size_is_a_usage_error(ringseed_cmd: list[str], model: Path) -> None:
    result = _cli(ringseed_cmd, str(model), "--chunk-size", "2Gi")
    assert result.returncode == 2
    assert "1Mi to 1Gi" in result.stderr


async def test_fetch_manifest_over_http_checks_the_digest(http_root: Path) -> None:
    layout = manifest.Layout.build([("w.bin", 5, 0o644)], chunk_size=MI)
    good = manifest.Manifest(layout=layout, chunk_hashes=(hashlib.sha256(b"hello").hexdigest(),))
    doc = good.to_dict()
    (http_root / "good.json").write_text(json.dumps(doc))
    (http_root / "tampered.json").write_text(json.dumps(dict(doc, chunk_hashes=["0" * 64])))
    (http_root / "undigested.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "digest"}))
    (http_root / "garbage.json").write_text("{not json")
    async with servers.FlakyHTTPOrigin(http_root, faults=[servers.Fault.ERROR_500]) as srv:
        fetched = await origins.fetch_manifest(srv.url + "good.json", retry_base_delay=0.001)
        assert fetched == good
        with pytest.raises(manifest.ManifestError, match=r"expected 0+$"):
            await origins.fetch_manifest(srv.url + "good.json", expected_digest="0" * 64)
        for name, problem in (("tampered", "digest: manifest says"), ("undigested", "must carry its digest")):
            with pytest.raises(manifest.ManifestError, match=problem):
                await origins.fetch_manifest(srv.url + f"{name}.json")
        with pytest.raises(manifest.ManifestError, match="not valid JSON"):
            await origins.fetch_manifest(srv.url + "garbage.json")
        with pytest.raises(origins.OriginError, match="HTTP 404"):
            await origins.fetch_manifest(srv.url + "absent.json")
