"""A newcomer's first hour, scripted: every mistake gets one line naming it, never a traceback.

Each case runs the real ``ringseed`` command in a subprocess. Usage mistakes (a bad flag value, a
path that does not exist, a symlink loop, no command) exit 2 through argparse; a source that
cannot be used (empty, a closed port, refused credentials, a symlink leaving it) exits 1 after
one listing, before any agent starts.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from ringseed import cli, cmdline
from tests.component.origins import servers

DISTRIBUTE = ["local", "distribute"]


def ringseed(
    *argv: str, env: dict[str, str] | None = None, unset: tuple[str, ...] = (), timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-m", "ringseed.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        stdin=subprocess.DEVNULL,
    )


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line that names the problem: the last line on stderr; no traceback anywhere."""
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines, f"nothing on stderr (rc {done.returncode}, stdout {done.stdout!r})"
    return lines[-1]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return servers.write_tree(tmp_path / "model", {"config.json": b"{}", "weights.bin": os.urandom(4096)})


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--nodes", "0"], "argument --nodes: '0' must be at least 1"),
        (["--nodes", "-1"], "argument --nodes: '-1' must be at least 1"),
        (["--chunk-size", "1x"], "argument --chunk-size: size '1x'"),
        (["--chunk-size", "4Gi"], "argument --chunk-size: chunk_size: 4294967296 is outside the allowed range"),
        (["--origin-rate-limit", "fast"], "argument --origin-rate-limit: size 'fast'"),
        (["--memory-bytes", "0"], "argument --memory-bytes: '0' must be more than 0 bytes"),
        (["--timeout", "soon"], "argument --timeout: 'soon' is not a number of seconds"),
        (["--progress", "loud"], "argument --progress: invalid choice: 'loud'"),
    ],
)
def test_bad_flag_values_exit_2_naming_the_flag(model: Path, argv: list[str], named: str) -> None:
    done = ringseed(*DISTRIBUTE, str(model), *argv)
    assert done.returncode == 2
    assert named in error_line(done)


def test_allreduce_bad_size_exits_2() -> None:
    done = ringseed("local", "allreduce", "--size", "1x")
    assert done.returncode == 2
    assert "argument --size: size '1x'" in error_line(done)


def test_a_path_that_does_not_exist_exits_2_naming_it(tmp_path: Path) -> None:
    done = ringseed(*DISTRIBUTE, str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert f"{tmp_path / 'nowhere'}: no such file or directory" in error_line(done)


def test_a_symlink_loop_as_the_source_exits_2_naming_it(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    done = ringseed(*DISTRIBUTE, str(tmp_path / "loop"))
    assert done.returncode == 2
    assert f"{tmp_path / 'loop'}: cannot be resolved" in error_line(done)


def test_a_symlink_loop_inside_the_source_exits_1_naming_it(model: Path) -> None:
    (model / "loop").symlink_to(model / "loop")
    done = ringseed(*DISTRIBUTE, str(model))
    assert done.returncode == 1
    assert "'loop' is a symlink loop" in error_line(done)


def test_an_empty_source_exits_1(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = ringseed(*DISTRIBUTE, str(tmp_path / "empty"))
    assert done.returncode == 1
    assert "source is empty: it has no files" in error_line(done)


def test_a_symlink_leaving_the_source_exits_1_naming_it(model: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("not part of the model")
    (model / "leak").symlink_to(tmp_path / "secret")
    done = ringseed(*DISTRIBUTE, str(model))
    assert done.returncode == 1
    assert "'leak' is a symlink leaving the source root" in error_line(done)


def test_a_closed_port_exits_1_naming_the_address() -> None:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        done = ringseed(*DISTRIBUTE, f"http://127.0.0.1:{port}/model/")
    assert done.returncode == 1
    line = error_line(done)
    assert f"http://127.0.0.1:{port}/model/index.json" in line and "Cannot connect" in line


@pytest.fixture
def s3_refusing_unsigned() -> Iterator[str]:
    """An S3 endpoint that answers 403 AccessDenied to unsigned requests, as AWS does for a private bucket."""

    async def deny(request: web.Request) -> web.Response:
        body = "<?xml version='1.0'?>\n<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        return web.Response(status=403, text=body, content_type="application/xml")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", deny)
    with servers.app_in_thread(app) as url:
        yield url


AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_CONFIG_FILE")


def test_no_credentials_exits_1_saying_so(s3_refusing_unsigned: str, tmp_path: Path) -> None:
    env = {"AWS_ENDPOINT_URL": s3_refusing_unsigned, "AWS_EC2_METADATA_DISABLED": "true", "HOME": str(tmp_path)}
    done = ringseed(*DISTRIBUTE, "s3://private/model/", env=env, unset=AWS_KEYS)
    assert done.returncode == 1
    line = error_line(done)
    assert "HTTP 403 Forbidden" in line and "AccessDenied" in line and "no AWS credentials were found" in line


def test_a_missing_aws_profile_exits_1_naming_it(s3_refusing_unsigned: str, tmp_path: Path) -> None:
    env = {"AWS_ENDPOINT_URL": s3_refusing_unsigned, "AWS_EC2_METADATA_DISABLED": "true", "HOME": str(tmp_path)}
    done = ringseed(*DISTRIBUTE, "s3://private/model/", env={**env, "AWS_PROFILE": "nope"}, unset=AWS_KEYS[:3])
    assert done.returncode == 1
    assert "cannot load AWS credentials: The config profile (nope) could not be found" in error_line(done)


def test_no_command_exits_2_with_the_command_list() -> None:
    done = ringseed()
    assert done.returncode == 2
    assert "ringseed: give a command" in done.stderr and "local distribute" in done.stderr


def test_local_help_lists_the_local_commands() -> None:
    done = ringseed("local", "--help")
    assert done.returncode == 0
    assert "local distribute" in done.stdout and "local allreduce" in done.stdout


def test_local_without_a_command_and_an_unknown_one_exit_2() -> None:
    assert ringseed("local").returncode == 2
    done = ringseed("local", "distrib")
    assert done.returncode == 2
    assert "ringseed local: unknown command 'local distrib'" in done.stderr


def test_a_source_or_demo_is_needed() -> None:
    done = ringseed(*DISTRIBUTE)
    assert done.returncode == 2
    assert "give a SOURCE or --demo" in error_line(done)


COMMAND_PARSERS = [(words, None) for words in sorted(cli.COMMANDS)] + [(w, role) for (w, role) in sorted(cli.ROLES)]


@pytest.mark.parametrize(
    ("words", "role"), COMMAND_PARSERS, ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v)
)
def test_every_option_has_help_and_shows_its_default(words: tuple[str, ...], role: str | None) -> None:
    _, parser = cli.command_parser(words, role=role)
    text = parser.format_help()
    assert "(default: None)" not in text and "(default: False)" not in text
    for action in parser._actions:
        name = action.option_strings[-1] if action.option_strings else action.dest
        assert action.help, f"ringseed {' '.join(words)} {name} has no help"
        shown = cmdline.HelpFormatter(prog="x")._get_help_string(action) or ""
        if action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in shown, f"ringseed {' '.join(words)} {name}: {shown!r} shows no default"


def test_help_runs_as_a_command() -> None:
    done = ringseed("local", "distribute", "--help")
    assert done.returncode == 0 and "--nodes NODES" in done.stdout and "(default: 4)" in done.stdout
