"""``ringseed local allreduce``: real processes (coordinator + peers) on loopback, checked results."""

from __future__ import annotations

import json
import subprocess

import pytest


def _run(cmd: list[str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, "local", "allreduce", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("peers", "dtype", "op", "extra"),
    [
        (3, "float32", "sum", []),
        (2, "int32", "max", []),
        (4, "float32", "avg", ["--quantize", "int8"]),
        (3, "bfloat16", "avg", []),
    ],
)
def test_result_matches_the_reference(
    ringseed_cmd: list[str], peers: int, dtype: str, op: str, extra: list[str]
) -> None:
    done = _run(
        ringseed_cmd,
        "--peers",
        str(peers),
        "--size",
        "1Mi",
        "--dtype",
        dtype,
        "--op",
        op,
        "--iters",
        "2",
        "--json",
        *extra,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["ok"] is True and summary["world_size"] == peers
    assert summary["max_abs_error"] <= summary["tolerance"]
    assert summary["seconds"] > 0 and summary["algbw_gbps"] > 0
    assert summary["busbw_gbps"] == pytest.approx(summary["algbw_gbps"] * 2 * (peers - 1) / peers)


def test_odd_length_fewer_elements_than_peers(ringseed_cmd: list[str]) -> None:
    done = _run(ringseed_cmd, "--peers", "3", "--size", "8", "--dtype", "int64", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["max_abs_error"] == 0.0


def test_human_output_names_bandwidths(ringseed_cmd: list[str]) -> None:
    done = _run(ringseed_cmd, "--peers", "2", "--size", "256Ki")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "algbw" in done.stdout and "busbw" in done.stdout and "OK" in done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--size", "3", "--dtype", "float32"],
        ["--peers", "0"],
        ["--dtype", "int32", "--quantize", "int8"],
        ["--peers", "1", "--kill-peer-at", "1"],
        ["--peers", "2", "--size", "64Ki", "--kill-peer-mid-op"],  # the small path combines no segments
    ],
)
def test_impossible_arguments_exit_2(ringseed_cmd: list[str], args: list[str]) -> None:
    done = _run(ringseed_cmd, *args, timeout=60)
    assert done.returncode == 2 and "ringseed local allreduce:" in done.stderr
