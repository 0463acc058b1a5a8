"""``ringseed local distribute`` end to end: the layouts people have, failures named at once, progress.

Each test runs the real command (a master and agents as processes) and checks what a user relies
on: every copy verified, rc, the one error line naming the node and the cause, the kept workdir,
progress per node in plain lines when stderr is not a terminal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ringseed.local import swarm
from tests.component.distribution.conftest import (
    MiB,
    assert_copies,
    make_model,
    odd_sizes,
    source_manifest,
)
from tests.component.origins import servers
from tests.waiting import wait_for

RINGSEED = [sys.executable, "-m", "ringseed.cli"]


def distribute(*argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RINGSEED, "local", "distribute", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_a_hugging_face_snapshot_distributes(tmp_path: Path) -> None:
    files = {"config.json": b'{"a": 1}', "model.safetensors": os.urandom(3 * MiB + 5), "tok/vocab.txt": b"x y"}
    snapshot = servers.hub_cache(tmp_path, files)
    done = distribute(str(snapshot), "--nodes", "2", "--chunk-size", "1Mi", "--workdir", str(tmp_path / "w"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] and all(n["verified"] for n in result["nodes"].values())
    for node in result["nodes"].values():
        for rel, data in files.items():
            copy = Path(node["path"]) / rel
            assert not copy.is_symlink() and copy.read_bytes() == data


def test_progress_goes_to_a_log_as_plain_per_node_lines(tmp_path: Path) -> None:
    root = make_model(tmp_path / "model", odd_sizes(6, files=2))
    done = distribute(str(root), "--nodes", "3", "--chunk-size", "1Mi", "--origin-rate-limit", "4Mi")
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    verified_lines = [line for line in done.stderr.splitlines() if line.split()[1:2] and "verified" in line]
    for name in ("node-0", "node-1", "node-2"):
        assert sum(1 for line in verified_lines if line.split()[1] == f"{name}:") == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].split()[1:4] == ["nodes", "3/3", "verified"]
    assert "copies were in a temporary workdir, now removed" in done.stdout


def _pid_of(workdir: Path, name: str) -> int | None:
    """The pid of agent ``name`` started for ``workdir`` (its command line names both)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--node-name" in argv and name.encode() in argv and any(str(workdir).encode() in a for a in argv):
            return int(entry.name)
    return None


def test_a_sigkilled_agent_is_named_at_once_and_the_workdir_kept(tmp_path: Path) -> None:
    root = make_model(tmp_path / "model", odd_sizes(32, files=2))
    workdir = tmp_path / "w"
    argv = [*RINGSEED, "local", "distribute", str(root), "--nodes", "3", "--chunk-size", "1Mi"]
    argv += ["--origin-rate-limit", "1Mi", "--workdir", str(workdir), "--json", "--timeout", "300"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def node_1() -> int | None:
        if proc.poll() is not None:  # not a transient failure: wait_for must not retry it
            raise RuntimeError(f"the run ended ({proc.returncode}) before node-1 started")
        return _pid_of(workdir, "node-1")

    try:
        pid = wait_for(node_1, within=60, what="node-1 to start")
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)  # 32 MiB at 1 MiB/s: a run that went on would take 30 s more
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1
    result = json.loads(out)
    assert result["error"].startswith("node-1 was killed by SIGKILL"), result["error"]
    assert f"ringseed local distribute: node-1 was killed by SIGKILL (log: {workdir}/swarm/logs/node-1.log)" in err
    assert (workdir / "swarm" / "logs" / "node-1.log").exists()
    assert not all(n["verified"] for n in result["nodes"].values())


def test_an_agent_that_dies_is_named_with_the_first_error_of_its_log(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    # An agent reports a missing source as a problem and keeps serving; one whose cache directory is
    # unusable (here: a file) cannot run at all and exits with the error.
    root = make_model(tmp_path / "model", odd_sizes(2, files=1))
    local = swarm_factory(source=root.as_uri(), nodes=1, chunk_size=MiB)
    local.node_dir("node-0").mkdir(parents=True)
    (local.node_dir("node-0") / "cache").write_text("not a directory")
    local.start()
    with pytest.raises(swarm.ChildDied) as died:
        local.wait_for(lambda s: False, timeout=60, what="node-0 to die")
    assert died.value.name == "node-0"
    assert died.value.error is not None and died.value.error.startswith("NotADirectoryError: ")
    assert str(died.value).startswith("node-0 exited with status 1: NotADirectoryError: ")


def test_python_http_server_without_range_serves_a_swarm_in_about_one_pass(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(12, files=3))
    expected = source_manifest(root, chunk_size=MiB)
    index = {"files": [{"path": f.path, "size": f.size} for f in expected.layout.files]}
    (root / "index.json").write_text(json.dumps(index))
    with servers.plain_http_server(root) as (url, requests):
        local = swarm_factory(source=url, nodes=3, chunk_size=MiB)
        local.start()
        status = local.wait_for(local.all_verified, timeout=120, what="all verified from a server without Range")
    assert_copies(local, expected)
    assert status["bytes_from_origin"] <= 1.2 * expected.layout.total_size, status["bytes_from_origin"]
    data_gets = [r for r in requests if r.startswith("GET /shard-")]
    assert len(data_gets) <= 4 * 3, data_gets  # a handful per file, not one per chunk and retry


def test_a_timeout_names_the_nodes_still_missing_and_keeps_the_workdir(tmp_path: Path) -> None:
    root = make_model(tmp_path / "model", odd_sizes(16, files=2))
    workdir = tmp_path / "w"
    # 16 MiB at 256 KiB/s takes a minute: the 15 s timeout comes first, with the master long up.
    done = distribute(str(root), "--nodes", "2", "--chunk-size", "1Mi", "--origin-rate-limit", "256Ki",
                      "--timeout", "15", "--workdir", str(workdir), "--json")  # fmt: skip
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert result["error"].startswith("timed out after 15s; not verified: node-0 ("), result["error"]
    assert "node-1 (" in result["error"]
    assert f"ringseed local distribute: kept the workdir {workdir}" in done.stderr
    assert (workdir / "swarm" / "logs" / "node-0.log").exists()


def test_a_permanent_origin_error_during_the_run_stops_it_naming_node_and_reason(tmp_path: Path) -> None:
    # index.json lists a file the server does not have: the listing before the start passes, the
    # origin-duty agent's reads get 404 (permanent), it reports OriginError and the run stops.
    root = make_model(tmp_path / "model", {"a.bin": 3 * MiB})
    index = {"files": [{"path": "a.bin", "size": 3 * MiB}, {"path": "gone.bin", "size": MiB}]}
    (root / "index.json").write_text(json.dumps(index))
    with servers.plain_http_server(root) as (url, _):
        done = distribute(url, "--nodes", "2", "--chunk-size", "1Mi", "--json", "--timeout", "120")
    assert done.returncode == 1
    result = json.loads(done.stdout)
    node, reason, message = result["error"].split(": ", 2)
    assert node in ("node-0", "node-1") and reason == "OriginError", result["error"]
    assert f"{url}gone.bin" in message and "404" in message, message
